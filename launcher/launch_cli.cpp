// The dlrun command line in stages (ARCHITECTURE.md section 2): the flags are declared, read
// into the LaunchConfig, then the hosts of a --hostfile launch, the backend and what Slurm or
// mpirun gives, and the checks across flags. The value parsers are in launch_cli_values.cpp.
#include "launcher/launch_cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>

#include "agents/warm_start_wire.h"
#include "common/cli.h"
#include "common/error.h"
#include "common/host_port.h"
#include "common/text.h"
#include "common/version.h"
#include "launcher/entry_point.h"
#include "launcher/launch_flags.h"
#include "mpi/discovery.h"
#include "remote/agent_command.h"
#include "remote/hostfile.h"
#include "rendezvous/etcd/endpoints.h"

namespace dlrun::launcher {
namespace {

// The node count as --nnodes writes it, whether the flag or Slurm set it.
std::string nodesText(const LaunchConfig& c) {
  const std::string low = std::to_string(c.minNodes);
  return c.minNodes == c.maxNodes ? low : low + ":" + std::to_string(c.maxNodes);
}

// The c10d store's endpoint that Slurm or mpirun derived, as if --rdzv-endpoint named it.
void setRdzvStore(LaunchConfig& c, HostPort store) {
  c.rdzvEndpoint = {.text = store.text(), .where = std::move(store)};
}

// Slurm's or mpirun's settings where the user gave no flag (common/discovery.h says which
// scheduler gives which).
void applyDiscovered(const discovery::Settings& s, LaunchConfig& c) {
  if (s.rdzvId) c.rdzvId = *s.rdzvId;
  if (s.nnodes) c.minNodes = c.maxNodes = *s.nnodes;
  if (s.nodeRank) c.nodeRank = s.nodeRank;
  if (s.nprocPerNode) c.agent.nprocPerNode = *s.nprocPerNode;
  if (s.endpoint) setRdzvStore(c, *s.endpoint);
  if (!c.rdzv.isHost) c.rdzv.isHost = s.servesStore;
  if (s.nodeName) c.nodeName = s.nodeName;
  c.jobHosts = s.nodes;
  c.refuseLostNodes = s.refuseLostNodes;
  c.agent.requeues = s.requeues;
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

// What CLI11 left over: the entry point and its arguments (less a leading "--"); the flags
// before them.
void splitEntryPoint(const std::vector<std::string>& args, std::vector<std::string> remaining,
                     DeclaredFlags& f) {
  f.rest = std::move(remaining);
  // The flags before the entry point: a --hostfile launch hands them on to its agents.
  f.flags.assign(args.begin(), args.end() - static_cast<ptrdiff_t>(f.rest.size()));
  if (!f.rest.empty() && f.rest.front() == "--") f.rest.erase(f.rest.begin());
  if (f.rest.empty())
    throw ConfigError("no entry point: usage is dlrun [flags] ENTRYPOINT [args...]");
  // CLI11 hands over everything from the first argument it does not know, flags included.
  if (f.rest.front().starts_with("-"))
    throw ConfigError("unknown flag " + f.rest.front().substr(0, f.rest.front().find('=')) +
                      " (see dlrun --help)");
  if (f.module && f.noPython && !f.runPath)
    throw ConfigError("--module and --no-python cannot be used together");
}

// --console-dedup: its prefix is the ranks' list, so it takes dlrun's own console lines; auto
// turns itself off for a prefix or format of the user's, where `on` says why it cannot.
void consoleDedup(const DeclaredFlags& f, LaunchConfig& c) {
  if (f.consoleDedup == "off") return;
  const bool own = c.agent.consoleFormat == agents::ConsoleFormat::Dlrun &&
                   c.agent.logLinePrefixTemplate == "[${rank}]:";
  if (!own && f.consoleDedup == "on")
    throw ConfigError(
        "--console-dedup=on needs dlrun's console lines ([${rank}]:, --console-format=dlrun): "
        "the ranks' list is their prefix");
  if (!own) return;
  c.agent.consoleDedup =
      std::chrono::milliseconds(static_cast<int64_t>(f.consoleDedupWindow * 1000));
  c.agent.consoleDedupFrom = f.consoleDedup == "on" ? 1 : 8;
}

// --ready-spares and --ready-replacements: workers started ahead from the zygote, waiting in
// dlrun.recovery's loop for a place.
void checkStartedAhead(bool set, const std::string& flag, const DeclaredFlags& f,
                       const LaunchConfig& c) {
  if (!set) return;
  if (!(c.agent.inProcessRecovery && f.warmStart))
    throw ConfigError(flag +
                      " needs --recovery=in-process and --warm-start (workers started ahead "
                      "wait in dlrun.recovery's loop, forked from the warm interpreter)");
  if (c.agent.virtualLocalRank)
    throw ConfigError(flag +
                      " and --virtual-local-rank conflict: a worker started ahead runs before "
                      "its place is known");
}

void checkReadySpares(const DeclaredFlags& f, const LaunchConfig& c) {
  checkStartedAhead(c.agent.readySpares, "--ready-spares", f, c);
  checkStartedAhead(c.agent.readyReplacements, "--ready-replacements", f, c);
}

// Reading: each flag's value into the LaunchConfig, and the rest of what the backend is
// decided from.
void readFlagValues(DeclaredFlags& f, LaunchConfig& c, const HostProbe& host) {
  if (f.localRankArg)
    c.agent.localRankFlag = f.localRankStyle == "dash" ? "--local-rank" : "--local_rank";
  std::tie(c.minNodes, c.maxNodes) = parseNnodes(f.nnodes);
  c.agent.nprocPerNode = parseNprocPerNode(f.nproc, host);
  if (f.rolesOption->count() > 0) {
    c.agent.roles = agents::parseRoles(f.roles);
    if (f.roleOption->count() > 0)
      throw ConfigError("--role and --roles cannot be used together: --roles names every role");
    if (f.nprocOption->count() > 0 && c.agent.nprocPerNode != agents::workerCount(c.agent.roles))
      throw ConfigError("--nproc-per-node=" + f.nproc + " but --roles '" + f.roles + "' makes " +
                        std::to_string(agents::workerCount(c.agent.roles)) + " workers");
    c.agent.nprocPerNode = agents::workerCount(c.agent.roles);
  }
  const auto rdzvConf = parseRdzvConf(f.rdzvConf);
  c.rdzv = parseRdzvSettings(rdzvConf);
  // In a Kubernetes pod, SIGTERM is the pod's deletion (a scale-down, a preemption, a drained
  // node): in an elastic job that node leaves and the others go on, unless stop_policy says.
  if (!rdzvConf.contains("stop_policy") && c.minNodes < c.maxNodes &&
      host.env.contains("KUBERNETES_SERVICE_HOST"))
    c.rdzv.stopOnlyNode = true;
  if (f.nodeRank >= 0) c.nodeRank = f.nodeRank;
  c.agent.redirects = parseStreams("--redirects", f.redirects);
  c.agent.tee = parseStreams("--tee", f.tee);
  if (!f.ranksFilter.empty()) c.agent.localRanksFilter = parseRanksFilter(f.ranksFilter);
  c.agent.tfConfig = parseTfConfig(f.tfConfig);
  c.agent.inProcessRecovery = f.recovery == "in-process";
  c.workerStore = f.workerStore == "agent"   ? WorkerStore::Agent
                  : f.workerStore == "rank0" ? WorkerStore::RankZero
                                             : WorkerStore::Auto;
  c.controlPlane = !f.noControlPlane;
  if (f.metricsPort >= 0)
    c.agent.metrics =
        agents::MetricsOptions{.host = f.metricsHost, .port = static_cast<uint16_t>(f.metricsPort)};
  if (!f.tokenFile.empty()) {
    c.token = readTokenFile("--token-file", f.tokenFile);
  } else if (auto it = host.env.find("DLRUN_TOKEN"); it != host.env.end()) {
    c.token = it->second;
  }
  const agents::HangAction action = parseHangAction(f.hangAction);
  if (f.hangTimeout > 0) {
    c.agent.hang = agents::HangOptions{
        .timeout = std::chrono::milliseconds(static_cast<int64_t>(f.hangTimeout * 1000)),
        .action = action};
  } else if (f.hangActionOption->count() > 0 && f.hangTimeoutOption->count() == 0) {
    // An action alone is a mistake; an explicit --hang-timeout=0 turns the watch off.
    throw ConfigError("--hang-action needs --hang-timeout=SECONDS (hang watching is off)");
  }
  if (!f.logDir.empty()) c.agent.logDir = f.logDir;
  if (!f.checkpointDir.empty()) c.agent.checkpointDir = f.checkpointDir;
  c.agent.checkpointWriteEvery =
      std::chrono::milliseconds(static_cast<int64_t>(f.checkpointWriteEvery * 1000));
  if (!f.localAddr.empty()) c.localAddr = f.localAddr;
  if (f.masterPort >= 0) c.masterPort = static_cast<uint16_t>(f.masterPort);
  if (f.stopTimeoutOption->count() > 0 && f.shutdownTimeoutOption->count() > 0)
    throw ConfigError("--stop-timeout and --shutdown-timeout are one setting: give one of them");
  if (f.shutdownTimeoutOption->count() > 0) {
    f.stopTimeout = f.shutdownTimeout;
  } else if (auto it = host.env.find("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
             f.stopTimeoutOption->count() == 0 && it != host.env.end()) {
    const auto seconds = parseInteger<int>(it->second);
    if (!seconds || *seconds < 0 || *seconds > 86'400)
      throw ConfigError("TORCH_ELASTIC_SHUTDOWN_TIMEOUT: '" + it->second +
                        "' is not a whole number of seconds from 0 to 86400");
    f.stopTimeout = *seconds;
  } else if (f.stopTimeoutOption->count() == 0 && host.env.contains("KUBERNETES_SERVICE_HOST")) {
    // A deleted pod has 30 s (terminationGracePeriodSeconds' default) between SIGTERM and the
    // kubelet's SIGKILL: dlrun's own SIGKILL and its exit report come before.
    f.stopTimeout = kPodStopTimeoutSeconds;
  }
  c.agent.stopTimeout = std::chrono::milliseconds(static_cast<int64_t>(f.stopTimeout * 1000));
  if (f.stdoutFiltersOption->count() > 0)
    c.agent.duplicateStdoutFilters = parseFilterList(f.stdoutFilters);
  if (f.stderrFiltersOption->count() > 0)
    c.agent.duplicateStderrFilters = parseFilterList(f.stderrFilters);
  if (f.consoleFormat == "torchrun") {
    c.agent.consoleFormat = agents::ConsoleFormat::Torchrun;
    if (f.prefixOption->count() == 0)
      c.agent.logLinePrefixTemplate = "[${role_name}${local_rank}]:";
  }
  // torchrun 2.x sets its prefix through this variable alone.
  if (auto it = host.env.find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE");
      f.prefixOption->count() == 0 && it != host.env.end())
    c.agent.logLinePrefixTemplate = it->second;
  consoleDedup(f, c);
  if (f.signalsOption->count() > 0)
    c.agent.signalsToHandle = parseSignalsToHandle(f.signalsToHandle);
  checkReadySpares(f, c);
  if (f.preloadOption->count() > 0 && !f.warmStart)
    throw ConfigError("--preload needs --warm-start (the modules are imported for warm starts)");
  // What resolveBackend decides the backend from.
  if (f.backendOption->count() > 0) f.backendFlag = parseRdzvBackend(f.backend);
  f.slurmBackend = f.backendFlag && f.backendFlag->slurm;
  f.staticFlags = f.masterAddrOption->count() > 0 || f.masterPortOption->count() > 0;
  f.fanout = !f.hostfile.empty() || !f.hostList.empty();
  // The node's own workers and agent reach a store it serves on loopback too.
  if (!f.storeAllow.empty())
    c.storeAllow = AdmissionRule::parse(f.storeAllow + ",127.0.0.1,::1", "--store-allow");
  c.agent.storeProxy = f.storeProxy == "on" ||
                       (f.storeProxy == "auto" && c.agent.nprocPerNode >= kStoreProxyAutoWorkers);
  // Each host of a one-command launch binds on its own machine.
  if (!f.numaBinding.empty()) {
    const auto mode = agents::parseNumaMode(f.numaBinding);
    if (!mode)
      throw ConfigError("--numa-binding: '" + f.numaBinding +
                        "' is not node, socket, exclusive or core-complex");
    if (!f.fanout) c.agent.cpuBinding = host.numaCpuSets(*mode, c.agent.nprocPerNode);
  }
  // Each host of a one-command launch checks its own devices.
  if (c.agent.virtualLocalRank && !f.fanout) {
    const auto visible = host.env.find("CUDA_VISIBLE_DEVICES");
    agents::checkVirtualLocalRank(c.agent.nprocPerNode, visible == host.env.end()
                                                            ? std::nullopt
                                                            : std::optional(visible->second));
  }
}

// Hosts: a --hostfile/--hosts launch takes the job's shape from its hosts.
void resolveHosts(DeclaredFlags& f, LaunchConfig& c, const HostProbe& probe) {
  // The hosts make the job's shape; the agents get the rest of this command line.
  auto conflict = [](const std::string& flag) {
    return ConfigError("--hostfile/--hosts and " + flag +
                       " conflict: the hosts give the nodes and their ranks");
  };
  if (f.nnodesOption->count() > 0) throw conflict("--nnodes");
  if (f.nodeRank >= 0) throw conflict("--node-rank");
  if (c.standalone) throw conflict("--standalone");
  if (f.staticFlags) throw conflict("--master-addr/--master-port");
  // Each host's slots give its workers; roles would have to say which host runs which.
  if (f.rolesOption->count() > 0)
    throw ConfigError(
        "--roles does not work with --hostfile/--hosts yet: start one dlrun per "
        "node with --roles (by hand, Slurm or mpirun)");
  if (f.slurmBackend || (f.backendFlag && f.backendFlag->backend == RdzvBackend::Static))
    throw conflict("--rdzv-backend=" + f.backend);
  f.hostLaunch.hosts = hostsOf(f.hostfile, f.hostList);
  for (const auto& host : f.hostLaunch.hosts) {
    const std::string name = host.name.substr(host.name.find('@') + 1);  // user@host
    auto address = probe.resolveHost(name);
    if (!address) throw ConfigError(host.where + ": unknown host '" + name + "'");
    f.hostLaunch.addresses.push_back(*address);
  }
  f.hostLaunch.sshCommand = remote::splitCommand(f.sshCommand);
  if (f.sshPort > 0) f.hostLaunch.sshPort = static_cast<uint16_t>(f.sshPort);
  f.hostLaunch.agentFlags = remote::keptFlags(f.flags);
  if (f.nprocOption->count() > 0) f.hostLaunch.nproc = f.nproc;
  f.hostLaunch.backend = f.backend;
  f.hostLaunch.rdzvConf = f.rdzvConf;
  f.hostLaunch.entry = f.rest;
  c.minNodes = c.maxNodes = static_cast<int>(f.hostLaunch.hosts.size());
}

// The backend, its endpoint and security, and what Slurm or mpirun fill in.
void resolveBackend(const DeclaredFlags& f, LaunchConfig& c, const HostProbe& host) {
  // The backend is decided here and nowhere else. torchrun's classic static launch
  // (--master-addr/--master-port) keeps working unchanged; anything else several nodes run
  // defaults to the elastic c10d rendezvous, and --standalone's own store is a c10d one.
  if (c.standalone) {
    if (c.maxNodes != 1) throw ConfigError("--standalone runs one node; drop --nnodes=" + f.nnodes);
    if (f.slurmBackend) throw ConfigError("--standalone and --rdzv-backend=slurm conflict");
    c.rdzvBackend = RdzvBackend::C10d;
  } else if (f.backendFlag) {
    c.rdzvBackend = f.backendFlag->backend;
  } else {
    c.rdzvBackend =
        f.staticFlags && !c.rdzvEndpoint.given() ? RdzvBackend::Static : RdzvBackend::C10d;
  }
  // Inside an allocation Slurm fills in what the flags leave open; --rdzv-backend=slurm
  // insists on it, --standalone and --no-slurm (DLRUN_SLURM=0) turn it off.
  if (f.slurmBackend) {
    if (f.noSlurm) throw ConfigError("--rdzv-backend=slurm and --no-slurm conflict");
    if (!host.env.contains("SLURM_JOB_ID"))
      throw ConfigError(
          "--rdzv-backend=slurm: SLURM_JOB_ID is unset, so this is no Slurm "
          "allocation; start dlrun with srun, or use --rdzv-backend=c10d");
  }
  // etcd's endpoints: one list, checked before anything else is decided from them. Where the
  // flag is not given, DLRUN_ETCD_ENDPOINTS names them (set once for a cluster or a site).
  const bool etcd = c.rdzvBackend == RdzvBackend::Etcd;
  RdzvEndpoint& endpoint = c.rdzvEndpoint;
  if (etcd && !endpoint.given()) {
    if (auto it = host.env.find("DLRUN_ETCD_ENDPOINTS"); it != host.env.end())
      endpoint.text = it->second;
  }
  if (etcd && endpoint.given()) {
    try {
      endpoint.where = rendezvous::etcd::parseEndpoints(endpoint.text);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("--rdzv-endpoint: ") + e.what());
    }
  } else if (endpoint.given()) {
    endpoint.where = parseRdzvEndpoint(endpoint.text);
  }
  if (etcd) {
    c.etcdSecurity = etcdSecurity(
        c.rdzv, endpoint.given() ? endpoint.etcd() : std::vector<rendezvous::etcd::Endpoint>{});
  } else if (c.rdzv.etcdSecurityGiven()) {
    throw ConfigError(
        "--rdzv-conf: cacert, cert, key, user, password and password_file are "
        "settings of --rdzv-backend=etcd");
  }
  // Under etcd Slurm gives the job id, the node count and the node order (SLURM_NODEID as the
  // group-rank hint), but no endpoint: nobody serves the rendezvous.
  const bool inSlurm = !f.fanout && !f.noSlurm && !c.standalone && slurm::detected(host.env);
  // mpirun inside a Slurm allocation starts the dlrun processes itself: its world wins there
  // (PMIx alone, which srun --mpi=pmix sets as well, does not).
  const bool underMpi = !f.fanout && !c.standalone && !f.slurmBackend && mpi::detected(host.env) &&
                        (!inSlurm || host.env.contains("OMPI_COMM_WORLD_RANK"));
  const discovery::UserFlags user{
      .nnodes = f.nnodesOption->count() > 0,
      .nodeRank = f.nodeRank >= 0,
      .rdzvEndpoint = f.endpointOption->count() > 0 || c.rdzvBackend != RdzvBackend::C10d,
      .rdzvId = f.rdzvIdOption->count() > 0,
      .nprocAuto = f.nproc == "auto"};
  if (underMpi)
    applyDiscovered(mpi::discover(host.env, user), c);
  else if (f.slurmBackend || inSlurm)
    applyDiscovered(slurm::discover(host.env, user), c);
}

// The checks across flags, once the backend and the node count are known.
void crossCheck(const DeclaredFlags& f, const LaunchConfig& c) {
  if (c.maxNodes > 1 && c.rdzvBackend == RdzvBackend::Static && c.minNodes != c.maxNodes)
    throw ConfigError("--nnodes=" + f.nnodes + ": an elastic range needs --rdzv-backend=c10d");
  if (c.maxNodes == 1 && !c.agent.roles.empty()) agents::requireEndingRole(c.agent.roles, f.roles);
  // A c10d rank hint from Slurm may exceed the maximum: spare nodes carry the higher ids.
  if (c.nodeRank && *c.nodeRank >= c.maxNodes &&
      (f.nodeRank >= 0 || c.rdzvBackend == RdzvBackend::Static))
    throw ConfigError((f.nodeRank >= 0 ? "--node-rank " : "node rank (SLURM_NODEID) ") +
                      std::to_string(*c.nodeRank) + " is not below --nnodes " +
                      std::to_string(c.maxNodes));
  // Every node must find the c10d store; Slurm derives its place, elsewhere the user names it.
  if (c.maxNodes > 1 && c.rdzvBackend == RdzvBackend::C10d && !c.rdzvEndpoint.given() && !f.fanout)
    throw ConfigError("--nnodes=" + nodesText(c) +
                      " with the c10d backend needs --rdzv-endpoint=HOST[:PORT]");
  if (c.maxNodes > 1 && c.rdzvBackend == RdzvBackend::Etcd && !c.rdzvEndpoint.given())
    throw ConfigError("--nnodes=" + nodesText(c) +
                      " with the etcd backend needs --rdzv-endpoint=HOST[:PORT],... (or "
                      "DLRUN_ETCD_ENDPOINTS)");
}

// The probe holds the rendezvous's thread, whose requests keep dlrund's lease on the node: one
// that can outlast the lease would have the node taken for lost every round it probes.
void checkProbeWithinLease(std::chrono::milliseconds probe, const LaunchConfig& c) {
  if (c.maxNodes < 2 || c.rdzvBackend != RdzvBackend::C10d) return;
  const auto ttl = c.rdzv.leaseTtl();
  if (probe + c.rdzv.heartbeat <= ttl) return;
  auto secondsText = [](std::chrono::milliseconds ms) {
    char text[32];
    std::snprintf(text, sizeof text, "%g s", std::chrono::duration<double>(ms).count());
    return std::string(text);
  };
  throw ConfigError("--network-probe-timeout " + secondsText(probe) +
                    " does not end a heartbeat (" + secondsText(c.rdzv.heartbeat) +
                    ") before the node's rendezvous lease of " + secondsText(ttl) +
                    " lapses: lower it, or raise --rdzv-conf heartbeat_timeout");
}

// --warm-start: only for a Python interpreter running a script or a module, since the workers
// are forked from one (agents/warm_start_wire.h).
agents::WarmStartOptions warmStartOf(const DeclaredFlags& f,
                                     const std::vector<std::string>& command,
                                     const HostProbe& host) {
  if (f.noPython)
    throw ConfigError(
        "--warm-start and --no-python conflict: warm starts fork a Python "
        "interpreter, and --no-python runs the entry point as a program");
  if (f.rest.front() == "train")
    throw ConfigError(
        "--warm-start: the bundled trainer (train) is no Python program; drop "
        "--warm-start");
  agents::WarmStartOptions options{
      .interpreter = agents::warm::parsePythonCommand(command, host.pythonExec).interpreter};
  if (f.preloadOption->count() > 0) options.preload = agents::warm::parsePreload(f.preload);
  return options;
}

// torchrun's TORCHELASTIC_HEALTH_CHECK_PORT (launch() serves the liveness answer there).
std::optional<uint16_t> healthCheckPort(const Environment& env) {
  const auto it = env.find("TORCHELASTIC_HEALTH_CHECK_PORT");
  if (it == env.end() || it->second.empty()) return std::nullopt;
  const auto port = parseInteger<uint16_t>(it->second);
  if (!port || *port == 0)
    throw ConfigError("TORCHELASTIC_HEALTH_CHECK_PORT='" + it->second +
                      "' is not a port (1 to 65535)");
  return port;
}

// Where a node put out names itself: --quarantine-file, else, in a Slurm job, beside its batch
// script, where the script reads it (docs/guides/health-checks.md).
std::optional<std::filesystem::path> quarantineFile(const DeclaredFlags& f,
                                                    const Environment& env) {
  if (!f.quarantineFile.empty()) return std::filesystem::path(f.quarantineFile);
  const auto job = env.find("SLURM_JOB_ID");
  if (f.noSlurm || job == env.end()) return std::nullopt;
  const auto dir = env.find("SLURM_SUBMIT_DIR");
  return std::filesystem::path(dir == env.end() ? "." : dir->second) /
         ("dlrun-exclude-" + job->second);
}

}  // namespace

// The checks before every round (agents/health_check.h); none where nothing is to be checked
// and no node is put out. The GPUs are checked whenever the checks run (skipped without GPUs).
std::optional<agents::HealthOptions> healthOptions(const DeclaredFlags& f, const LaunchConfig& c) {
  if (f.healthCheck.empty() && f.healthMinFree == 0 && f.healthGpus == 0 &&
      c.agent.quarantine.after == 0)
    return std::nullopt;
  agents::HealthOptions health{
      .timeout = std::chrono::milliseconds(static_cast<int64_t>(f.healthCheckTimeout * 1000)),
      .minFreeBytes = static_cast<uint64_t>(f.healthMinFree * (1ull << 30)),
      .alone = c.maxNodes == 1,
      .giveUp = c.rdzv.joinTimeout};
  if (!f.healthCheck.empty()) health.command = f.healthCheck;
  health.gpus = f.healthGpus;
  return health;
}

LaunchParse parseDlrunArgs(const std::vector<std::string>& args, const HostProbe& host) {
  LaunchParse result;
  LaunchConfig& c = result.config;
  DeclaredFlags f;
  CLI::App app(
      "dlrun: launch N workers per node, as torchrun does, with the environment PyTorch and "
      "TensorFlow read.\nENTRYPOINT: a program, a .py script, a module with -m, or 'train' for "
      "the bundled trainer. status, events and stop ask a running job's control plane (see "
      "dlrun status --help).",
      "dlrun");
  setUsage(app, {"dlrun [OPTIONS] ENTRYPOINT [ARGS...]", "dlrun status|events|stop [OPTIONS]"});
  app.option_defaults()->always_capture_default();
  app.prefix_command();  // everything from the entry point on belongs to the workers
  // torchrun's argparse: a flag given twice takes its last value.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  declareFlags(app, f, c);
  app.set_version_flag("--version", kVersion);

  const std::vector<std::string> expanded = expandAbbreviations(app, args);
  result.exitCode = parseCommandLine(app, expanded, kVersion);
  if (result.exitCode) return result;
  splitEntryPoint(expanded, app.remaining(), f);
  readFlagValues(f, c, host);
  if (f.fanout) resolveHosts(f, c, host);
  resolveBackend(f, c, host);
  crossCheck(f, c);
  c.agent.health = healthOptions(f, c);
  if (!f.noNetworkProbe) {
    c.agent.networkProbe =
        std::chrono::milliseconds(static_cast<int64_t>(f.networkProbeTimeout * 1000));
    checkProbeWithinLease(*c.agent.networkProbe, c);
  }
  c.agent.quarantine.window =
      std::chrono::milliseconds(static_cast<int64_t>(f.quarantineWindow * 1000));
  c.agent.quarantine.coolDown =
      std::chrono::milliseconds(static_cast<int64_t>(f.quarantineFor * 1000));
  c.agent.quarantine.file = quarantineFile(f, host.env);

  if (f.fanout) c.hostLaunch = std::move(f.hostLaunch);
  c.entrypoint = f.rest.front();
  c.agent.command =
      resolveCommand(f.rest.front(), {f.rest.begin() + 1, f.rest.end()},
                     {.module = f.module, .noPython = f.noPython, .runPath = f.runPath}, host);
  if (f.warmStart) c.agent.warmStart = warmStartOf(f, c.agent.command, host);
  if (agents::warm::isPythonInterpreter(c.agent.command.front(), host.pythonExec))
    c.workerPython = c.agent.command.front();
  // What launch() reads last: the liveness port.
  c.healthCheckPort = healthCheckPort(host.env);
  return result;
}

}  // namespace dlrun::launcher
