#include "launcher/dlrund_cli.h"

#include <CLI/CLI.hpp>

#include "common/cli.h"
#include "common/error.h"
#include "common/version.h"

namespace dlrun::launcher {

namespace {
const CLI::Range kAtLeastOne(uint64_t{1}, uint64_t{1} << 62, "a positive byte or key count");
}  // namespace

DlrundParse parseDlrundArgs(const std::vector<std::string>& args) {
  DlrundParse result;
  auto& server = result.config.server;
  auto& limits = server.limits;
  server.listen.port = 29500;

  CLI::App app(
      "dlrund: the dlrun rendezvous store daemon. Speaks PyTorch's TCPStore protocol (1.x and "
      "2.x clients), so torch workers and dlrun agents can both use it, and dlrun's gRPC control "
      "plane on the same port.\n"
      "Prints 'dlrund listening on HOST:PORT' as its first line; SIGINT or SIGTERM stop it.",
      "dlrund");
  app.option_defaults()->always_capture_default();
  app.add_option("--host", server.listen.host, "Address to listen on (\"::\" for IPv6 and IPv4)");
  app.add_option("--port", server.listen.port, "TCP port; 0 picks a free one")
      ->check(CLI::Range(0, 65535));
  app.add_option("--max-key-bytes", limits.maxKeyBytes,
                 "Longest key accepted; a client sending a longer one is disconnected")
      ->check(kAtLeastOne);
  app.add_option("--max-value-bytes", limits.maxValueBytes,
                 "Longest value accepted; a client sending a longer one is disconnected")
      ->check(kAtLeastOne);
  app.add_option("--max-keys-per-op", limits.maxKeysPerOp,
                 "Most keys in one CHECK, WAIT, MULTI_GET or MULTI_SET")
      ->check(kAtLeastOne);
  app.add_option("--max-buffered-bytes", limits.maxBufferedBytes,
                 "Most bytes held per connection (unparsed input plus unsent replies)")
      ->check(kAtLeastOne);
  std::string allow;
  app.add_option("--allow", allow,
                 "Accept connections (store and control plane) only from these addresses and "
                 "CIDR networks, comma-separated: 10.0.0.0/8,127.0.0.1,::1,fd00::/8; others are "
                 "closed unread, counted (rejected=N, dlrun_store_rejected_connections_total) "
                 "and logged once per address (default: from anyone)");
  app.add_flag("!--no-control", result.config.control,
               "Do not serve the gRPC control plane (dlrun status/events/stop) on the port");
  app.add_flag("--stats", result.config.stats,
               "Print the store's counts (connections, requests by op) as one line on stdout, "
               "'dlrund stats: time=UNIX_SECONDS connections=N foreign=N requests=N SET=N "
               "...' (each op served, in protocol order; rejected=N after foreign=N once "
               "--allow turned a peer away), on SIGUSR1 and at exit");
  app.add_option("--metrics-port", result.config.metricsPort,
                 "Serve Prometheus metrics (/metrics) and a live page of the store (/) over HTTP "
                 "on this port, 0 for a free one; printed on stdout (default -1: off)")
      ->check(CLI::Range(-1, 65535));
  app.add_option("--metrics-host", result.config.metricsHost,
                 "Numeric address --metrics-port listens on (default: --host's)");
  std::string upstream;
  app.add_option("--upstream", upstream,
                 "Serve as a store proxy in front of the store at HOST:PORT (a numeric address): "
                 "clients' requests go there over a few connections, WAITs on the same keys and "
                 "ADDs to one key in flight together as one (as dlrun --store-proxy); no control "
                 "plane, metrics or --allow then");
  app.add_flag("-v,--verbose", result.config.verbose, "Log every connection event");
  app.set_version_flag("--version", kVersion);

  result.exitCode = parseCommandLine(app, args, kVersion);
  if (result.exitCode) return result;
  server.admission = AdmissionRule::parse(allow, "--allow");
  if (!upstream.empty()) {
    if (!allow.empty() || result.config.metricsPort >= 0)
      throw ConfigError("--upstream: a store proxy takes no --allow or --metrics-port");
    try {
      result.config.upstream = parseHostPort(upstream, 0);
    } catch (const ConfigError& e) {
      throw ConfigError("--upstream: '" + upstream + "': " + e.what());
    }
    if (result.config.upstream->port == 0)
      throw ConfigError("--upstream: '" + upstream + "' names no port (HOST:PORT)");
  }
  return result;
}

}  // namespace dlrun::launcher
