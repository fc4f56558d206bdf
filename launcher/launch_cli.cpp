#include "launcher/launch_cli.h"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/cli.h"
#include "common/signal_name.h"
#include "common/text.h"
#include "launcher/entry_point.h"
#include "common/version.h"
#include "mpi/discovery.h"
#include "remote/agent_command.h"
#include "remote/hostfile.h"
#include "rendezvous/etcd/endpoints.h"
#include "rendezvous/store/tcp_stream.h"

namespace dlrun::launcher {
namespace {

// Ranges with bounds that read well in CLI11's "not in range" message.
const CLI::Range kCount(0, 1'000'000);
const CLI::Range kSeconds(0.0, 86'400.0);

std::optional<agents::Streams> toStreams(std::string_view text) {
  auto value = parseInteger<int>(text);
  if (!value || *value < 0 || *value > 3) return std::nullopt;
  return static_cast<agents::Streams>(*value);
}

// torchrun's spellings of a flag: "-x,--dashed-name,--dashed_name", and its PET_ variable.
struct Spellings {
  std::string names;
  std::string env;
};

Spellings spellings(const std::string& dashed, const std::string& shortName) {
  std::string underscored = dashed;
  std::replace(underscored.begin(), underscored.end(), '-', '_');
  Spellings s;
  s.names = shortName.empty() ? "" : shortName + ",";
  s.names += "--" + dashed;
  if (underscored != dashed) s.names += ",--" + underscored;
  s.env = "PET_" + underscored;
  std::transform(s.env.begin(), s.env.end(), s.env.begin(), ::toupper);
  return s;
}

template <typename T>
CLI::Option* addOption(CLI::App& app, const std::string& dashed, T& target,
                       const std::string& help, const std::string& shortName = "") {
  auto s = spellings(dashed, shortName);
  return app.add_option(s.names, target, help)->envname(s.env);
}

CLI::Option* addFlag(CLI::App& app, const std::string& dashed, bool& target,
                     const std::string& help, const std::string& shortName = "") {
  auto s = spellings(dashed, shortName);
  return app.add_flag(s.names, target, help)->envname(s.env);
}

// The node count as --nnodes writes it, whether the flag or Slurm set it.
std::string nodesText(const LaunchConfig& c) {
  const std::string low = std::to_string(c.minNodes);
  return c.minNodes == c.maxNodes ? low : low + ":" + std::to_string(c.maxNodes);
}

// Slurm's settings where the user gave no flag (slurm/discovery.h says which is which).
void applySlurm(const slurm::Settings& s, LaunchConfig& c) {
  if (s.rdzvId) c.rdzvId = *s.rdzvId;
  if (s.nnodes) c.minNodes = c.maxNodes = *s.nnodes;
  if (s.nodeRank) c.nodeRank = s.nodeRank;
  if (s.nprocPerNode) c.nprocPerNode = *s.nprocPerNode;
  if (s.endpointHost) c.rdzvEndpoint = rendezvous::joinHostPort(*s.endpointHost, *s.endpointPort);
  if (!c.rdzv.isHost) c.rdzv.isHost = s.servesStore;
  if (s.nodeName) c.nodeName = s.nodeName;
  c.refuseLostNodes = true;
}

// Open MPI's (or PMIx's) settings where the user gave no flag (mpi/discovery.h).
void applyMpi(const mpi::Settings& s, LaunchConfig& c) {
  if (s.rdzvId) c.rdzvId = *s.rdzvId;
  if (s.nnodes) c.minNodes = c.maxNodes = *s.nnodes;
  if (s.nodeRank) c.nodeRank = s.nodeRank;
  if (s.endpointHost) c.rdzvEndpoint = rendezvous::joinHostPort(*s.endpointHost, *s.endpointPort);
}

// A flag of the launcher alone (--hostfile, --ssh-port, ...): both spellings, but no PET_
// variable, which would reach the agents with the environment and make each a launcher.
template <typename T>
CLI::Option* addLauncherOption(CLI::App& app, const std::string& dashed, T& target,
                               const std::string& help) {
  return app.add_option(spellings(dashed, "").names, target, help);
}

// The hosts of --hostfile FILE or --hosts LIST.
std::vector<remote::Host> hostsOf(const std::string& hostfile, const std::string& hostList) {
  if (!hostfile.empty() && !hostList.empty())
    throw ConfigError("--hostfile and --hosts: give one of them");
  if (!hostList.empty()) return remote::parseHostList(hostList);
  std::ifstream in(hostfile);
  if (!in) throw ConfigError("--hostfile: cannot read " + hostfile);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return remote::parseHostfile(text, hostfile);
}

}  // namespace

RdzvBackendFlag parseRdzvBackend(const std::string& value) {
  if (value == "c10d") return {.backend = RdzvBackend::C10d};
  if (value == "static") return {.backend = RdzvBackend::Static};
  if (value == "slurm") return {.backend = RdzvBackend::C10d, .slurm = true};
  if (value == "etcd" || value == "etcd-v3") return {.backend = RdzvBackend::Etcd};
  // torchrun's v2 backend: named apart from a typo, with what to use instead.
  if (value == "etcd-v2")
    throw ConfigError("--rdzv-backend=etcd-v2: dlrun speaks etcd's v3 API; use "
                      "--rdzv-backend=etcd");
  throw ConfigError("--rdzv-backend: '" + value + "' is not c10d, static, etcd or slurm");
}

std::pair<int, int> parseNnodes(const std::string& value) {
  auto parts = split(value, ':');
  if (parts.size() > 2) throw ConfigError("--nnodes: '" + value + "' is not N or MIN:MAX");
  auto low = parseInteger<int>(parts[0]);
  auto high = parts.size() == 2 ? parseInteger<int>(parts[1]) : low;
  if (!low || !high || *low < 1)
    throw ConfigError("--nnodes: '" + value + "' is not N or MIN:MAX with positive integers");
  if (*low > *high)
    throw ConfigError("--nnodes: minimum " + std::to_string(*low) + " exceeds maximum " +
                      std::to_string(*high));
  return {*low, *high};
}

int parseNprocPerNode(const std::string& value, const HostProbe& host) {
  if (value == "cpu") return host.cpuCount();
  if (value == "gpu") {
    const int gpus = host.gpuCount();
    if (gpus == 0) throw ConfigError("--nproc-per-node=gpu: no GPU found on this machine");
    return gpus;
  }
  if (value == "auto") {
    const int gpus = host.gpuCount();
    return gpus > 0 ? gpus : host.cpuCount();
  }
  auto n = parseInteger<int>(value);
  if (!n || *n < 1)
    throw ConfigError("--nproc-per-node: '" + value +
                      "' is not a positive integer, cpu, gpu or auto");
  return *n;
}

agents::StreamsByRank parseStreams(const std::string& flag, const std::string& value) {
  agents::StreamsByRank result;
  if (auto all = toStreams(value)) {
    result.all = *all;
    return result;
  }
  for (const auto& item : split(value, ',')) {
    auto pair = split(item, ':');
    auto rank = pair.size() == 2 ? parseInteger<int>(pair[0]) : std::nullopt;
    auto streams = pair.size() == 2 ? toStreams(pair[1]) : std::nullopt;
    if (!rank || *rank < 0 || !streams)
      throw ConfigError(flag + ": '" + value +
                        "' is not 0-3 or LOCAL_RANK:0-3 pairs such as 0:1,1:3");
    result.byRank[*rank] = *streams;
  }
  return result;
}

std::map<std::string, std::string> parseRdzvConf(const std::string& value) {
  std::map<std::string, std::string> conf;
  if (value.empty()) return conf;
  for (const auto& item : split(value, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError("--rdzv-conf: '" + item + "' is not key=value");
    conf[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return conf;
}

// job_ttl's upper bound: long enough for a re-run's id to wait out, short enough that a
// forgotten job's keys go.
constexpr int64_t kMaxJobTtlSeconds = 30 * 86'400;

RdzvSettings parseRdzvSettings(const std::map<std::string, std::string>& conf) {
  RdzvSettings settings;
  auto seconds = [](const std::string& key, const std::string& text) {
    try {
      size_t used = 0;
      const double value = std::stod(text, &used);
      if (used == text.size() && value > 0 && value <= 86'400)
        return std::chrono::milliseconds(static_cast<int64_t>(value * 1000));
    } catch (const std::exception&) {
    }
    throw ConfigError("--rdzv-conf: " + key + "=" + text +
                      " is not a number of seconds above 0 and at most 86400");
  };
  // torch's spellings of a boolean setting (RendezvousParameters.get_as_bool).
  auto boolean = [](const std::string& key, const std::string& text) {
    std::string lower = text;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
    for (const char* yes : {"1", "true", "t", "yes", "y"})
      if (lower == yes) return true;
    for (const char* no : {"0", "false", "f", "no", "n"})
      if (lower == no) return false;
    throw ConfigError("--rdzv-conf: " + key + "=" + text + " is not true or false");
  };
  for (const auto& [key, value] : conf) {
    if (key == "join_timeout") {
      settings.joinTimeout = seconds(key, value);
    } else if (key == "last_call_timeout") {
      settings.lastCall = seconds(key, value);
    } else if (key == "keep_alive_interval") {
      settings.heartbeat = seconds(key, value);
    } else if (key == "keep_alive_max_attempt") {
      auto attempts = parseInteger<int>(value);
      if (!attempts || *attempts < 1 || *attempts > 1000)
        throw ConfigError("--rdzv-conf: keep_alive_max_attempt=" + value +
                          " is not a count from 1 to 1000");
      settings.keepAliveMaxAttempt = *attempts;
    } else if (key == "is_host") {
      settings.isHost = boolean(key, value);
    } else if (key == "use_libuv") {
      boolean(key, value);  // torch's choice of its store's event loop: dlrun's store is its own
    } else if (key == "stop_policy") {
      if (value != "job" && value != "node")
        throw ConfigError("--rdzv-conf: stop_policy=" + value + " is not job or node");
      settings.stopOnlyNode = value == "node";
    } else if (key == "etcd_prefix") {
      if (value.empty() || value.find_first_of(" \t\n") != std::string::npos)
        throw ConfigError("--rdzv-conf: etcd_prefix='" + value + "' is not a key prefix");
      settings.etcdPrefix = value.ends_with('/') ? value : value + "/";
    } else if (key == "job_ttl") {
      auto ttl = parseInteger<int>(value);
      if (!ttl || *ttl < 1 || *ttl > kMaxJobTtlSeconds)
        throw ConfigError("--rdzv-conf: job_ttl=" + value +
                          " is not a whole number of seconds from 1 to 2592000 (30 days)");
      settings.jobTtl = std::chrono::seconds(*ttl);
    } else if (key == "cacert") {
      settings.etcdCaCert = value;
    } else if (key == "cert") {
      settings.etcdCert = value;
    } else if (key == "key") {
      settings.etcdKey = value;
    } else if (key == "user") {
      settings.etcdUser = value;
    } else if (key == "password") {
      settings.etcdPassword = value;
    } else if (key == "password_file") {
      settings.etcdPasswordFile = value;
    } else if (key != "timeout" && key != "close_timeout" && key != "read_timeout") {
      // torchrun's other keys are accepted for compatibility; they have no meaning here.
      throw ConfigError("--rdzv-conf: unknown key '" + key +
                        "' (known: join_timeout, last_call_timeout, keep_alive_interval, "
                        "keep_alive_max_attempt, is_host, stop_policy, etcd_prefix, job_ttl, "
                        "cacert, cert, key, user, password, password_file)");
    }
  }
  return settings;
}

namespace {

// A file's whole content; a key's file that cannot be read, or is empty, is a ConfigError.
std::string readSettingFile(const std::string& key, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream content;
  if (file) content << file.rdbuf();
  if (!file || file.bad())
    throw ConfigError("--rdzv-conf: " + key + "=" + path + ": cannot read the file");
  if (content.str().empty())
    throw ConfigError("--rdzv-conf: " + key + "=" + path + ": the file is empty");
  return content.str();
}

}  // namespace

rendezvous::etcd::EtcdSecurity etcdSecurity(
    const RdzvSettings& settings, const std::vector<rendezvous::etcd::Endpoint>& endpoints) {
  rendezvous::etcd::EtcdSecurity security;
  if (settings.etcdCert.empty() != settings.etcdKey.empty())
    throw ConfigError("--rdzv-conf: cert and key go together (the client certificate and its "
                      "private key)");
  if (!settings.etcdPassword.empty() && !settings.etcdPasswordFile.empty())
    throw ConfigError("--rdzv-conf: give password or password_file, not both");
  const bool password = !settings.etcdPassword.empty() || !settings.etcdPasswordFile.empty();
  if (settings.etcdUser.empty() != !password)
    throw ConfigError("--rdzv-conf: user and password (or password_file) go together");
  // TLS follows the configuration: a CA (or an https:// endpoint) turns it on for every
  // endpoint; a client certificate alone is meaningless without TLS, so it turns it on too.
  security.tls = !settings.etcdCaCert.empty() || !settings.etcdCert.empty() ||
                 std::any_of(endpoints.begin(), endpoints.end(),
                             [](const auto& endpoint) { return endpoint.https; });
  if (!settings.etcdCaCert.empty())
    security.rootCerts = readSettingFile("cacert", settings.etcdCaCert);
  if (!settings.etcdCert.empty()) {
    security.certChain = readSettingFile("cert", settings.etcdCert);
    security.privateKey = readSettingFile("key", settings.etcdKey);
  }
  security.user = settings.etcdUser;
  security.password = settings.etcdPassword;
  if (!settings.etcdPasswordFile.empty()) {
    security.password = readSettingFile("password_file", settings.etcdPasswordFile);
    // A file written by echo ends in a newline that is no part of the password.
    while (!security.password.empty() &&
           (security.password.back() == '\n' || security.password.back() == '\r'))
      security.password.pop_back();
    if (security.password.empty())
      throw ConfigError("--rdzv-conf: password_file=" + settings.etcdPasswordFile +
                        ": the file is empty");
  }
  return security;
}

std::set<int> parseRanksFilter(const std::string& value) {
  std::set<int> ranks;
  for (const auto& item : split(value, ',')) {
    auto rank = parseInteger<int>(item);
    if (!rank || *rank < 0)
      throw ConfigError("--local-ranks-filter: '" + value + "' is not a list such as 0,2");
    ranks.insert(*rank);
  }
  return ranks;
}

std::string readTokenFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(flag + ": cannot read " + path);
  std::string token((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r')) token.pop_back();
  if (token.empty()) throw ConfigError(flag + ": " + path + " is empty");
  return token;
}

agents::HangAction parseHangAction(const std::string& value) {
  if (value == "report") return agents::HangAction::Report;
  if (value == "restart") return agents::HangAction::Restart;
  if (value == "exit") return agents::HangAction::Exit;
  throw ConfigError("--hang-action: '" + value + "' is not report, restart or exit");
}

agents::TfConfigMode parseTfConfig(const std::string& value) {
  if (value == "auto") return agents::TfConfigMode::Auto;
  if (value == "always") return agents::TfConfigMode::Always;
  if (value == "never") return agents::TfConfigMode::Never;
  throw ConfigError("--tf-config: '" + value + "' is not auto, always or never");
}

std::vector<int> parseSignalsToHandle(const std::string& value) {
  const std::string flag = "--signals-to-handle";
  if (value.empty()) throw ConfigError(flag + " names no signal");
  std::vector<int> signals;
  for (const std::string& item : split(value, ',')) {
    const std::optional<int> sig = parseSignal(item);
    if (!sig) throw ConfigError(flag + ": '" + item + "' is not a signal");
    if (*sig == SIGKILL || *sig == SIGSTOP)
      throw ConfigError(flag + ": " + signalName(*sig) + " cannot be handled by any process");
    if (*sig == SIGCHLD)
      throw ConfigError(flag + ": SIGCHLD is dlrun's own (it says a worker ended)");
    for (int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT})
      if (*sig == fault)
        throw ConfigError(flag + ": " + signalName(*sig) +
                          " reports a fault in the process it reaches, not a request to stop");
    if (std::find(signals.begin(), signals.end(), *sig) == signals.end()) signals.push_back(*sig);
  }
  return signals;
}

std::pair<std::string, std::optional<uint16_t>> parseEndpoint(const std::string& flag,
                                                              const std::string& value) {
  std::string host = value, port;
  bool hasPort = false;
  if (value.starts_with("[")) {  // [v6-address]:port
    const size_t close = value.find(']');
    if (close == std::string::npos) throw ConfigError(flag + ": '" + value + "' lacks a ']'");
    host = value.substr(1, close - 1);
    if (close + 1 < value.size()) {
      if (value[close + 1] != ':') throw ConfigError(flag + ": '" + value + "' is not [HOST]:PORT");
      port = value.substr(close + 2);
      hasPort = true;
    }
  } else if (const size_t colon = value.rfind(':'); colon != std::string::npos &&
                                                    value.find(':') == colon) {
    host = value.substr(0, colon);
    port = value.substr(colon + 1);
    hasPort = true;
  }
  if (host.empty()) throw ConfigError(flag + ": '" + value + "' has no host");
  if (!hasPort) return {host, std::nullopt};
  auto number = parseInteger<int>(port);
  if (!number || *number < 0 || *number > 65535)
    throw ConfigError(flag + ": port '" + port + "' is not a number from 0 to 65535");
  return {host, static_cast<uint16_t>(*number)};
}

LaunchParse parseDlrunArgs(const std::vector<std::string>& args, const HostProbe& host) {
  LaunchParse result;
  LaunchConfig& c = result.config;
  std::string nnodes = "1", nproc = "1", rdzvConf, redirects = "0", tee = "0", ranksFilter;
  std::string logDir, localAddr, tfConfig = "auto";
  int masterPort = -1;
  double monitorInterval = 0.1, stopTimeout = 30;
  bool module = false, noPython = false, runPath = false;

  CLI::App app(
      "dlrun: launch N workers per node, as torchrun does, with the environment PyTorch and "
      "TensorFlow read.\nENTRYPOINT: a program, a .py script, a module with -m, or 'train' for "
      "the bundled trainer. status, events and stop ask a running job's control plane (see "
      "dlrun status --help).",
      "dlrun");
  setUsage(app, {"dlrun [OPTIONS] ENTRYPOINT [ARGS...]", "dlrun status|events|stop [OPTIONS]"});
  app.option_defaults()->always_capture_default();
  app.prefix_command();  // everything from the entry point on belongs to the workers
  auto* nnodesOption =
      addOption(app, "nnodes", nnodes, "Number of nodes, N or MIN:MAX for an elastic job");
  auto* nprocOption =
      addOption(app, "nproc-per-node", nproc, "Workers per node: N, cpu, gpu or auto");
  int nodeRank = -1;
  addOption(app, "node-rank", nodeRank,
            "This node's rank for the static backend; a group-rank hint for c10d")
      ->check(kCount);
  std::string backend;
  auto* backendOption = addOption(
      app, "rdzv-backend", backend,
      "Rendezvous backend: c10d (the default) or static (the default with --master-addr or "
      "--master-port and no --rdzv-endpoint); slurm: c10d set up from the Slurm allocation, "
      "which must exist; etcd (or etcd-v3): the elastic rendezvous on an etcd v3 cluster");
  auto* endpointOption =
      addOption(app, "rdzv-endpoint", c.rdzvEndpoint,
                "HOST[:PORT] of the rendezvous store; with etcd, HOST[:PORT],... (port 2379)");
  auto* rdzvIdOption =
      addOption(app, "rdzv-id", c.rdzvId, "Job id shared by every node of one job");
  bool noSlurm = false;
  addFlag(app, "no-slurm", noSlurm,
          "Ignore the Slurm allocation dlrun runs in (as DLRUN_SLURM=0 does)");
  addOption(app, "rdzv-conf", rdzvConf, "Backend settings as key=value,key2=value2");
  addFlag(app, "standalone", c.standalone,
          "One node with its own store on a free port; no rendezvous flags needed");
  addOption(app, "max-restarts", c.maxRestarts, "Restarts of the worker group after a failure")
      ->check(kCount);
  addOption(app, "monitor-interval", monitorInterval,
            "Accepted for torchrun compatibility: dlrun notices worker exits at once")
      ->check(kSeconds);
  auto* stopTimeoutOption = addOption(app, "stop-timeout", stopTimeout,
                                      "Seconds between SIGTERM and SIGKILL when workers are "
                                      "stopped (else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)")
                                ->check(kSeconds);
  double shutdownTimeout = 30;
  auto* shutdownTimeoutOption =
      addOption(app, "shutdown-timeout", shutdownTimeout, "torchrun's name of --stop-timeout")
          ->check(kSeconds);
  std::string startMethod = "spawn";
  addOption(app, "start-method", startMethod,
            "Accepted for torchrun compatibility (spawn, fork or forkserver): every worker is a "
            "new process running the entry point, as under torchrun for a script or program");
  std::string signalsToHandle = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  auto* signalsOption = addOption(
      app, "signals-to-handle", signalsToHandle,
      "Signals that stop the job: forwarded to every worker, which then get --stop-timeout "
      "seconds before SIGKILL. Of the default four, one left out is ignored; SIGUSR1 and "
      "SIGUSR2 left out are only forwarded");
  auto* roleOption = addOption(app, "role", c.role, "Role name of these workers (ROLE_NAME)");
  std::string roles;
  auto* rolesOption = addOption(
      app, "roles", roles,
      "Several roles on this node, NAME:COUNT[:service][:alone],... in local-rank order, e.g. "
      "ps:1:service,worker:2:alone; sets --nproc-per-node. service: does not end the job, "
      "stopped when the others end; alone: a failed worker restarts alone");
  addFlag(app, "module", module, "Run the entry point as a Python module (python -m)", "-m");
  addFlag(app, "no-python", noPython, "Execute the entry point directly, without Python");
  addFlag(app, "run-path", runPath, "Run a Python entry point as a script (the default)");
  addFlag(app, "virtual-local-rank", c.virtualLocalRank,
          "Every worker sees only its own GPU, as device 0: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES "
          "set to the device of its local rank (the inherited list's entry, else the number)");
  addOption(app, "log-dir", logDir, "Directory for per-rank logs and error files");
  addOption(app, "redirects", redirects,
            "Streams sent only to the log files: 0 none, 1 out, 2 err, 3 both, or 0:1,1:2", "-r");
  addOption(app, "tee", tee, "Streams copied to the log files (same values as --redirects)",
            "-t");
  addOption(app, "local-ranks-filter", ranksFilter, "Console shows only these local ranks");
  addOption(app, "log-line-prefix-template", c.logLinePrefixTemplate,
            "Prefix of each console line; ${rank}, ${local_rank}, ${role_name}");
  addOption(app, "tf-config", tfConfig,
            "TF_CONFIG for the workers: auto (when it fits the kernel's limit for one "
            "environment variable, else a warning), always (an error when it cannot fit) or "
            "never");
  std::string tokenFile;
  addOption(app, "token-file", tokenFile,
            "The job's token (else DLRUN_TOKEN): its control plane then answers only calls "
            "that carry it, and takes stops and signals from any host");
  bool noControlPlane = false;
  addFlag(app, "no-control-plane", noControlPlane,
          "Publish nothing to the control plane (dlrun status/events/stop) and follow none of "
          "its commands");
  int metricsPort = -1;
  addOption(app, "metrics-port", metricsPort,
            "Serve Prometheus metrics (/metrics) and the job's live page (/) over HTTP on this "
            "port, 0 for a free one; the address is printed (default: off)")
      ->check(CLI::Range(0, 65535));
  std::string metricsHost = "0.0.0.0";
  addOption(app, "metrics-host", metricsHost,
            "Numeric address --metrics-port listens on (\"::\" for IPv6 and IPv4)");
  double hangTimeout = 0;
  auto* hangTimeoutOption =
      addOption(app, "hang-timeout", hangTimeout,
                "Seconds without progress after which a worker that reported progress before "
                "is hung: stacks of every worker, a summary naming the suspect, then "
                "--hang-action (0, the default: off)")
          ->check(kSeconds);
  std::string hangAction = "restart";
  auto* hangActionOption = addOption(
      app, "hang-action", hangAction,
      "On a hang: report (stacks and summary, keep waiting), restart (also restart the worker "
      "group, counted against --max-restarts) or exit (end the job)");
  addOption(app, "local-addr", localAddr, "Address of this node as other nodes reach it");
  auto* masterAddrOption =
      addOption(app, "master-addr", c.masterAddr, "Store address for the static backend");
  auto* masterPortOption =
      addOption(app, "master-port", masterPort, "Store port for the static backend")
          ->check(CLI::Range(0, 65535));
  std::string hostfile, hostList, sshCommand = "ssh", localRankStyle = "dash";
  int sshPort = 0;
  HostLaunch hostLaunch;
  addLauncherOption(app, "hostfile", hostfile,
                    "Start one agent per host over ssh, hosts from FILE ('host slots=N' a line; "
                    "slots: its workers unless --nproc-per-node says)");
  addLauncherOption(app, "hosts", hostList, "As --hostfile, the hosts given as a:4,b:4");
  addLauncherOption(app, "ssh-command", sshCommand,
                    "The ssh client of --hostfile and its options (split at spaces)");
  addLauncherOption(app, "ssh-port", sshPort, "The port of the hosts' ssh servers")
      ->check(CLI::Range(1, 65535));
  addLauncherOption(app, "export", hostLaunch.exports,
                    "Also give the agents this variable (VAR, or VAR=VALUE); repeatable")
      ->allow_extra_args(false);
  app.add_flag(spellings("export-all", "").names, hostLaunch.exportAll,
               "Give the agents every variable of this environment but this session's own");
  app.add_flag("--control-stdin", c.controlStdin,
               "Follow the signals a --hostfile launcher writes on stdin; stop when it closes")
      ->group("");  // the launcher's own business, not the user's
  bool localRankArg = false, useEnv = false;
  addFlag(app, "use-local-rank-arg", localRankArg,
          "Append --local-rank=LOCAL_RANK to every worker's arguments, as "
          "torch.distributed.launch does");
  app.add_flag(spellings("no-use-env", "").names, localRankArg,
               "torch.distributed.launch's spelling of --use-local-rank-arg");
  app.add_flag(spellings("use-env", "").names, useEnv,
               "Accepted for torch.distributed.launch scripts: LOCAL_RANK is always in the "
               "environment");
  addOption(app, "local-rank-arg-style", localRankStyle,
            "--use-local-rank-arg's spelling: dash (--local-rank, PyTorch 2.0 on) or underscore "
            "(--local_rank, before)");
  app.set_version_flag("--version", kVersion);

  result.exitCode = parseCommandLine(app, args, kVersion);
  if (result.exitCode) return result;

  std::vector<std::string> rest = app.remaining();
  // The flags before the entry point: a --hostfile launch hands them on to its agents.
  const std::vector<std::string> flags(args.begin(),
                                       args.end() - static_cast<ptrdiff_t>(rest.size()));
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
  if (rest.empty()) throw ConfigError("no entry point: usage is dlrun [flags] ENTRYPOINT [args...]");
  // CLI11 hands over everything from the first argument it does not know, flags included.
  if (rest.front().starts_with("-"))
    throw ConfigError("unknown flag " + rest.front().substr(0, rest.front().find('=')) +
                      " (see dlrun --help)");
  if (module && noPython) throw ConfigError("--module and --no-python cannot be used together");

  if (localRankStyle != "dash" && localRankStyle != "underscore")
    throw ConfigError("--local-rank-arg-style: '" + localRankStyle +
                      "' is not dash or underscore");
  if (localRankArg) c.localRankFlag = localRankStyle == "dash" ? "--local-rank" : "--local_rank";
  std::tie(c.minNodes, c.maxNodes) = parseNnodes(nnodes);
  c.nprocPerNode = parseNprocPerNode(nproc, host);
  if (rolesOption->count() > 0) {
    c.roles = agents::parseRoles(roles);
    if (roleOption->count() > 0)
      throw ConfigError("--role and --roles cannot be used together: --roles names every role");
    if (nprocOption->count() > 0 && c.nprocPerNode != agents::workerCount(c.roles))
      throw ConfigError("--nproc-per-node=" + nproc + " but --roles '" + roles + "' makes " +
                        std::to_string(agents::workerCount(c.roles)) + " workers");
    c.nprocPerNode = agents::workerCount(c.roles);
  }
  c.rdzv = parseRdzvSettings(parseRdzvConf(rdzvConf));
  if (nodeRank >= 0) c.nodeRank = nodeRank;
  c.redirects = parseStreams("--redirects", redirects);
  c.tee = parseStreams("--tee", tee);
  if (!ranksFilter.empty()) c.localRanksFilter = parseRanksFilter(ranksFilter);
  c.tfConfig = parseTfConfig(tfConfig);
  c.controlPlane = !noControlPlane;
  if (metricsPort >= 0)
    c.metrics = agents::MetricsOptions{.host = metricsHost,
                                       .port = static_cast<uint16_t>(metricsPort)};
  if (!tokenFile.empty()) {
    c.token = readTokenFile("--token-file", tokenFile);
  } else if (auto it = host.env.find("DLRUN_TOKEN"); it != host.env.end()) {
    c.token = it->second;
  }
  const agents::HangAction action = parseHangAction(hangAction);
  if (hangTimeout > 0) {
    c.hang = agents::HangOptions{
        .timeout = std::chrono::milliseconds(static_cast<int64_t>(hangTimeout * 1000)),
        .action = action};
  } else if (hangActionOption->count() > 0 && hangTimeoutOption->count() == 0) {
    // An action alone is a mistake; an explicit --hang-timeout=0 turns the watch off.
    throw ConfigError("--hang-action needs --hang-timeout=SECONDS (hang watching is off)");
  }
  if (!logDir.empty()) c.logDir = logDir;
  if (!localAddr.empty()) c.localAddr = localAddr;
  if (masterPort >= 0) c.masterPort = static_cast<uint16_t>(masterPort);
  if (startMethod != "spawn" && startMethod != "fork" && startMethod != "forkserver")
    throw ConfigError("--start-method: '" + startMethod + "' is not spawn, fork or forkserver");
  if (stopTimeoutOption->count() > 0 && shutdownTimeoutOption->count() > 0)
    throw ConfigError("--stop-timeout and --shutdown-timeout are one setting: give one of them");
  if (shutdownTimeoutOption->count() > 0) {
    stopTimeout = shutdownTimeout;
  } else if (auto it = host.env.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
             stopTimeoutOption->count() == 0 && it != host.env.end()) {
    const auto seconds = parseInteger<int>(it->second);
    if (!seconds || *seconds < 0 || *seconds > 86'400)
      throw ConfigError("TORCH_ELASTIC_SHUTDOWN_TIMEOUT: '" + it->second +
                        "' is not a whole number of seconds from 0 to 86400");
    stopTimeout = *seconds;
  }
  c.stopTimeout = std::chrono::milliseconds(static_cast<int64_t>(stopTimeout * 1000));
  if (signalsOption->count() > 0) c.signalsToHandle = parseSignalsToHandle(signalsToHandle);
  // The backend is decided here and nowhere else. torchrun's classic static launch
  // (--master-addr/--master-port) keeps working unchanged; anything else several nodes run
  // defaults to the elastic c10d rendezvous, and --standalone's own store is a c10d one.
  std::optional<RdzvBackendFlag> backendFlag;
  if (backendOption->count() > 0) backendFlag = parseRdzvBackend(backend);
  const bool slurmBackend = backendFlag && backendFlag->slurm;
  const bool staticFlags = masterAddrOption->count() > 0 || masterPortOption->count() > 0;
  const bool fanout = !hostfile.empty() || !hostList.empty();
  // Each host of a one-command launch checks its own devices.
  if (c.virtualLocalRank && !fanout) {
    const auto visible = host.env.find("CUDA_VISIBLE_DEVICES");
    agents::checkVirtualLocalRank(c.nprocPerNode, visible == host.env.end()
                                              ? std::nullopt
                                              : std::optional(visible->second));
  }
  if (fanout) {
    // The hosts make the job's shape; the agents get the rest of this command line.
    auto conflict = [](const std::string& flag) {
      return ConfigError("--hostfile/--hosts and " + flag +
                         " conflict: the hosts give the nodes and their ranks");
    };
    if (nnodesOption->count() > 0) throw conflict("--nnodes");
    if (nodeRank >= 0) throw conflict("--node-rank");
    if (c.standalone) throw conflict("--standalone");
    if (staticFlags) throw conflict("--master-addr/--master-port");
    // Each host's slots give its workers; roles would have to say which host runs which.
    if (rolesOption->count() > 0)
      throw ConfigError("--roles does not work with --hostfile/--hosts yet: start one dlrun per "
                        "node with --roles (by hand, Slurm or mpirun)");
    if (slurmBackend || (backendFlag && backendFlag->backend == RdzvBackend::Static))
      throw conflict("--rdzv-backend=" + backend);
    hostLaunch.hosts = hostsOf(hostfile, hostList);
    hostLaunch.sshCommand = remote::splitCommand(sshCommand);
    if (sshPort > 0) hostLaunch.sshPort = static_cast<uint16_t>(sshPort);
    hostLaunch.agentFlags = remote::keptFlags(flags);
    if (nprocOption->count() > 0) hostLaunch.nproc = nproc;
    hostLaunch.backend = backend;
    hostLaunch.rdzvConf = rdzvConf;
    hostLaunch.entry = rest;
    c.minNodes = c.maxNodes = static_cast<int>(hostLaunch.hosts.size());
  }
  if (c.standalone) {
    if (c.maxNodes != 1) throw ConfigError("--standalone runs one node; drop --nnodes=" + nnodes);
    if (slurmBackend) throw ConfigError("--standalone and --rdzv-backend=slurm conflict");
    c.rdzvBackend = RdzvBackend::C10d;
  } else if (backendFlag) {
    c.rdzvBackend = backendFlag->backend;
  } else {
    c.rdzvBackend = staticFlags && c.rdzvEndpoint.empty() ? RdzvBackend::Static
                                                          : RdzvBackend::C10d;
  }
  // Inside an allocation Slurm fills in what the flags leave open; --rdzv-backend=slurm
  // insists on it, --standalone and --no-slurm (DLRUN_SLURM=0) turn it off.
  if (slurmBackend) {
    if (noSlurm) throw ConfigError("--rdzv-backend=slurm and --no-slurm conflict");
    if (!host.env.contains("SLURM_JOB_ID"))
      throw ConfigError("--rdzv-backend=slurm: SLURM_JOB_ID is unset, so this is no Slurm "
                        "allocation; start dlrun with srun, or use --rdzv-backend=c10d");
  }
  // etcd's endpoints: one list, checked before anything else is decided from them. Where the
  // flag is not given, DLRUN_ETCD_ENDPOINTS names them (set once for a cluster or a site).
  const bool etcd = c.rdzvBackend == RdzvBackend::Etcd;
  if (etcd && c.rdzvEndpoint.empty()) {
    if (auto it = host.env.find("DLRUN_ETCD_ENDPOINTS"); it != host.env.end())
      c.rdzvEndpoint = it->second;
  }
  if (etcd && !c.rdzvEndpoint.empty()) {
    try {
      c.etcdEndpoints = rendezvous::etcd::parseEndpoints(c.rdzvEndpoint);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("--rdzv-endpoint: ") + e.what());
    }
  } else if (!c.rdzvEndpoint.empty()) {
    parseEndpoint("--rdzv-endpoint", c.rdzvEndpoint);
  }
  if (etcd) {
    c.etcdSecurity = etcdSecurity(c.rdzv, c.etcdEndpoints);
  } else if (c.rdzv.etcdSecurityGiven()) {
    throw ConfigError("--rdzv-conf: cacert, cert, key, user, password and password_file are "
                      "settings of --rdzv-backend=etcd");
  }
  // Under etcd Slurm gives the job id, the node count and the node order (SLURM_NODEID as the
  // group-rank hint), but no endpoint: nobody serves the rendezvous.
  const bool inSlurm = !fanout && !noSlurm && !c.standalone && slurm::detected(host.env);
  // mpirun inside a Slurm allocation starts the dlrun processes itself: its world wins there
  // (PMIx alone, which srun --mpi=pmix sets as well, does not).
  const bool underMpi = !fanout && !c.standalone && !slurmBackend && mpi::detected(host.env) &&
                        (!inSlurm || host.env.contains("OMPI_COMM_WORLD_RANK"));
  if (underMpi) {
    applyMpi(mpi::discover(host.env,
                           {.nnodes = nnodesOption->count() > 0,
                            .nodeRank = nodeRank >= 0,
                            .rdzvEndpoint = endpointOption->count() > 0 ||
                                            c.rdzvBackend != RdzvBackend::C10d,
                            .rdzvId = rdzvIdOption->count() > 0}),
             c);
  } else if (slurmBackend || inSlurm) {
    applySlurm(slurm::discover(host.env,
                               {.nnodes = nnodesOption->count() > 0,
                                .nodeRank = nodeRank >= 0,
                                .rdzvEndpoint = endpointOption->count() > 0 ||
                                                c.rdzvBackend != RdzvBackend::C10d,
                                .rdzvId = rdzvIdOption->count() > 0,
                                .nprocAuto = nproc == "auto"}),
               c);
  }
  if (c.maxNodes > 1 && c.rdzvBackend == RdzvBackend::Static && c.minNodes != c.maxNodes)
    throw ConfigError("--nnodes=" + nnodes + ": an elastic range needs --rdzv-backend=c10d");
  if (c.maxNodes == 1 && !c.roles.empty()) agents::requireEndingRole(c.roles, roles);
  // A c10d rank hint from Slurm may exceed the maximum: spare nodes carry the higher ids.
  if (c.nodeRank && *c.nodeRank >= c.maxNodes &&
      (nodeRank >= 0 || c.rdzvBackend == RdzvBackend::Static))
    throw ConfigError((nodeRank >= 0 ? "--node-rank " : "node rank (SLURM_NODEID) ") +
                      std::to_string(*c.nodeRank) + " is not below --nnodes " +
                      std::to_string(c.maxNodes));
  // Every node must find the c10d store; Slurm derives its place, elsewhere the user names it.
  if (c.maxNodes > 1 && c.rdzvBackend == RdzvBackend::C10d && c.rdzvEndpoint.empty() && !fanout)
    throw ConfigError("--nnodes=" + nodesText(c) +
                      " with the c10d backend needs --rdzv-endpoint=HOST[:PORT]");
  if (c.maxNodes > 1 && etcd && c.etcdEndpoints.empty())
    throw ConfigError("--nnodes=" + nodesText(c) +
                      " with the etcd backend needs --rdzv-endpoint=HOST[:PORT],... (or "
                      "DLRUN_ETCD_ENDPOINTS)");

  if (fanout) c.hostLaunch = std::move(hostLaunch);
  c.entrypoint = rest.front();
  c.command = resolveCommand(rest.front(), {rest.begin() + 1, rest.end()},
                             {.module = module, .noPython = noPython}, host);
  return result;
}

}  // namespace dlrun::launcher
