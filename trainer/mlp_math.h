// The CPU engine's hot math (the Eigen forward and backward passes, the SGD update) on raw
// buffers, behind a table of functions, so one program carries it twice: built for any x86-64
// CPU into dlrun-train, and built for AVX2 and FMA (2.5 to 3x faster) into the module
// dlrun-train-avx2.so beside it, opened at start where the CPU has both (math_dispatch.h).
// Separate binaries keep the two builds apart: Eigen's templates instantiated for both ISAs are
// the same weak symbols, which one link would merge, keeping either build's copy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "trainer/cnn_math.h"

namespace dlrun::trainer {

// Where one layer's parameters sit in the flat buffer.
struct MlpLayer {
  size_t weights;  // offset of the out x in weight matrix (row-major)
  size_t bias;     // offset of the out biases
  int in, out;
};

// A model's buffers as the math sees them; the caller sizes them for the batch.
struct MlpBuffers {
  const MlpLayer* layers;
  size_t layerCount;
  const float* params;
  float* grads;
  float* const* activations;  // per layer: batch x out; the last layer's are the logits
  float* scratch[2];          // each batch x the widest hidden layer: the backward pass's deltas
};

struct MlpMath {
  const char* isa;  // what it was compiled for: "baseline" (any x86-64) or "avx2"
  // Forward and backward (x: batch x inputs, row-major): fills grads with the mean gradient
  // over the batch and returns the mean softmax cross-entropy.
  float (*lossAndGradient)(const MlpBuffers& model, const float* x, const uint8_t* labels,
                           int batch);
  // How many of the batch's examples the model classifies correctly.
  int (*countCorrect)(const MlpBuffers& model, const float* x, const uint8_t* labels, int batch);
  // PyTorch's SGD with the gradient scaled first: g = grads * gradScale + weightDecay * p;
  // v = momentum * v + g; p -= learningRate * v.
  void (*sgdStep)(float* params, float* velocity, const float* grads, size_t count,
                  float learningRate, float momentum, float weightDecay, float gradScale);
  // The convolutional model's (cnn_math.h): the same contracts on its buffers (x: batch x
  // kCnnInputs).
  float (*cnnLossAndGradient)(const CnnBuffers& model, const float* x, const uint8_t* labels,
                              int batch);
  int (*cnnCountCorrect)(const CnnBuffers& model, const float* x, const uint8_t* labels, int batch);
};

// The math as compiled into the binary that calls it: the baseline in dlrun-train.
const MlpMath& builtInMath();

// The module's one export, returning its table. Bump the version when MlpMath changes, so a
// stale module is ignored rather than called through another layout.
inline constexpr const char* kMathModuleEntry = "dlrun_train_math_v2";

}  // namespace dlrun::trainer
