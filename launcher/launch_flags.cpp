#include "launcher/launch_flags.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <string>
#include <vector>

#include "common/cli.h"
#include "common/error.h"
#include "control/state/stragglers.h"

namespace dlrun::launcher {
namespace {

// Ranges with bounds that read well in CLI11's "not in range" message.
const CLI::Range kCount(0, 1'000'000);
const CLI::Range kSeconds(0.0, 86'400.0);

// A number as people write it: 0.7, 30 (not 0.700000, 30.000000).
std::string shortest(double value) {
  char text[32];
  return std::string(text, std::to_chars(text, text + sizeof text, value).ptr);
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
CLI::Option* addOption(CLI::App& app, const std::string& dashed, T& target, const std::string& help,
                       const std::string& shortName = "") {
  auto s = spellings(dashed, shortName);
  return app.add_option(s.names, target, help)->envname(s.env);
}

CLI::Option* addFlag(CLI::App& app, const std::string& dashed, bool& target,
                     const std::string& help, const std::string& shortName = "") {
  auto s = spellings(dashed, shortName);
  return app.add_flag(s.names, target, help)->envname(s.env);
}

// A flag of the launcher alone (--hostfile, --ssh-port, ...): both spellings, but no PET_
// variable, which would reach the agents with the environment and make each a launcher.
template <typename T>
CLI::Option* addLauncherOption(CLI::App& app, const std::string& dashed, T& target,
                               const std::string& help) {
  return app.add_option(spellings(dashed, "").names, target, help);
}

// Declaring, 1 of 3: the job's shape, its rendezvous, its workers and their lifetime.
void declareJobFlags(CLI::App& app, DeclaredFlags& f, LaunchConfig& c) {
  f.nnodesOption =
      addOption(app, "nnodes", f.nnodes, "Number of nodes, N or MIN:MAX for an elastic job");
  f.nprocOption =
      addOption(app, "nproc-per-node", f.nproc, "Workers per node: N, cpu, gpu or auto");
  addOption(app, "node-rank", f.nodeRank,
            "This node's rank for the static backend; a group-rank hint for c10d")
      ->check(kCount);
  f.backendOption = addOption(
      app, "rdzv-backend", f.backend,
      "Rendezvous backend: c10d (the default) or static (the default with --master-addr or "
      "--master-port and no --rdzv-endpoint); slurm: c10d set up from the Slurm allocation, "
      "which must exist; etcd (or etcd-v3): the elastic rendezvous on an etcd v3 cluster");
  f.endpointOption =
      addOption(app, "rdzv-endpoint", c.rdzvEndpoint.text,
                "HOST[:PORT] of the rendezvous store; with etcd, HOST[:PORT],... (port 2379)");
  f.rdzvIdOption = addOption(app, "rdzv-id", c.rdzvId, "Job id shared by every node of one job");
  addFlag(app, "no-slurm", f.noSlurm,
          "Ignore the Slurm allocation dlrun runs in (as DLRUN_SLURM=0 does)");
  addOption(app, "rdzv-conf", f.rdzvConf, "Backend settings as key=value,key2=value2");
  addFlag(app, "standalone", c.standalone,
          "One node with its own store on a free port; no rendezvous flags needed");
  addOption(app, "max-restarts", c.restarts.maxRestarts,
            "Restarts of the worker group after a failure")
      ->check(kCount);
  addOption(app, "no-restart-exit-code", c.agent.noRestartExitCode,
            "A worker exiting with this code ends the job on every node at once with that code, "
            "without a restart (0, the default: off; NVIDIA's launchers use 93)")
      ->check(CLI::Range(0, 255));
  addOption(app, "recovery", f.recovery,
            "After a worker fails: restart (the whole worker group) or in-process (only the "
            "failed worker starts again; the others keep their processes and re-form the group "
            "with it through dlrun.recovery, else the group restarts)")
      ->check(oneOf({"restart", "in-process"}));
  addOption(app, "monitor-interval", f.monitorInterval,
            "Accepted for torchrun compatibility: dlrun notices worker exits at once")
      ->check(kSeconds);
  f.stopTimeoutOption = addOption(app, "stop-timeout", f.stopTimeout,
                                  "Seconds between SIGTERM and SIGKILL when workers are "
                                  "stopped (else TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30)")
                            ->check(kSeconds);
  f.shutdownTimeoutOption =
      addOption(app, "shutdown-timeout", f.shutdownTimeout, "torchrun's name of --stop-timeout")
          ->check(kSeconds);
  addOption(app, "start-method", f.startMethod,
            "Accepted for torchrun compatibility (spawn, fork or forkserver): every worker is a "
            "new process running the entry point, as under torchrun for a script or program")
      ->check(oneOf({"spawn", "fork", "forkserver"}));
  addOption(app, "event-log-handler", f.eventLogHandler,
            "Accepted for torchrun compatibility (null, console or dynamic_rendezvous): dlrun's "
            "events go to the control plane (dlrun events)")
      ->check(oneOf({"null", "console", "dynamic_rendezvous"}, " (plug-ins are torch's alone)"));
  addOption(app, "logs-specs", f.logsSpecs,
            "Accepted for torchrun compatibility (default): the log tree is torchrun's default")
      ->check(oneOf({"default"}, ": dlrun writes torchrun's default log tree only"));
  f.signalsOption = addOption(
      app, "signals-to-handle", f.signalsToHandle,
      "Signals that stop the job: forwarded to every worker, which then get --stop-timeout "
      "seconds before SIGKILL. Of the default four, one left out is ignored; SIGUSR1 and "
      "SIGUSR2 left out are only forwarded");
  f.roleOption = addOption(app, "role", c.agent.role, "Role name of these workers (ROLE_NAME)");
  f.rolesOption = addOption(
      app, "roles", f.roles,
      "Several roles on this node, NAME:COUNT[:service][:alone],... in local-rank order, e.g. "
      "ps:1:service,worker:2:alone; sets --nproc-per-node. service: does not end the job, "
      "stopped when the others end; alone: a failed worker restarts alone");
  addFlag(app, "module", f.module, "Run the entry point as a Python module (python -m)", "-m");
  addFlag(app, "no-python", f.noPython, "Execute the entry point directly, without Python");
  addFlag(app, "run-path", f.runPath, "Run a Python entry point as a script (the default)");
  addFlag(app, "warm-start", f.warmStart,
          "Start and restart the workers by forking a Python interpreter that started with "
          "dlrun (and imported --preload's modules) instead of a new one; a Python script or "
          "module only (see docs/guides/warm-start.md)");
  addFlag(app, "ready-spares", c.agent.readySpares,
          "With --recovery=in-process and --warm-start: a spare node starts its workers ahead; "
          "they run the program until it makes dlrun.recovery.Loop and wait there to take a "
          "lost node's ranks (see docs/guides/in-process-recovery.md)");
  addFlag(app, "ready-replacements", c.agent.readyReplacements,
          "With --recovery=in-process and --warm-start: each node keeps a worker started ahead "
          "for each local rank, waiting in dlrun.recovery.Loop to replace one that fails (one "
          "more process, and its memory, for each worker; see "
          "docs/guides/in-process-recovery.md)");
  f.preloadOption = addOption(app, "preload", f.preload,
                              "With --warm-start: modules imported once, before the workers are "
                              "forked, as MOD[,MOD...] (e.g. torch,numpy)");
  addOption(app, "numa-binding", f.numaBinding,
            "Pin each worker to CPUs near its GPU (on a node without GPUs: its share of the "
            "NUMA nodes): node, socket, exclusive or core-complex, as torchrun");
  addFlag(app, "virtual-local-rank", c.agent.virtualLocalRank,
          "Every worker sees only its own GPU, as device 0: LOCAL_RANK=0 and CUDA_VISIBLE_DEVICES "
          "set to the device of its local rank (the inherited list's entry, else the number)");
}

// Declaring, with the job's flags: a node's checks before a round, and crash loops.
void declareCheckFlags(CLI::App& app, DeclaredFlags& f, LaunchConfig& c) {
  addOption(app, "health-check", f.healthCheck,
            "A command run (by /bin/sh) on each node before every round: exit 0 is healthy; "
            "otherwise the node sits the round out, its last line of output the reason, and is "
            "checked again until it passes");
  addOption(app, "health-check-timeout", f.healthCheckTimeout,
            "Seconds --health-check may take; one that takes longer is killed and fails")
      ->check(CLI::Range(0.001, 86'400.0));
  addOption(app, "health-min-free", f.healthMinFree,
            "GiB that must be free on disk where the logs and checkpoints go, and in memory, "
            "for a node to join a round (0, the default: not checked)")
      ->check(CLI::Range(0.0, 1e9));
  addOption(app, "health-gpus", f.healthGpus,
            "GPUs each node must show, every one answering NVML, for it to join a round (0, the "
            "default: not counted; a GPU that does not answer fails the node all the same)")
      ->check(CLI::Range(0, 1024));
  addOption(app, "network-probe-timeout", f.networkProbeTimeout,
            "Seconds the network probe between a round's nodes may take (each node's link to "
            "the next measured, the slowest named): before the first round's workers start, "
            "beside a later round's; below the rendezvous lease less a heartbeat")
      ->check(CLI::Range(0.001, 3600.0));
  addFlag(app, "no-network-probe", f.noNetworkProbe, "No network probe between a round's nodes");
  addOption(app, "quarantine-after", c.agent.quarantine.after,
            "Failures of a node's workers within --quarantine-window that put the node out of "
            "the rounds for --quarantine-for seconds, so restarts land elsewhere (0: never)")
      ->check(kCount);
  addOption(app, "quarantine-window", f.quarantineWindow,
            "Seconds within which --quarantine-after failures put a node out")
      ->check(kSeconds);
  addOption(app, "quarantine-for", f.quarantineFor,
            "Seconds a node put out by --quarantine-after sits out before it is let in again")
      ->check(kSeconds);
  addOption(app, "quarantine-file", f.quarantineFile,
            "File where a node put out by --quarantine-after appends its name, for a requeued "
            "batch script to exclude (under Slurm, $SLURM_SUBMIT_DIR/dlrun-exclude-$SLURM_JOB_ID "
            "unless set)");
  addOption(app, "crash-loop-attempts", c.agent.crashLoopAttempts,
            "Failed attempts in a row without the job's step advancing (as dlrun.progress "
            "reports it; without reports, attempts that lived under 60 s) that end the job with "
            "--no-restart-exit-code's code, 93 unless set, instead of a restart (0: off)")
      ->check(kCount);
}

// Declaring, 2 of 3: the workers' output, the watch for hangs, the control plane and metrics.
void declareOutputFlags(CLI::App& app, DeclaredFlags& f, LaunchConfig& c) {
  addOption(app, "log-dir", f.logDir, "Directory for per-rank logs and error files");
  addOption(app, "checkpoint-dir", f.checkpointDir,
            "Directory for dlrun.checkpoint's checkpoints: the copies held in memory are "
            "written there while the job runs and as dlrun ends, and a job launched again "
            "loads them from there");
  addOption(app, "checkpoint-write-every", f.checkpointWriteEvery,
            "With --checkpoint-dir: seconds between the steps written there while the job runs "
            "(the same step on every rank; 0: only as dlrun ends)")
      ->check(kSeconds);
  addOption(app, "redirects", f.redirects,
            "Streams sent only to the log files: 0 none, 1 out, 2 err, 3 both, or 0:1,1:2", "-r");
  addOption(app, "tee", f.tee, "Streams copied to the log files (same values as --redirects)",
            "-t");
  addOption(app, "local-ranks-filter", f.ranksFilter, "Console shows only these local ranks");
  f.prefixOption = addOption(app, "log-line-prefix-template", c.agent.logLinePrefixTemplate,
                             "Prefix of each console line; ${rank}, ${local_rank}, "
                             "${role_name} (else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)");
  addOption(app, "console-format", f.consoleFormat,
            "dlrun: every worker line on the console prefixed (default [${rank}]:) and ended "
            "with a newline; torchrun: torchrun's bytes, only --tee's streams prefixed (default "
            "[${role_name}${local_rank}]:), the others as the workers write them")
      ->check(oneOf({"dlrun", "torchrun"}));
  addOption(app, "console-dedup", f.consoleDedup,
            "Identical lines of a node's ranks within --console-dedup-window shown once, with "
            "their ranks ([0-7]: ...): auto (from 8 workers on a node), on, off")
      ->check(oneOf({"auto", "on", "off"}));
  addOption(app, "console-dedup-window", f.consoleDedupWindow,
            "Seconds a line waits for the same line of other ranks (0.1); none waits longer")
      ->check(CLI::Range(0.001, 10.0));
  f.stdoutFiltersOption = addOption(
      app, "duplicate-stdout-filters", f.stdoutFilters,
      "Console stdout lines holding any of these (a,b; ',,' a comma) also go to the attempt's "
      "filtered_stdout.log");
  f.stderrFiltersOption = addOption(app, "duplicate-stderr-filters", f.stderrFilters,
                                    "The same for stderr, into filtered_stderr.log");
  addOption(app, "tf-config", f.tfConfig,
            "TF_CONFIG for the workers: auto (when it fits the kernel's limit for one "
            "environment variable, else a warning), always (an error when it cannot fit) or "
            "never");
  addOption(app, "token-file", f.tokenFile,
            "The job's token (else DLRUN_TOKEN): its control plane then answers only calls "
            "that carry it, and takes stops and signals from any host");
  addFlag(app, "no-control-plane", f.noControlPlane,
          "Publish nothing to the control plane (dlrun status/events/stop) and follow none of "
          "its commands");
  // The defaults are StragglerRule's own, shown from it so that the help cannot drift.
  const control::StragglerRule defaults;
  addOption(app, "straggler-fraction", c.stragglers.fraction,
            "A rank stepping slower than this fraction of the ranks' median pace for "
            "--straggler-window seconds is named a straggler: an event, a line, a metric, marked "
            "on the job's page and in dlrun top (0: off; default " +
                shortest(defaults.fraction) + ")")
      ->check(CLI::Range(0.0, 1.0));
  addOption(app, "straggler-window", c.stragglers.window,
            "Seconds a rank stays below --straggler-fraction before it is named (default " +
                shortest(defaults.window) + ")")
      ->check(CLI::Range(1.0, 86400.0));
  addOption(app, "metrics-port", f.metricsPort,
            "Serve Prometheus metrics (/metrics) and the job's live page (/) over HTTP on this "
            "port, 0 for a free one; the address is printed (default: off)")
      ->check(CLI::Range(0, 65535));
  addOption(app, "metrics-host", f.metricsHost,
            "Numeric address --metrics-port listens on (\"::\" or 0.0.0.0: every interface; "
            "default: the address this node uses for the job)");
  f.hangTimeoutOption =
      addOption(app, "hang-timeout", f.hangTimeout,
                "Seconds without progress after which a worker that reported progress before "
                "is hung: stacks of every worker, a summary naming the suspect, then "
                "--hang-action (0, the default: off)")
          ->check(kSeconds);
  f.hangActionOption = addOption(
      app, "hang-action", f.hangAction,
      "On a hang: report (stacks and summary, keep waiting), restart (also restart the worker "
      "group, counted against --max-restarts) or exit (end the job)");
}

// Declaring, 3 of 3: addresses, --hostfile's fan-out and torch.distributed.launch's flags.
void declareHostFlags(CLI::App& app, DeclaredFlags& f, LaunchConfig& c) {
  addOption(app, "local-addr", f.localAddr, "Address of this node as other nodes reach it");
  addOption(app, "store-allow", f.storeAllow,
            "Only these addresses and CIDR networks (10.0.0.0/8,fd00::/8), and loopback, may "
            "connect to a store this dlrun serves; others are closed unread, counted and logged "
            "once per address. The list must cover every node of the job, this one included "
            "(default: anyone)");
  addOption(app, "store-proxy", f.storeProxy,
            "on: this node's workers reach the job's store through dlrun on loopback "
            "(MASTER_ADDR=127.0.0.1), which carries their requests over a few connections and "
            "makes a barrier one request per node; off: each worker straight to the store; "
            "auto: on from " +
                std::to_string(kStoreProxyAutoWorkers) + " workers on a node")
      ->check(oneOf({"auto", "on", "off"}));
  addOption(app, "worker-store", f.workerStore,
            "Where torch workers meet: agent (dlrun's store: MASTER_PORT is the attempt's space "
            "on it), rank0 (a store rank 0's torch serves, TORCHELASTIC_USE_AGENT_STORE=False) or "
            "auto (agent, unless the workers' Python has a torch that cannot be its client: one "
            "built without libuv, as Debian 13's)")
      ->check(oneOf({"auto", "agent", "rank0"}));
  f.masterAddrOption =
      addOption(app, "master-addr", c.masterAddr, "Store address for the static backend");
  f.masterPortOption =
      addOption(app, "master-port", f.masterPort, "Store port for the static backend")
          ->check(CLI::Range(0, 65535));
  addLauncherOption(app, "hostfile", f.hostfile,
                    "Start one agent per host over ssh, hosts from FILE ('host slots=N' a line; "
                    "slots: its workers unless --nproc-per-node says)");
  addLauncherOption(app, "hosts", f.hostList, "As --hostfile, the hosts given as a:4,b:4");
  addLauncherOption(app, "ssh-command", f.sshCommand,
                    "The ssh client of --hostfile and its options (split at spaces)");
  addLauncherOption(app, "ssh-port", f.sshPort, "The port of the hosts' ssh servers")
      ->check(CLI::Range(1, 65535));
  addLauncherOption(app, "export", f.hostLaunch.exports,
                    "Also give the agents this variable (VAR, or VAR=VALUE); repeatable")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);  // each one counts
  app.add_flag(spellings("export-all", "").names, f.hostLaunch.exportAll,
               "Give the agents every variable of this environment but this session's own");
  app.add_flag("--control-stdin", c.agent.controlStdin,
               "Follow the signals a --hostfile launcher writes on stdin; stop when it closes")
      ->group("");  // the launcher's own business, not the user's
  addFlag(app, "use-local-rank-arg", f.localRankArg,
          "Append --local-rank=LOCAL_RANK to every worker's arguments, as "
          "torch.distributed.launch does");
  app.add_flag(spellings("no-use-env", "").names, f.localRankArg,
               "torch.distributed.launch's spelling of --use-local-rank-arg");
  app.add_flag(spellings("use-env", "").names, f.useEnv,
               "Accepted for torch.distributed.launch scripts: LOCAL_RANK is always in the "
               "environment");
  addOption(app, "local-rank-arg-style", f.localRankStyle,
            "--use-local-rank-arg's spelling: dash (--local-rank, PyTorch 2.0 on) or underscore "
            "(--local_rank, before)")
      ->check(oneOf({"dash", "underscore"}));
}

// The option `arg` names ("--name", "--name=value", "-x"), with a long name's unique prefix
// written out in full in `arg`; nullptr for a name no option has (CLI11 then says so).
const CLI::Option* optionOf(const CLI::App& app, std::string& arg) {
  const bool isLong = arg.starts_with("--");
  const size_t begin = isLong ? 2 : 1;
  const size_t equals = arg.find('=');
  const std::string name =
      arg.substr(begin, equals == std::string::npos ? std::string::npos : equals - begin);
  std::vector<const CLI::Option*> found;
  for (const CLI::Option* option : app.get_options()) {
    if (isLong ? option->check_lname(name) : option->check_sname(name)) return option;
    if (!isLong) continue;
    for (const std::string& longName : option->get_lnames())
      if (longName.starts_with(name) && (found.empty() || found.back() != option))
        found.push_back(option);
  }
  if (found.size() > 1) {
    std::string names;
    for (const CLI::Option* option : found)
      names += (names.empty() ? "--" : ", --") + option->get_lnames().front();
    throw ConfigError("ambiguous flag --" + name + ": it could be " + names);
  }
  if (found.empty() || name.empty()) return nullptr;
  for (const std::string& longName : found.front()->get_lnames()) {
    if (!longName.starts_with(name)) continue;
    arg = "--" + longName + (equals == std::string::npos ? "" : arg.substr(equals));
    break;
  }
  return found.front();
}

}  // namespace

std::vector<std::string> expandAbbreviations(const CLI::App& app,
                                             const std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  size_t at = 0;
  // Up to the entry point, or the "--" before it: what follows is the workers'.
  for (; at < args.size() && args[at] != "--" && args[at].size() > 1 && args[at][0] == '-'; ++at) {
    out.push_back(args[at]);
    const CLI::Option* option = optionOf(app, out.back());
    // A value in the next argument ("--nnodes 2", "-r 3") is no flag to expand.
    const bool valueNext = out.back().find('=') == std::string::npos &&
                           (out.back().starts_with("--") || out.back().size() == 2);
    if (option != nullptr && option->get_expected_min() > 0 && valueNext && at + 1 < args.size())
      out.push_back(args[++at]);
  }
  out.insert(out.end(), args.begin() + static_cast<ptrdiff_t>(at), args.end());
  return out;
}

void declareFlags(CLI::App& app, DeclaredFlags& f, LaunchConfig& c) {
  declareJobFlags(app, f, c);
  declareCheckFlags(app, f, c);
  declareOutputFlags(app, f, c);
  declareHostFlags(app, f, c);
}

}  // namespace dlrun::launcher
