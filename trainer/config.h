// The trainer's settings: flags, plus where this process sits in the job (from the
// environment dlrun gives every worker).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "trainer/data.h"
#include "trainer/ps_layout.h"

namespace dlrun::trainer {

struct TrainConfig {
  int epochs = 15;
  int batchSize = 64;  // per rank; the global batch is batchSize x world size
  // For the global batch: gradients are averaged over all ranks, so the same learning rate
  // fits any world size at the same global batch. It is not rescaled when the world changes.
  float learningRate = 0.05f;
  bool cosine = true;  // anneal the learning rate to zero over the run (by epoch progress)
  float momentum = 0.9f;
  float weightDecay = 5e-4f;
  std::string model = "mlp";             // or "cnn" (cnn_model.h)
  std::vector<int> hidden = {256, 128};  // the MLP's
  uint64_t seed = 1;
  std::string dataDir = kDefaultDataDir;
  bool synthetic = false;
  std::string device = "auto";     // cpu, cuda, auto
  std::string cpuMath = "auto";    // auto (the AVX2 build where the CPU runs it), baseline
  std::string allreduce = "auto";  // auto (shared memory for a job on one machine), gloo
  std::string checkpointDir;       // empty: no checkpoints
  // --checkpoint-in-memory: checkpoints in the node's memory that dlrun's agent owns
  // (DLRUN_CHECKPOINT_SHM/train), kept through restarts and freed at the job's end
  std::string memoryCheckpointDir;
  std::string metricsFile;  // --metrics-file: JSON lines of the run's numbers (rank 0)
  int checkpointEvery = 0;  // steps between checkpoints (0: at each epoch's end only)
  int64_t maxSteps = -1;    // stop after this many global steps (tests, benchmarks)
  std::string dumpWeights;  // write the final parameters here (raw float32)
  int progressEvery = 100;  // steps between progress lines
  // A testing aid for the resume tests: rank 1 (rank 0 when alone) exits with code 1 right
  // after global step failAtStep (and any checkpoint of it), on attempt 0 only
  // (TORCHELASTIC_RESTART_COUNT=0), so a restarted group runs through. -1: never.
  int64_t failAtStep = -1;
  // A testing aid for the hang tests: the last rank sleeps for ever at the start of global
  // step hangAtStep, before its all-reduce, on attempt 0 only, so its peers wait in the
  // all-reduce. -1: never.
  int64_t hangAtStep = -1;
  bool single = false;                 // run alone, without dlrun
  std::string strategy = "allreduce";  // or "ps": parameter servers (ps_server.h)
  bool psSync = false;  // --ps-sync: the servers wait for every worker's push of a step
};

// Where this process sits, from RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT and TORCHELASTIC_RESTART_COUNT.
struct Placement {
  int rank = 0;
  int worldSize = 1;
  int localRank = 0;       // among the ranks of this node: picks the GPU
  int localWorldSize = 1;  // ranks on this node
  std::string masterAddr;
  uint16_t masterPort = 0;
  int restartCount = 0;
  std::optional<PsPlace> ps;  // --strategy ps: this process's part, from TF_CONFIG
};

struct TrainParse {
  TrainConfig config;
  Placement placement;
  std::optional<int> exitCode;  // --help, --version
};

// Throws ConfigError for bad flags, and when started outside dlrun without --single.
TrainParse parseTrainArgs(const std::vector<std::string>& args);

}  // namespace dlrun::trainer
