#include "trainer/cnn_model.h"

#include <cmath>
#include <random>

namespace dlrun::trainer {

Cnn::Cnn(CnnShape shape, uint64_t seed, const MlpMath& math) : shape_(shape), math_(&math) {
  const CnnLayout layout = cnnLayout(shape_);
  params_.assign(layout.parameterCount, 0.0f);
  grads_.assign(params_.size(), 0.0f);
  const int k2 = shape_.kernel * shape_.kernel;
  const int pooled = (kCnnImageSide / 4) * (kCnnImageSide / 4);
  // Each weight block: where it starts, how many weights, the fan-in of one output.
  const struct {
    size_t offset, count;
    int fanIn;
  } blocks[] = {
      {layout.conv1Weight, static_cast<size_t>(shape_.channels1) * k2, k2},
      {layout.conv2Weight, static_cast<size_t>(shape_.channels2) * shape_.channels1 * k2,
       shape_.channels1 * k2},
      {layout.fc1Weight, static_cast<size_t>(shape_.hidden) * shape_.channels2 * pooled,
       shape_.channels2 * pooled},
      {layout.fc2Weight, static_cast<size_t>(shape_.classes) * shape_.hidden, shape_.hidden},
  };
  std::mt19937_64 random(seed);
  for (const auto& block : blocks) {
    std::normal_distribution<float> he(0.0f, std::sqrt(2.0f / static_cast<float>(block.fanIn)));
    for (size_t i = 0; i < block.count; ++i) params_[block.offset + i] = he(random);
  }
}

CnnBuffers Cnn::buffers(int batch, float* grads) {
  const size_t floats = cnnWorkspaceFloats(shape_, batch);
  if (workspace_.size() < floats) workspace_.resize(floats);
  const size_t indices = cnnPoolIndexCount(shape_, batch);
  if (poolIndex_.size() < indices) poolIndex_.resize(indices);
  return {shape_, params_.data(), grads, workspace_.data(), poolIndex_.data()};
}

float Cnn::lossAndGradient(const float* x, const uint8_t* labels, int batch, float* grads) {
  return math_->cnnLossAndGradient(buffers(batch, grads), x, labels, batch);
}

int Cnn::countCorrect(const float* x, const uint8_t* labels, int batch) {
  return math_->cnnCountCorrect(buffers(batch, grads_.data()), x, labels, batch);
}

}  // namespace dlrun::trainer
