#include "trainer/model.h"

#include <Eigen/Dense>
#include <cmath>
#include <random>

namespace dlrun::trainer {

namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;

}  // namespace

std::vector<int> MlpShape::widths() const {
  std::vector<int> w{inputs};
  w.insert(w.end(), hidden.begin(), hidden.end());
  w.push_back(classes);
  return w;
}

std::vector<MlpShape::Layer> MlpShape::layers() const {
  const auto w = widths();
  std::vector<Layer> layers;
  size_t offset = 0;
  for (size_t i = 0; i + 1 < w.size(); ++i) {
    Layer layer{offset, offset + static_cast<size_t>(w[i + 1]) * w[i], w[i], w[i + 1]};
    offset = layer.bias + layer.out;
    layers.push_back(layer);
  }
  return layers;
}

size_t MlpShape::parameterCount() const {
  const auto all = layers();
  return all.back().bias + all.back().out;
}

Mlp::Mlp(MlpShape shape, uint64_t seed) : shape_(std::move(shape)), layers_(shape_.layers()) {
  params_.assign(shape_.parameterCount(), 0.0f);
  grads_.assign(params_.size(), 0.0f);
  activations_.resize(layers_.size());
  std::mt19937_64 random(seed);
  for (const auto& layer : layers_) {
    std::normal_distribution<float> he(0.0f, std::sqrt(2.0f / static_cast<float>(layer.in)));
    for (size_t i = 0; i < static_cast<size_t>(layer.out) * layer.in; ++i)
      params_[layer.weights + i] = he(random);
  }
}

void Mlp::forward(const float* x, int batch) {
  // a_{l+1} = relu(a_l W_l^T + b_l); the last layer (the logits) without relu.
  const float* input = x;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const MlpShape::Layer& layer = layers_[l];
    activations_[l].resize(static_cast<size_t>(batch) * layer.out);
    MatrixMap out(activations_[l].data(), batch, layer.out);
    ConstMatrixMap in(input, batch, layer.in);
    ConstMatrixMap weights(params_.data() + layer.weights, layer.out, layer.in);
    Eigen::Map<const Eigen::RowVectorXf> bias(params_.data() + layer.bias, layer.out);
    out.noalias() = in * weights.transpose();
    out.rowwise() += bias;
    if (l + 1 < layers_.size()) out = out.cwiseMax(0.0f);
    input = activations_[l].data();
  }
}

float Mlp::lossAndGradient(const float* x, const uint8_t* labels, int batch) {
  forward(x, batch);
  // Softmax cross-entropy; the logits become dL/dlogits in place.
  MatrixMap logits(activations_.back().data(), batch, shape_.classes);
  float loss = 0.0f;
  for (int i = 0; i < batch; ++i) {
    auto row = logits.row(i);
    const float max = row.maxCoeff();
    row = (row.array() - max).exp();
    const float sum = row.sum();
    row /= sum;
    loss -= std::log(std::max(row(labels[i]), 1e-12f));
    row(labels[i]) -= 1.0f;
  }
  logits /= static_cast<float>(batch);

  // Backward, from the last layer down; `delta` holds dL/d(pre-activation) of layer l.
  std::vector<float> delta(activations_.back());
  std::vector<float> below;
  for (size_t l = layers_.size(); l-- > 0;) {
    const MlpShape::Layer& layer = layers_[l];
    ConstMatrixMap d(delta.data(), batch, layer.out);
    ConstMatrixMap in(l == 0 ? x : activations_[l - 1].data(), batch, layer.in);
    MatrixMap gradW(grads_.data() + layer.weights, layer.out, layer.in);
    VectorMap gradB(grads_.data() + layer.bias, layer.out);
    gradW.noalias() = d.transpose() * in;
    gradB = d.colwise().sum().transpose();
    if (l == 0) break;
    ConstMatrixMap weights(params_.data() + layer.weights, layer.out, layer.in);
    below.resize(static_cast<size_t>(batch) * layer.in);
    MatrixMap dIn(below.data(), batch, layer.in);
    dIn.noalias() = d * weights;
    // ReLU: no gradient where the activation was clipped to zero.
    dIn = (in.array() > 0.0f).select(dIn, 0.0f);
    delta.swap(below);
  }
  return loss / static_cast<float>(batch);
}

int Mlp::countCorrect(const float* x, const uint8_t* labels, int batch) {
  forward(x, batch);
  ConstMatrixMap logits(activations_.back().data(), batch, shape_.classes);
  int correct = 0;
  for (int i = 0; i < batch; ++i) {
    Eigen::Index best;
    logits.row(i).maxCoeff(&best);
    correct += best == labels[i] ? 1 : 0;
  }
  return correct;
}

void Sgd::step(std::vector<float>& params, const float* grads, float gradScale) {
  const float lr = options_.learningRate, momentum = options_.momentum, wd = options_.weightDecay;
  for (size_t i = 0; i < params.size(); ++i) {
    const float g = grads[i] * gradScale + wd * params[i];
    velocity_[i] = momentum * velocity_[i] + g;
    params[i] -= lr * velocity_[i];
  }
}

}  // namespace dlrun::trainer
