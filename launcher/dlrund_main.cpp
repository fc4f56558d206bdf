// dlrund: the standalone store daemon. Runs in the foreground until SIGINT or SIGTERM.
#include <iostream>

#include "common/asio.h"
#include "common/log.h"
#include "common/cli.h"
#include "control/control_server.h"
#include "launcher/dlrund_cli.h"
#include "rendezvous/store/tcp_stream.h"

int main(int argc, char** argv) {
  using namespace dlrun;
  log::setProgramName("dlrund");
  return guardedMain([&] {
    auto parsed = launcher::parseDlrundArgs(std::vector<std::string>(argv + 1, argv + argc));
    if (parsed.exitCode) return *parsed.exitCode;
    if (parsed.config.verbose) log::setVerbose(true);

    // Declared before the store server, which hands it connections until it is gone.
    std::optional<control::ControlServer> control;
    if (parsed.config.control) {
      control.emplace();
      parsed.config.server.foreign = [&control](int fd) { control->adopt(fd); };
    }
    boost::asio::io_context io(1);
    rendezvous::StoreServer server(io, parsed.config.server);
    if (control) control->readStoreAt(server.address(), server.port());
    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code& ec, int) {
      if (!ec) server.stop();
    });
    std::cout << "dlrund listening on " << rendezvous::joinHostPort(server.address(), server.port())
              << std::endl;
    // A line of its own: scripts read the port at the end of the first line.
    if (control)
      std::cout << "dlrund serves the control plane (gRPC dlrun.v1.Control, grpc.health.v1) on "
                   "the same port"
                << std::endl;
    io.run();
    return 0;
  });
}
