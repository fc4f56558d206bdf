// The per-node agent: starts this node's workers for each rendezvous round, supervises them,
// forwards signals, stops them (SIGTERM, a grace period, SIGKILL to each process group), and
// follows the rendezvous when a round ends: a new round after a failure or a change of nodes,
// the root-cause report and its exit code when the rendezvous says a failure is final.
//
// Threads: run() drives everything on the calling thread through the agent's io_context
// (signals, reaping, output, timers). One more thread runs the rendezvous's blocking calls,
// next() and awaitEnd(), and posts what they return to that io_context; every exception it
// meets becomes an error posted there too. run() joins it before returning.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agents/agent_metrics.h"
#include "agents/control_publisher.h"
#include "agents/hang_watch.h"
#include "agents/health_check.h"
#include "agents/limits.h"
#include "agents/quarantine.h"
#include "agents/warm_start.h"
#include "agents/worker.h"
#include "agents/worker_env.h"
#include "rendezvous/rendezvous.h"

namespace boost::asio {
class io_context;
}

namespace dlrun::agents {

// A Streams value for every local rank, or one for all (torchrun's "3" or "0:1,1:2").
struct StreamsByRank {
  Streams all = Streams::None;
  std::map<int, Streams> byRank;
  Streams forRank(int localRank) const;
};

// How workers' lines reach the console. Dlrun: every line of a shown stream with the prefix, and
// ended with a newline. Torchrun (--console-format=torchrun): torchrun's bytes, the prefix only
// on teed streams, nothing added to a last line the worker left unterminated.
enum class ConsoleFormat { Dlrun, Torchrun };

// Each attempt's workers get a key space of their own on the workers' store (store/wire.h's
// SPACE_OPEN, ARCHITECTURE.md section 3), so a restarted worker never reads a key of a dead
// attempt (torch 2.x workers would take its addresses for the living ones').
struct AttemptSpaces {
  // Called on the rendezvous thread with each round's world (storePort: the store's own): the
  // port of the round's space; nullopt when the round is over already (a later round's space
  // is open). Throws Error when the store cannot be reached.
  std::function<std::optional<uint16_t>(const rendezvous::World&)> open;
  // Called once as the agent exits, when the job is over: the space goes with the last of its
  // connections (another node's workers may still be stopping). Unset where the store goes
  // with an agent anyway.
  std::function<void(const rendezvous::World&)> close;
};
// The spaces of a dlrun store (dlrund's, or an agent's), over TCP.
AttemptSpaces attemptSpacesOverTcp();

struct AgentOptions {
  std::vector<std::string> command;  // what every worker runs
  int nprocPerNode = 1;
  std::string role = "default";
  std::vector<RoleSpec> roles;  // --roles (roles.h); empty: every worker has `role`
  std::chrono::milliseconds stopTimeout{30'000};
  // --no-restart-exit-code: a worker exiting with this code ends the job on every node at once,
  // with this code, whatever restarts are left (0: off). The program's way to say "do not
  // restart me" (a bad configuration, a finished sweep).
  int noRestartExitCode = 0;
  // Times the scheduler started this job again (SLURM_RESTART_COUNT; unset outside Slurm): with
  // --log-dir, the newest run directory of this run id that this group rank's node made there
  // goes on, its attempts numbered on from the last. Under Slurm each run directory says which
  // group rank made it (a file `group_rank`; torchrun's tree elsewhere).
  std::optional<int> requeues;
  // --signals-to-handle, in the order given: the signals that stop the job. Unset: SIGTERM,
  // SIGINT, SIGHUP and SIGQUIT, as torchrun. One of those four left out is ignored (the job goes
  // on, and no worker is left behind by a dlrun the signal killed); SIGUSR1 and SIGUSR2 left out
  // are forwarded to the workers and change nothing else.
  std::optional<std::vector<int>> signalsToHandle;
  // --virtual-local-rank: every worker's LOCAL_RANK is 0 and its CUDA_VISIBLE_DEVICES names its
  // own device (worker_env.h).
  bool virtualLocalRank = false;
  // --numa-binding: each local rank's CPUs (numa_binding.h); empty: no binding
  std::vector<std::vector<int>> cpuBinding;
  std::optional<std::string> logDir;  // else a temporary directory for error files
  // --checkpoint-dir: dlrun.checkpoint's files (DLRUN_CHECKPOINT_DIR), and where the agent
  // writes the copies its workers left in memory as it ends (checkpoint_flush.h)
  std::optional<std::string> checkpointDir;
  // --checkpoint-write-every: how often the workers ask for a step to be written there while
  // the job runs (DLRUN_CHECKPOINT_WRITE_EVERY; 0: only as the agent ends)
  std::chrono::milliseconds checkpointWriteEvery{60'000};
  StreamsByRank redirects;  // streams sent only to files
  StreamsByRank tee;        // streams copied to files
  std::optional<std::set<int>> localRanksFilter;
  ConsoleFormat consoleFormat = ConsoleFormat::Dlrun;
  std::string logLinePrefixTemplate = "[${rank}]:";
  // --console-dedup: identical lines of the node's ranks shown once (console_dedup.h), within
  // this window; unset: never. `consoleDedupFrom`: only where the node runs this many workers.
  std::optional<std::chrono::milliseconds> consoleDedup;
  int consoleDedupFrom = 8;
  // --duplicate-stdout-filters/--duplicate-stderr-filters: console lines holding any of these
  // go to the attempt's filtered_stdout.log/filtered_stderr.log as well; empty: no such file
  std::vector<std::string> duplicateStdoutFilters, duplicateStderrFilters;
  std::string nodeName;  // "host (address)" in a multi-node job's failure reports
  TfConfigMode tfConfig = TfConfigMode::Auto;
  bool servesStore = false;  // this process serves the store its workers connect to
  std::optional<AttemptSpaces> attemptSpaces;  // unset: workers share the store's own keys
  // --store-proxy: the workers reach the store through this agent's proxy on loopback
  // (store/store_proxy.h), which forwards their requests over a few connections of its own
  bool storeProxy = false;
  // --recovery=in-process: a failed worker that announced dlrun.recovery's loop starts again
  // alone, joining the survivors' next generation (agents/recovery.h)
  bool inProcessRecovery = false;
  // --ready-spares: while this node waits as a spare, its workers are forked from the zygote
  // and run until they make dlrun.recovery's loop, where they wait to take a lost node's ranks
  // (Zygote::reserve); a round that starts them otherwise stops them first.
  bool readySpares = false;
  // --ready-replacements: while a round runs, a worker for each local rank is forked from the
  // zygote ahead of a failure and waits in dlrun.recovery's loop; a failed worker's in-process
  // replacement takes its place (agent_spares.cpp).
  bool readyReplacements = false;
  // Set where the workers' torch cannot be a client of this store (agents/torch_probe.h): rank
  // 0's torch serves theirs (serveStoreAtRankZero, worker_env.h), and the proxy is not used.
  // The text says so, once, as the workers first start.
  std::optional<std::string> rankZeroStore;
  std::optional<HangOptions> hang;        // --hang-timeout: watch the workers' progress
  std::optional<ControlOptions> control;  // publish to the control plane, follow its commands
  std::optional<MetricsOptions> metrics;  // --metrics-port: Prometheus metrics and the page
  // etcd: another node's agent serves the workers' store; a connection to it that breaks says
  // that node is gone, long before its lease lapses.
  bool watchStoreHost = false;
  // torch.distributed.launch's argument: "--local-rank" or "--local_rank" appended to every
  // worker's arguments as FLAG=LOCAL_RANK; empty: none (the environment says it).
  std::string localRankFlag;
  // A one-command launch (--control-stdin): stdin is the launcher's ssh connection. A line
  // naming a signal ("SIGINT") acts as that signal reaching this agent; its end (the connection
  // died) acts as SIGHUP. The workers get /dev/null as stdin.
  bool controlStdin = false;
  // --crash-loop-attempts: failed attempts in a row without progress that end the job with
  // --no-restart-exit-code's code, 93 unless set (crash_loop.h); 0: never
  int crashLoopAttempts = 0;
  // --quarantine-after and its window and cool-down: a node whose workers keep failing sits out
  QuarantineOptions quarantine;
  // The checks before every round (--health-check, --health-min-free); unset: none
  std::optional<HealthOptions> health;
  // The network probe's bound once a round of several nodes forms (--network-probe-timeout);
  // unset: no probe (--no-network-probe)
  std::optional<std::chrono::milliseconds> networkProbe;
  // --warm-start: workers are forked from a Python interpreter that started with the agent and
  // imported --preload's modules (warm_start.h)
  std::optional<WarmStartOptions> warmStart;
};

// The descriptors this node's workers need with these options (pure; `inUse`: those open now).
DescriptorNeeds descriptorNeeds(const AgentOptions& options, int inUse);
// Raises the soft descriptor limit to the hard one; throws ConfigError, one line naming the
// limit, when the node's workers cannot fit under it. Agent::run() calls it first; a launcher
// calls it before it joins a rendezvous, so such a node never holds the others up.
void checkDescriptors(const AgentOptions& options);

namespace detail {
class AgentImpl;
}

class Agent {
 public:
  Agent(AgentOptions options, rendezvous::Rendezvous& rendezvous);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs rounds until the job finishes, a failure is final, or a terminating signal arrives.
  // Returns 0, the root-cause worker's code (128 + signal for a signal), 128 + the signal that
  // stopped dlrun, 127 when a worker cannot be executed, or 2 (bad configuration: too few
  // descriptors, --tf-config=always that cannot fit) or 1 when the rendezvous fails. Every
  // worker's exec is checked against the kernel's limits before the first one starts.
  int run();

 private:
  std::unique_ptr<detail::AgentImpl> impl_;
};

}  // namespace dlrun::agents
