// dlrund: the standalone store daemon. Runs in the foreground until SIGINT or SIGTERM.
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>

#include "common/asio.h"
#include "common/cli.h"
#include "common/clock.h"
#include "common/host_port.h"
#include "common/log.h"
#include "control/control_server.h"
#include "control/job_watch.h"
#include "launcher/dlrund_cli.h"
#include "metrics/routes.h"
#include "metrics/store_metrics.h"
#include "store/address.h"
#include "store/store_proxy.h"

namespace {

// --upstream: a store proxy in front of another store, until SIGINT or SIGTERM.
int serveProxy(const dlrun::launcher::DlrundConfig& config) {
  using namespace dlrun;
  boost::asio::io_context io(1);
  HostPort upstream = *config.upstream;
  upstream.address = resolveNumeric(upstream.host, "--upstream");
  StoreProxy proxy(io, {.upstream = std::move(upstream),
                        .listen = config.server.listen,
                        .limits = config.server.limits});
  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int) {
    if (!ec) proxy.stop();
  });
  std::cout << "dlrund listening on " << joinHostPort(config.server.listen.host, proxy.port())
            << std::endl;
  std::cout << "dlrund is a store proxy for " << config.upstream->text() << std::endl;
  io.run();
  const StoreProxyStats stats = proxy.stats();
  if (config.stats)
    std::cout << "dlrund proxy stats: clients=" << stats.clients << " requests=" << stats.requests
              << " upstream_requests=" << stats.upstreamRequests
              << " upstream_connections=" << stats.upstreamConnections
              << " coalesced_waits=" << stats.coalescedWaits
              << " coalesced_adds=" << stats.coalescedAdds << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dlrun;
  log::setProgramName("dlrund");
  return guardedMain([&] {
    auto parsed = launcher::parseDlrundArgs(std::vector<std::string>(argv + 1, argv + argc));
    if (parsed.exitCode) return *parsed.exitCode;
    if (parsed.config.verbose) log::setVerbose(true);
    if (parsed.config.upstream) return serveProxy(parsed.config);

    // Declared before the store server, which hands it connections until it is gone.
    std::optional<control::ControlServer> control;
    if (parsed.config.control) {
      control.emplace();
      parsed.config.server.foreign = [&control](int fd) { control->adopt(fd); };
    }
    boost::asio::io_context io(1);
    StoreServer server(io, parsed.config.server);
    if (control) control->readFrom(control::storeAt(server.address(), server.port()));
    // --metrics-port: on the store's own io_context, so the counts are read on their thread.
    std::optional<metrics::HttpServer> http;
    std::optional<control::JobWatch> jobPage;  // /job?id=ID: any job here without a token
    if (parsed.config.metricsPort >= 0) {
      jobPage.emplace(control::JobWatchOptions{
          .connect = control::storeAt(server.address(), server.port()),
          .showTokenJobs = false,
          .storeJson = [&server] { return metrics::storeJson(server.stats()); }});
      http.emplace(
          io,
          metrics::HttpServerOptions{.host = parsed.config.metricsHost.empty()
                                                 ? parsed.config.server.listen.host
                                                 : parsed.config.metricsHost,
                                     .port = static_cast<uint16_t>(parsed.config.metricsPort)},
          metrics::routes(
              [&server] {
                metrics::Exposition out;
                metrics::addStoreMetrics(out, server.stats());
                return out.text();
              },
              [&server] {
                return R"({"kind":"store","store":)" + metrics::storeJson(server.stats()) + "}";
              },
              [&jobPage](std::string_view query) { return jobPage->api(query); }));
    }
    // --stats: the counts so far on SIGUSR1, read on the server's own thread.
    const auto printStats = [&] {
      const double now = unixSeconds();
      char time[32];
      std::snprintf(time, sizeof(time), "%.6f", now);
      std::cout << "dlrund stats: time=" << time << ' ' << server.stats().describe() << std::endl;
    };
    boost::asio::signal_set statsSignal(io);
    bool stopping = false;
    std::function<void()> awaitStatsSignal = [&] {
      statsSignal.async_wait([&](const boost::system::error_code& ec, int) {
        if (ec) return;
        printStats();
        // A SIGUSR1 whose handler was already due when SIGTERM cancelled the wait must not
        // start another: that wait would keep io.run() going.
        if (!stopping) awaitStatsSignal();
      });
    };
    if (parsed.config.stats) {
      statsSignal.add(SIGUSR1);
      awaitStatsSignal();
    }
    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code& ec, int) {
      if (ec) return;
      stopping = true;
      server.stop();
      if (http) http->stop();
      statsSignal.cancel();  // its wait would keep io.run() going
    });
    std::cout << "dlrund listening on " << joinHostPort(server.address(), server.port())
              << std::endl;
    // A line of its own: scripts read the port at the end of the first line.
    if (control)
      std::cout << "dlrund serves the control plane (gRPC dlrun.v1.Control, grpc.health.v1) on "
                   "the same port"
                << std::endl;
    if (http)
      std::cout << "dlrund serves metrics on http://" << joinHostPort(http->address(), http->port())
                << "/metrics, its page on / and each job's on /job?id=ID" << std::endl;
    io.run();
    if (parsed.config.stats) printStats();
    return 0;
  });
}
