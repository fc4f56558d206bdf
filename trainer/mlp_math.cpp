// Compiled twice (trainer/CMakeLists.txt): into dlrun-train for any x86-64 CPU, and into
// dlrun-train-avx2.so with -mavx2 -mfma. Everything here but builtInMath is internal.
#include "trainer/mlp_math.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>

namespace dlrun::trainer {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;

void forward(const MlpBuffers& model, const float* x, int batch) {
  // a_{l+1} = relu(a_l W_l^T + b_l); the last layer (the logits) without relu.
  const float* input = x;
  for (size_t l = 0; l < model.layerCount; ++l) {
    const MlpLayer& layer = model.layers[l];
    MatrixMap out(model.activations[l], batch, layer.out);
    ConstMatrixMap in(input, batch, layer.in);
    ConstMatrixMap weights(model.params + layer.weights, layer.out, layer.in);
    Eigen::Map<const Eigen::RowVectorXf> bias(model.params + layer.bias, layer.out);
    out.noalias() = in * weights.transpose();
    out.rowwise() += bias;
    if (l + 1 < model.layerCount) out = out.cwiseMax(0.0f);
    input = model.activations[l];
  }
}

float lossAndGradient(const MlpBuffers& model, const float* x, const uint8_t* labels, int batch) {
  forward(model, x, batch);
  const MlpLayer& last = model.layers[model.layerCount - 1];
  // Softmax cross-entropy; the logits become dL/dlogits in place. Plain loops, not Eigen's:
  // on a row whose address is not a whole packet, Eigen takes its first elements one by one
  // (std::exp, another order of the sum) and the rest in packets (its own exp), so under AVX2
  // the result hung on where malloc put the buffer, and a run, or its resume, on the
  // environment's size (one run in a few differed from the step-20 checkpoint on).
  MatrixMap logits(model.activations[model.layerCount - 1], batch, last.out);
  float loss = 0.0f;
  for (int i = 0; i < batch; ++i) {
    float* row = logits.row(i).data();
    const float max = *std::max_element(row, row + last.out);
    float sum = 0.0f;
    for (int c = 0; c < last.out; ++c) sum += row[c] = std::exp(row[c] - max);
    for (int c = 0; c < last.out; ++c) row[c] /= sum;
    loss -= std::log(std::max(row[labels[i]], 1e-12f));
    row[labels[i]] -= 1.0f;
  }
  logits /= static_cast<float>(batch);

  // Backward, from the last layer down; `delta` holds dL/d(pre-activation) of layer l, and the
  // layer below's goes to the scratch buffer `delta` does not use.
  const float* delta = logits.data();
  for (size_t l = model.layerCount; l-- > 0;) {
    const MlpLayer& layer = model.layers[l];
    ConstMatrixMap d(delta, batch, layer.out);
    ConstMatrixMap in(l == 0 ? x : model.activations[l - 1], batch, layer.in);
    MatrixMap gradW(model.grads + layer.weights, layer.out, layer.in);
    VectorMap gradB(model.grads + layer.bias, layer.out);
    gradW.noalias() = d.transpose() * in;
    gradB = d.colwise().sum().transpose();
    if (l == 0) break;
    ConstMatrixMap weights(model.params + layer.weights, layer.out, layer.in);
    float* below = model.scratch[delta == model.scratch[0] ? 1 : 0];
    MatrixMap dIn(below, batch, layer.in);
    dIn.noalias() = d * weights;
    // ReLU: no gradient where the activation was clipped to zero.
    dIn = (in.array() > 0.0f).select(dIn, 0.0f);
    delta = below;
  }
  return loss / static_cast<float>(batch);
}

int countCorrect(const MlpBuffers& model, const float* x, const uint8_t* labels, int batch) {
  forward(model, x, batch);
  const MlpLayer& last = model.layers[model.layerCount - 1];
  ConstMatrixMap logits(model.activations[model.layerCount - 1], batch, last.out);
  int correct = 0;
  for (int i = 0; i < batch; ++i) {
    Eigen::Index best;
    logits.row(i).maxCoeff(&best);
    correct += best == labels[i] ? 1 : 0;
  }
  return correct;
}

void sgdStep(float* params, float* velocity, const float* grads, size_t count, float learningRate,
             float momentum, float weightDecay, float gradScale) {
  for (size_t i = 0; i < count; ++i) {
    const float g = grads[i] * gradScale + weightDecay * params[i];
    velocity[i] = momentum * velocity[i] + g;
    params[i] -= learningRate * velocity[i];
  }
}

}  // namespace

const MlpMath& builtInMath() {
#if defined(__AVX2__) && defined(__FMA__)
  static constexpr MlpMath math{"avx2",  lossAndGradient,    countCorrect,
                                sgdStep, cnnLossAndGradient, cnnCountCorrect};
#else
  static constexpr MlpMath math{"baseline", lossAndGradient,    countCorrect,
                                sgdStep,    cnnLossAndGradient, cnnCountCorrect};
#endif
  return math;
}

}  // namespace dlrun::trainer
