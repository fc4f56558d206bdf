// The environment of one worker: a pure function of the world, the worker spec and the
// agent's own environment (ARCHITECTURE.md section 2). No I/O, so tests check every variable.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "rendezvous/world.h"

namespace dlrun::agents {

using Environment = std::map<std::string, std::string>;

struct WorkerSpec {
  std::string role = "default";
  int maxRestarts = 0;
  int restartCount = 0;
  std::string errorFile;  // TORCHELASTIC_ERROR_FILE for this worker
};

// The agent's environment with the worker's variables laid over it. Variables a user set
// for tuning (OMP_NUM_THREADS, the NCCL error-handling pair) are kept when already present.
Environment workerEnvironment(const Environment& inherited, const rendezvous::World& world,
                              const WorkerSpec& spec, int localRank);

// TF_CONFIG for TensorFlow's MultiWorkerMirroredStrategy.
std::string tfConfig(const rendezvous::World& world, int rank);

// The agent's own environment, read from environ.
Environment currentEnvironment();

// "KEY=VALUE" strings for execve.
std::vector<std::string> toEnvp(const Environment& env);

}  // namespace dlrun::agents
