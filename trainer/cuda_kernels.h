// The CUDA engine's small kernels: everything of a step that is not a GEMM. Matrices are
// row-major (rows x cols) device arrays, as in the CPU model. Each call enqueues on `stream`
// and throws Error when the launch fails.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace dlrun::trainer::cuda {

// y[r][c] += bias[c], then max(y, 0) when `relu`.
void addBias(float* y, const float* bias, int rows, int cols, bool relu, cudaStream_t stream);

// Softmax cross-entropy over the rows: `logits` become dL/dlogits of the mean loss, which is
// written to *meanLoss.
void softmaxCrossEntropy(float* logits, const uint8_t* labels, int rows, int classes,
                         float* meanLoss, cudaStream_t stream);

// out[c] = sum over r of x[r][c].
void columnSums(const float* x, int rows, int cols, float* out, cudaStream_t stream);

// ReLU's backward pass: grad = 0 where the layer's output was clipped to 0.
void reluBackward(float* grad, const float* output, size_t count, cudaStream_t stream);

// out[r] = the index of the largest x[r][c] (the first of equal ones).
void argmaxRows(const float* x, int rows, int cols, int* out, cudaStream_t stream);

// PyTorch's SGD with the gradient scaled first: g = grad * gradScale + weightDecay * p;
// v = momentum * v + g; p -= learningRate * v.
void sgdStep(float* params, float* velocity, const float* grads, size_t count, float learningRate,
             float momentum, float weightDecay, float gradScale, cudaStream_t stream);

}  // namespace dlrun::trainer::cuda
