// dlrun's flags as CLI11 options (ARCHITECTURE.md section 2, the first stage of the command
// line): each torchrun flag in both spellings with its PET_ variable, and the values not bound
// to the LaunchConfig itself, carried to the stages that read them (launch_cli.cpp). Internal
// to the launcher's command line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launcher/launch_cli.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace dlrun::launcher {

// The flags' values as given (those not bound to the LaunchConfig itself), carried from the
// stage that declares them to the stages that read them.
struct DeclaredFlags {
  std::string nnodes = "1", nproc = "1", rdzvConf, redirects = "0", tee = "0", ranksFilter;
  std::string logDir, checkpointDir, localAddr, tfConfig = "auto", consoleFormat = "dlrun",
                                                numaBinding;
  std::string storeProxy = "auto", storeAllow, recovery = "restart", workerStore = "auto";
  int masterPort = -1;
  double monitorInterval = 0.1, checkpointWriteEvery = 60, stopTimeout = 30, shutdownTimeout = 30,
         hangTimeout = 0;
  std::string healthCheck;  // --health-check
  int healthGpus = 0;       // --health-gpus
  double healthCheckTimeout = 60, healthMinFree = 0, quarantineWindow = 600, quarantineFor = 600;
  std::string quarantineFile;  // --quarantine-file
  std::string consoleDedup = "auto";
  double consoleDedupWindow = 0.1;
  double networkProbeTimeout = 2;
  bool noNetworkProbe = false;
  bool module = false, noPython = false, runPath = false;
  bool warmStart = false;  // --warm-start
  std::string preload;     // --preload
  int nodeRank = -1;
  std::string backend;
  bool noSlurm = false;
  // torchrun's, accepted: CLI11 checks their choices as it parses (oneOf); nothing reads them
  std::string startMethod = "spawn", eventLogHandler = "null", logsSpecs = "default";
  std::string stdoutFilters, stderrFilters;
  std::string signalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  std::string roles, tokenFile;
  bool noControlPlane = false;
  int metricsPort = -1;
  std::string metricsHost, hangAction = "restart";
  std::string hostfile, hostList, sshCommand = "ssh", localRankStyle = "dash";
  int sshPort = 0;
  HostLaunch hostLaunch;
  bool localRankArg = false, useEnv = false;
  // The flags whose presence counts (option->count() > 0: given as a flag or PET_ variable).
  CLI::Option *nnodesOption = nullptr, *nprocOption = nullptr, *backendOption = nullptr,
              *endpointOption = nullptr, *rdzvIdOption = nullptr, *stopTimeoutOption = nullptr,
              *shutdownTimeoutOption = nullptr, *signalsOption = nullptr, *roleOption = nullptr,
              *rolesOption = nullptr, *hangTimeoutOption = nullptr, *hangActionOption = nullptr,
              *masterAddrOption = nullptr, *masterPortOption = nullptr, *prefixOption = nullptr,
              *stdoutFiltersOption = nullptr, *stderrFiltersOption = nullptr,
              *preloadOption = nullptr;
  // Once parsed: the flags before the entry point, and the entry point with its arguments.
  std::vector<std::string> flags, rest;
  // Once read: --rdzv-backend, and what else the backend is decided from.
  std::optional<RdzvBackendFlag> backendFlag;
  bool slurmBackend = false;  // --rdzv-backend=slurm
  bool staticFlags = false;   // --master-addr or --master-port
  bool fanout = false;        // --hostfile or --hosts
};

// --store-proxy=auto turns the proxy on from this many workers on a node.
inline constexpr int kStoreProxyAutoWorkers = 64;

// Declares every flag on `app`, bound to `f` and `c`.
void declareFlags(CLI::App& app, DeclaredFlags& f, LaunchConfig& c);

// torchrun's argparse takes a unique prefix of a long flag ("--standa" for --standalone): the
// flags before the entry point with each such prefix written out in full. An ambiguous prefix
// throws ConfigError naming the flags it could be.
std::vector<std::string> expandAbbreviations(const CLI::App& app,
                                             const std::vector<std::string>& args);

}  // namespace dlrun::launcher
