// dlrund: the standalone store daemon. Runs in the foreground until SIGINT or SIGTERM.
#include <iostream>

#include "common/asio.h"
#include "common/log.h"
#include "common/cli.h"
#include "launcher/dlrund_cli.h"
#include "rendezvous/store/tcp_stream.h"

int main(int argc, char** argv) {
  using namespace dlrun;
  log::setProgramName("dlrund");
  return guardedMain([&] {
    auto parsed = launcher::parseDlrundArgs(std::vector<std::string>(argv + 1, argv + argc));
    if (parsed.exitCode) return *parsed.exitCode;
    if (parsed.config.verbose) log::setVerbose(true);

    boost::asio::io_context io(1);
    rendezvous::StoreServer server(io, parsed.config.server);
    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code& ec, int) {
      if (!ec) server.stop();
    });
    std::cout << "dlrund listening on " << rendezvous::joinHostPort(server.address(), server.port())
              << std::endl;
    io.run();
    return 0;
  });
}
