// The models: an MLP (ReLU hidden layers, softmax cross-entropy) and a CNN (cnn_model.h), each
// with its parameters and gradients in one flat buffer, so a whole gradient all-reduces as
// contiguous buckets and a checkpoint is one array. SGD with momentum and weight decay updates
// the flat buffer in place. The arithmetic is an MlpMath's (mlp_math.h): the baseline build
// unless given another.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer/cnn_math.h"
#include "trainer/mlp_math.h"

namespace dlrun::trainer {

// A model over flat buffers, as the engines train it.
class Model {
 public:
  virtual ~Model() = default;
  std::vector<float>& params() { return params_; }
  const std::vector<float>& params() const { return params_; }
  std::vector<float>& grads() { return grads_; }

  // Forward and backward over a batch (x: batch x inputs, row-major): fills grads() with the
  // mean gradient over the batch and returns the mean loss.
  float lossAndGradient(const float* x, const uint8_t* labels, int batch) {
    return lossAndGradient(x, labels, batch, grads_.data());
  }
  // The same into `grads` (params().size() floats), leaving grads() alone.
  virtual float lossAndGradient(const float* x, const uint8_t* labels, int batch, float* grads) = 0;
  // How many of the batch's examples the model classifies correctly.
  virtual int countCorrect(const float* x, const uint8_t* labels, int batch) = 0;

 protected:
  std::vector<float> params_, grads_;
};

struct MlpShape {
  int inputs = 784;
  std::vector<int> hidden = {256, 128};
  int classes = 10;

  using Layer = MlpLayer;  // where one layer's parameters sit in the flat buffer

  std::vector<int> widths() const;  // inputs, hidden..., classes
  std::vector<Layer> layers() const;
  size_t parameterCount() const;
};

class Mlp final : public Model {
 public:
  // He-initialised weights and zero biases, the same for every rank given the same seed.
  Mlp(MlpShape shape, uint64_t seed, const MlpMath& math = builtInMath());

  const MlpShape& shape() const { return shape_; }
  using Model::lossAndGradient;
  float lossAndGradient(const float* x, const uint8_t* labels, int batch, float* grads) override;
  int countCorrect(const float* x, const uint8_t* labels, int batch) override;

 private:
  // The buffers sized for `batch`, as the math takes them, the gradient going to `grads`.
  MlpBuffers buffers(int batch, float* grads);

  MlpShape shape_;
  const MlpMath* math_;
  std::vector<MlpShape::Layer> layers_;
  std::vector<std::vector<float>> activations_;  // per layer output, reused across batches
  std::vector<float*> activationData_;
  std::vector<float> scratch_[2];  // the backward pass's deltas
};

// What --model picks, with its shape.
struct ModelSpec {
  std::string kind = "mlp";  // "mlp" or "cnn"
  MlpShape mlp;
  CnnShape cnn;

  size_t parameterCount() const;
  // What a checkpoint records, so that it loads into the same model only: the MLP's layer
  // widths, or 0 (no width) and then the CNN's sizes.
  std::vector<int> signature() const;
};

struct SgdOptions {
  float learningRate = 0.05f;
  float momentum = 0.9f;
  float weightDecay = 5e-4f;
};

// PyTorch's SGD: g += wd * p; v = momentum * v + g; p -= lr * v.
class Sgd {
 public:
  Sgd(SgdOptions options, size_t parameters, const MlpMath& math = builtInMath())
      : options_(options), math_(&math), velocity_(parameters, 0.0f) {}
  void step(std::vector<float>& params, const std::vector<float>& grads) {
    step(params, grads.data(), 1.0f);
  }
  // The same with the gradient scale folded into the one pass (the mean over ranks).
  void step(std::vector<float>& params, const float* grads, float gradScale);
  void setLearningRate(float learningRate) { options_.learningRate = learningRate; }
  std::vector<float>& velocity() { return velocity_; }
  const std::vector<float>& velocity() const { return velocity_; }

 private:
  SgdOptions options_;
  const MlpMath* math_;
  std::vector<float> velocity_;
};

}  // namespace dlrun::trainer
