// Where the math of a training step runs, so the training loop does not care: the CPU engine
// (the Eigen model, gradients summed by a Collective) or the CUDA engine (cuBLAS and a few kernels,
// gradients summed by NCCL). Both start from the same weights for a seed and apply the same
// update, so a run's result does not depend on the engine beyond float rounding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/model.h"

namespace dlrun::trainer {

struct StepResult {
  float loss = 0;     // the mean loss over the global batch
  bool stop = false;  // some rank voted to stop
};

class Engine {
 public:
  virtual ~Engine() = default;
  // One data-parallel step on this rank's batch (x: batch x inputs, row-major): the mean
  // gradient, its sum over ranks together with the loss and the stop votes, then the SGD update
  // with the mean over ranks at `learningRate`. Every rank gets the same result.
  virtual StepResult step(const float* x, const uint8_t* labels, int batch, float learningRate,
                          bool stopVote) = 0;
  // How many of the batch's examples the model classifies correctly (this rank's alone).
  virtual int countCorrect(const float* x, const uint8_t* labels, int batch) = 0;
  // Host copies of the parameters and the momentum, and their replacement (checkpoints).
  virtual std::vector<float> params() const = 0;
  virtual std::vector<float> velocity() const = 0;
  virtual void load(const std::vector<float>& params, const std::vector<float>& velocity) = 0;
  virtual const char* device() const = 0;  // "cpu" or "cuda"
};

struct EngineOptions {
  ModelSpec model;
  uint64_t seed = 1;  // of the initial weights
  SgdOptions sgd;
  std::string cpuMath = "auto";  // the CPU engine's: auto or baseline (math_dispatch.h)
};

}  // namespace dlrun::trainer
