// The dlrund command line: flags into StoreServerOptions. Pure parsing, no I/O beyond the
// help text, so tests reach it directly.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/host_port.h"
#include "store/store_server.h"

namespace dlrun::launcher {

struct DlrundConfig {
  StoreServerOptions server;
  bool control = true;      // serve the control plane (gRPC) on the store's port
  bool stats = false;       // print the store's counters (StoreStats) on SIGUSR1 and at exit
  int metricsPort = -1;     // --metrics-port: -1 off, 0 a free one
  std::string metricsHost;  // empty: --host
  bool verbose = false;
  // --upstream HOST:PORT: serve as a store proxy in front of that store (store_proxy.h)
  std::optional<HostPort> upstream;
};

// Throws ConfigError with a one-line message for bad flags. `exitCode` is set when the run
// should end at once (--help, --version, already printed).
struct DlrundParse {
  DlrundConfig config;
  std::optional<int> exitCode;
};

DlrundParse parseDlrundArgs(const std::vector<std::string>& args);

}  // namespace dlrun::launcher
