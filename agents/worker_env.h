// The environment of the workers: a pure function of the world, the round and the agent's own
// environment (ARCHITECTURE.md section 2). No I/O, so tests check every variable.
//
// What every worker of a node shares in a round (the inherited variables, the job's sizes, the
// store, TF_CONFIG's cluster list) is built once per round (NodeEnvironment); each worker adds
// only its own few entries, so a node's start is linear in its workers, not in workers times
// the job's size.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agents/limits.h"
#include "agents/roles.h"
#include "common/environment.h"
#include "rendezvous/world.h"

namespace dlrun::agents {

// --tf-config: whether workers get TF_CONFIG.
enum class TfConfigMode {
  Auto,    // when it fits the kernel's limit for one environment string; else a warning
  Always,  // an error when it cannot fit
  Never,   // dlrun leaves TF_CONFIG alone (an inherited one passes through, as under torchrun)
};

struct RoundSpec {
  std::string role = "default";
  int restartCount = 0;
  // TF_CONFIG's cluster part (tfConfigCluster) when the workers get TF_CONFIG. Without it an
  // inherited TF_CONFIG is removed (it describes another job) unless inheritTfConfig is set.
  std::optional<std::string> tfCluster;
  bool inheritTfConfig = false;
  // Variables of the agent's services for its workers (the progress board, torch's timer
  // pipe, the Python stack hook), set over inherited ones.
  Environment services;
  // With --hang-timeout: each worker's DLRUN_HEARTBEAT_FILE is heartbeatDir/LOCAL_RANK.
  std::optional<std::string> heartbeatDir;
  // --virtual-local-rank: each worker's LOCAL_RANK is 0 and its CUDA_VISIBLE_DEVICES is its own
  // device: entry LOCAL_RANK of the inherited list (the launcher checked it is long enough), or
  // the local rank itself when none is inherited, as torchrun does.
  bool virtualLocalRank = false;
};

// --virtual-local-rank with `workers` on the node: each needs a device of its own, so an
// inherited CUDA_VISIBLE_DEVICES (`visible`, unset: none) must name at least that many. Throws
// ConfigError naming both.
void checkVirtualLocalRank(int workers, const std::optional<std::string>& visible);

// A worker's heartbeat file under RoundSpec::heartbeatDir.
std::string heartbeatFile(const std::string& heartbeatDir, int localRank);

// One round's environments for every worker of this node.
class NodeEnvironment {
 public:
  // O(inherited variables + TF_CONFIG's cluster), once per round.
  NodeEnvironment(const Environment& inherited, const rendezvous::World& world, RoundSpec spec);

  // "KEY=VALUE" entries every worker of the round gets.
  const std::vector<std::string>& shared() const { return shared_; }
  // The worker's own entries: RANK, LOCAL_RANK, TORCHELASTIC_ERROR_FILE, ROLE_RANK (and under
  // --roles ROLE_NAME and ROLE_WORLD_SIZE), TF_CONFIG, DLRUN_HEARTBEAT_FILE (and under
  // --virtual-local-rank CUDA_VISIBLE_DEVICES).
  std::vector<std::string> own(int localRank, const std::string& errorFile) const;
  // The sizes shared() and own() pass to exec, without building own()'s TF_CONFIG.
  ExecSizes sizes(int localRank, const std::string& errorFile) const;
  // Both parts as one map.
  Environment forWorker(int localRank, const std::string& errorFile) const;

 private:
  std::vector<std::string> ownSmall(int localRank, const std::string& errorFile) const;

  // TF_CONFIG's task of a local rank.
  std::pair<std::string_view, int> tfTask(int localRank) const;

  int baseRank_ = 0;
  std::vector<RolePlace> places_;  // by local rank, under --roles
  std::optional<std::string> tfCluster_;
  std::optional<std::string> heartbeatDir_;
  // --virtual-local-rank: the inherited CUDA_VISIBLE_DEVICES split at commas (empty: none was
  // inherited, so each worker's device is its local rank).
  bool virtualLocalRank_ = false;
  std::vector<std::string> devices_;
  std::vector<std::string> shared_;
  ExecSizes sharedSizes_;
};

struct WorkerSpec {
  std::string role = "default";
  int restartCount = 0;
  std::string errorFile;  // TORCHELASTIC_ERROR_FILE for this worker
};

// One worker's environment, TF_CONFIG included: the agent's environment with the worker's
// variables laid over it. Variables a user set for tuning (OMP_NUM_THREADS, the NCCL
// error-handling pair) are kept when already present.
Environment workerEnvironment(const Environment& inherited, const rendezvous::World& world,
                              const WorkerSpec& spec, int localRank);

// TF_CONFIG for TensorFlow's MultiWorkerMirroredStrategy, built from its cluster part (the same
// for every worker of a job, so built once) and the worker's task: its index (RANK) and type
// ("worker"). Under --roles, the cluster lists every role and the task is the worker's place
// (roles.h), for ParameterServerStrategy.
std::string tfConfigCluster(const rendezvous::World& world);
std::string tfConfig(const std::string& cluster, int index, std::string_view type = "worker");
std::string tfConfig(const rendezvous::World& world, int rank);
// The length of tfConfig(cluster, index, type), without building it.
size_t tfConfigLength(const std::string& cluster, int index, std::string_view type = "worker");

// Whether the workers get TF_CONFIG: Never, no; Auto, when the longest "TF_CONFIG=..." (the last
// rank's) fits `maxString`, else no with a warning naming the size and the flag; Always, yes,
// or a ConfigError when it cannot fit.
struct TfConfigChoice {
  bool set = false;
  std::string warning;  // to print once
};
// `longestType`: the longest task type of the job's ("worker" without --roles).
TfConfigChoice chooseTfConfig(TfConfigMode mode, const std::string& cluster, int worldSize,
                              size_t maxString, std::string_view longestType = "worker");

// A torch whose client cannot reach an agent's store (built without libuv, which torch 2.4+'s
// client asks for there; launcher/torch_probe.h): the workers' store is the one rank 0's torch
// serves itself (TORCHELASTIC_USE_AGENT_STORE=False) at rank 0's reserved port, new each round,
// so every attempt's keys start empty as with the agent's key spaces. A no-op without workers'
// endpoints.
void serveStoreAtRankZero(rendezvous::World& world);

// The agent's own environment, read from environ.
Environment currentEnvironment();

// "KEY=VALUE" strings for execve.
std::vector<std::string> toEnvp(const Environment& env);

}  // namespace dlrun::agents
