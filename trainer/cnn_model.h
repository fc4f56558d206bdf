// The convolutional model (cnn_math.h) as the engines train it: its flat parameters, He
// initialised from a seed, and the workspace its math needs, grown to the largest batch seen.
#pragma once

#include <cstdint>
#include <vector>

#include "trainer/model.h"

namespace dlrun::trainer {

class Cnn final : public Model {
 public:
  // He-initialised weights (fan-in: the inputs each output sees) and zero biases, the same for
  // every rank given the same seed. Throws ConfigError for a shape cnn_math refuses.
  Cnn(CnnShape shape, uint64_t seed, const MlpMath& math = builtInMath());

  using Model::lossAndGradient;
  float lossAndGradient(const float* x, const uint8_t* labels, int batch, float* grads) override;
  int countCorrect(const float* x, const uint8_t* labels, int batch) override;

 private:
  CnnBuffers buffers(int batch, float* grads);

  CnnShape shape_;
  const MlpMath* math_;
  std::vector<float> workspace_;
  std::vector<int32_t> poolIndex_;
};

}  // namespace dlrun::trainer
