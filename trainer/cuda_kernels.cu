#include "trainer/cuda_kernels.h"

#include <string>

#include "common/error.h"

namespace dlrun::trainer::cuda {
namespace {

constexpr int kThreads = 256;

int blocksFor(size_t count) { return static_cast<int>((count + kThreads - 1) / kThreads); }

void checkLaunch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw Error(std::string("launching the ") + kernel +
                " kernel failed: " + cudaGetErrorString(status));
}

__global__ void addBiasKernel(float* y, const float* bias, size_t count, int cols, bool relu) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float v = y[i] + bias[i % cols];
  y[i] = relu ? fmaxf(v, 0.0f) : v;
}

// One block: each thread takes every kThreads-th row, then the block sums the losses in a fixed
// order, so the loss does not depend on timing.
__global__ void softmaxCrossEntropyKernel(float* logits, const uint8_t* labels, int rows,
                                          int classes, float* meanLoss) {
  __shared__ float partial[kThreads];
  float loss = 0.0f;
  for (int r = threadIdx.x; r < rows; r += kThreads) {
    float* row = logits + static_cast<size_t>(r) * classes;
    float max = row[0];
    for (int c = 1; c < classes; ++c) max = fmaxf(max, row[c]);
    float sum = 0.0f;
    for (int c = 0; c < classes; ++c) {
      row[c] = expf(row[c] - max);
      sum += row[c];
    }
    for (int c = 0; c < classes; ++c) row[c] /= sum;
    loss -= logf(fmaxf(row[labels[r]], 1e-12f));
    row[labels[r]] -= 1.0f;
    for (int c = 0; c < classes; ++c) row[c] /= static_cast<float>(rows);
  }
  partial[threadIdx.x] = loss;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *meanLoss = partial[0] / static_cast<float>(rows);
}

__global__ void columnSumsKernel(const float* x, int rows, int cols, float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += x[static_cast<size_t>(r) * cols + c];
  out[c] = sum;
}

__global__ void reluBackwardKernel(float* grad, const float* output, size_t count) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count && !(output[i] > 0.0f)) grad[i] = 0.0f;
}

__global__ void argmaxRowsKernel(const float* x, int rows, int cols, int* out) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* row = x + static_cast<size_t>(r) * cols;
  int best = 0;
  for (int c = 1; c < cols; ++c)
    if (row[c] > row[best]) best = c;
  out[r] = best;
}

__global__ void sgdStepKernel(float* params, float* velocity, const float* grads, size_t count,
                              float learningRate, float momentum, float weightDecay,
                              float gradScale) {
  const size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float g = grads[i] * gradScale + weightDecay * params[i];
  velocity[i] = momentum * velocity[i] + g;
  params[i] -= learningRate * velocity[i];
}

}  // namespace

void addBias(float* y, const float* bias, int rows, int cols, bool relu, cudaStream_t stream) {
  const size_t count = static_cast<size_t>(rows) * cols;
  addBiasKernel<<<blocksFor(count), kThreads, 0, stream>>>(y, bias, count, cols, relu);
  checkLaunch("bias");
}

void softmaxCrossEntropy(float* logits, const uint8_t* labels, int rows, int classes,
                         float* meanLoss, cudaStream_t stream) {
  softmaxCrossEntropyKernel<<<1, kThreads, 0, stream>>>(logits, labels, rows, classes, meanLoss);
  checkLaunch("softmax cross-entropy");
}

void columnSums(const float* x, int rows, int cols, float* out, cudaStream_t stream) {
  columnSumsKernel<<<blocksFor(cols), kThreads, 0, stream>>>(x, rows, cols, out);
  checkLaunch("column sum");
}

void reluBackward(float* grad, const float* output, size_t count, cudaStream_t stream) {
  reluBackwardKernel<<<blocksFor(count), kThreads, 0, stream>>>(grad, output, count);
  checkLaunch("ReLU backward");
}

void argmaxRows(const float* x, int rows, int cols, int* out, cudaStream_t stream) {
  argmaxRowsKernel<<<blocksFor(rows), kThreads, 0, stream>>>(x, rows, cols, out);
  checkLaunch("argmax");
}

void sgdStep(float* params, float* velocity, const float* grads, size_t count, float learningRate,
             float momentum, float weightDecay, float gradScale, cudaStream_t stream) {
  sgdStepKernel<<<blocksFor(count), kThreads, 0, stream>>>(
      params, velocity, grads, count, learningRate, momentum, weightDecay, gradScale);
  checkLaunch("SGD");
}

}  // namespace dlrun::trainer::cuda
