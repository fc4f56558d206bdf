#include "trainer/model.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace dlrun::trainer {

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

Mlp::Mlp(MlpShape shape, uint64_t seed, const MlpMath& math)
    : shape_(std::move(shape)), math_(&math), layers_(shape_.layers()) {
  params_.assign(shape_.parameterCount(), 0.0f);
  grads_.assign(params_.size(), 0.0f);
  activations_.resize(layers_.size());
  activationData_.resize(layers_.size());
  std::mt19937_64 random(seed);
  for (const auto& layer : layers_) {
    std::normal_distribution<float> he(0.0f, std::sqrt(2.0f / static_cast<float>(layer.in)));
    for (size_t i = 0; i < static_cast<size_t>(layer.out) * layer.in; ++i)
      params_[layer.weights + i] = he(random);
  }
}

MlpBuffers Mlp::buffers(int batch, float* grads) {
  for (size_t l = 0; l < layers_.size(); ++l) {
    activations_[l].resize(static_cast<size_t>(batch) * layers_[l].out);
    activationData_[l] = activations_[l].data();
  }
  // The deltas below the logits are as wide as a hidden layer.
  const int widest = shape_.hidden.empty() ? 0 : std::ranges::max(shape_.hidden);
  for (auto& scratch : scratch_) scratch.resize(static_cast<size_t>(batch) * widest);
  return {layers_.data(), layers_.size(),         params_.data(),
          grads,          activationData_.data(), {scratch_[0].data(), scratch_[1].data()}};
}

float Mlp::lossAndGradient(const float* x, const uint8_t* labels, int batch, float* grads) {
  return math_->lossAndGradient(buffers(batch, grads), x, labels, batch);
}

int Mlp::countCorrect(const float* x, const uint8_t* labels, int batch) {
  return math_->countCorrect(buffers(batch, grads_.data()), x, labels, batch);
}

size_t ModelSpec::parameterCount() const {
  return kind == "cnn" ? cnnLayout(cnn).parameterCount : mlp.parameterCount();
}

std::vector<int> ModelSpec::signature() const {
  if (kind != "cnn") return mlp.widths();
  return {0, cnn.channels1, cnn.channels2, cnn.kernel, cnn.hidden, cnn.classes};
}

void Sgd::step(std::vector<float>& params, const float* grads, float gradScale) {
  math_->sgdStep(params.data(), velocity_.data(), grads, params.size(), options_.learningRate,
                 options_.momentum, options_.weightDecay, gradScale);
}

}  // namespace dlrun::trainer
