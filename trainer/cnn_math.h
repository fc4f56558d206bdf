// The convolutional model's CPU math on raw, caller-owned buffers, for 28x28 grayscale images
// and 10 classes (Fashion-MNIST). The architecture is exactly torch's
//   Sequential(Conv2d(1, C1, K, padding=K/2), ReLU, MaxPool2d(2),
//              Conv2d(C1, C2, K, padding=K/2), ReLU, MaxPool2d(2),
//              Flatten, Linear(C2*7*7, H), ReLU, Linear(H, classes))
// with softmax cross-entropy, so a checkpoint moves between the two with one copy per tensor.
// Like mlp_math.h, the functions reach the trainer through MlpMath's table (cnnLossAndGradient,
// cnnCountCorrect), built into dlrun-train and into the AVX2 module.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dlrun::trainer {

// The input is fixed: one channel of kCnnImageSide x kCnnImageSide pixels, row-major.
inline constexpr int kCnnImageSide = 28;
inline constexpr int kCnnInputs = kCnnImageSide * kCnnImageSide;

struct CnnShape {
  int channels1 = 16, channels2 = 32;
  int kernel = 3;  // odd: padding K/2 keeps each convolution's output the size of its input
  int hidden = 128, classes = 10;
};

// Offsets in the one flat parameter buffer: torch's state_dict order and layouts concatenated,
// conv1.weight [C1][1][K][K], conv1.bias [C1], conv2.weight [C2][C1][K][K], conv2.bias [C2],
// fc1.weight [H][C2*7*7] (input index c*49 + h*7 + w, torch's NCHW flatten), fc1.bias [H],
// fc2.weight [classes][H], fc2.bias [classes].
struct CnnLayout {
  size_t conv1Weight, conv1Bias, conv2Weight, conv2Bias;
  size_t fc1Weight, fc1Bias, fc2Weight, fc2Bias;
  size_t parameterCount;
};

// The layout of `shape`'s parameters. Throws ConfigError on a non-positive size or an even
// kernel.
CnnLayout cnnLayout(const CnnShape& shape);

// How many floats of workspace, and how many int32 max-pool indices, a batch of `batch` needs.
// Throws ConfigError as cnnLayout does, or where the indices would overflow int32.
size_t cnnWorkspaceFloats(const CnnShape& shape, int batch);
size_t cnnPoolIndexCount(const CnnShape& shape, int batch);

// The model's buffers as the math sees them; the caller owns them and sizes them for the
// largest batch it passes.
struct CnnBuffers {
  CnnShape shape;
  const float* params;  // cnnLayout(shape).parameterCount floats
  float* grads;         // as many; written by lossAndGradient only
  float* workspace;     // cnnWorkspaceFloats(shape, batch) floats
  int32_t* poolIndex;   // cnnPoolIndexCount(shape, batch): each max-pool output's argmax
};

// The functions MlpMath's table carries (x: batch x kCnnInputs, row-major): called by name they
// are this binary's build; through cpuMath() (math_dispatch.h), the AVX2 one where the CPU has
// it. Deterministic: the same inputs give bit-identical outputs, wherever the buffers sit.
// Fills grads with the mean gradient over the batch and returns the mean cross-entropy.
float cnnLossAndGradient(const CnnBuffers& model, const float* x, const uint8_t* labels, int batch);
// How many of the batch's examples the model classifies correctly.
int cnnCountCorrect(const CnnBuffers& model, const float* x, const uint8_t* labels, int batch);

}  // namespace dlrun::trainer
