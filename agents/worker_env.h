// The environment of the workers: a pure function of the world, the round and the agent's own
// environment (ARCHITECTURE.md section 2). No I/O, so tests check every variable.
//
// What every worker of a node shares in a round (the inherited variables, the job's sizes, the
// store, TF_CONFIG's cluster list) is built once per round (NodeEnvironment); each worker adds
// only its own few entries, so a node's start is linear in its workers, not in workers times
// the job's size.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agents/limits.h"
#include "rendezvous/world.h"

namespace dlrun::agents {

using Environment = std::map<std::string, std::string>;

// --tf-config: whether workers get TF_CONFIG.
enum class TfConfigMode {
  Auto,    // when it fits the kernel's limit for one environment string; else a warning
  Always,  // an error when it cannot fit
  Never,   // dlrun leaves TF_CONFIG alone (an inherited one passes through, as under torchrun)
};

struct RoundSpec {
  std::string role = "default";
  int maxRestarts = 0;
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
};

// A worker's heartbeat file under RoundSpec::heartbeatDir.
std::string heartbeatFile(const std::string& heartbeatDir, int localRank);

// One round's environments for every worker of this node.
class NodeEnvironment {
 public:
  // O(inherited variables + TF_CONFIG's cluster), once per round.
  NodeEnvironment(const Environment& inherited, const rendezvous::World& world, RoundSpec spec);

  // "KEY=VALUE" entries every worker of the round gets.
  const std::vector<std::string>& shared() const { return shared_; }
  // The worker's own entries: RANK, LOCAL_RANK, ROLE_RANK, TORCHELASTIC_ERROR_FILE, TF_CONFIG,
  // DLRUN_HEARTBEAT_FILE.
  std::vector<std::string> own(int localRank, const std::string& errorFile) const;
  // The sizes shared() and own() pass to exec, without building own()'s TF_CONFIG.
  ExecSizes sizes(int localRank, const std::string& errorFile) const;
  // Both parts as one map.
  Environment forWorker(int localRank, const std::string& errorFile) const;

 private:
  std::vector<std::string> ownSmall(int localRank, const std::string& errorFile) const;

  int baseRank_ = 0;
  std::optional<std::string> tfCluster_;
  std::optional<std::string> heartbeatDir_;
  std::vector<std::string> shared_;
  ExecSizes sharedSizes_;
};

struct WorkerSpec {
  std::string role = "default";
  int maxRestarts = 0;
  int restartCount = 0;
  std::string errorFile;  // TORCHELASTIC_ERROR_FILE for this worker
};

// One worker's environment, TF_CONFIG included: the agent's environment with the worker's
// variables laid over it. Variables a user set for tuning (OMP_NUM_THREADS, the NCCL
// error-handling pair) are kept when already present.
Environment workerEnvironment(const Environment& inherited, const rendezvous::World& world,
                              const WorkerSpec& spec, int localRank);

// TF_CONFIG for TensorFlow's MultiWorkerMirroredStrategy, built from its cluster part (the same
// for every worker of a job, so built once) and the worker's rank.
std::string tfConfigCluster(const rendezvous::World& world);
std::string tfConfig(const std::string& cluster, int rank);
std::string tfConfig(const rendezvous::World& world, int rank);
// The length of tfConfig(cluster, rank), without building it.
size_t tfConfigLength(const std::string& cluster, int rank);

// Whether the workers get TF_CONFIG: Never, no; Auto, when the longest "TF_CONFIG=..." (the last
// rank's) fits `maxString`, else no with a warning naming the size and the flag; Always, yes,
// or a ConfigError when it cannot fit.
struct TfConfigChoice {
  bool set = false;
  std::string warning;  // to print once
};
TfConfigChoice chooseTfConfig(TfConfigMode mode, const std::string& cluster, int worldSize,
                              size_t maxString);

// The agent's own environment, read from environ.
Environment currentEnvironment();

// "KEY=VALUE" strings for execve.
std::vector<std::string> toEnvp(const Environment& env);

}  // namespace dlrun::agents
