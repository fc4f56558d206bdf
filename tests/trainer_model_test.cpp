// Trainer model: the MLP's shape and parameter count, its analytic gradient against a central
// finite difference, SGD against PyTorch's update rule worked out by hand, and the AVX2 build
// of the math against the baseline.
#include "trainer/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "tests/gradient_check.h"
#include "trainer/math_dispatch.h"

namespace dlrun::trainer {
namespace {

TEST(MlpShape, WidthsAndParameterCount) {
  const MlpShape tiny{5, {4}, 3};
  EXPECT_EQ(tiny.widths(), (std::vector<int>{5, 4, 3}));
  EXPECT_EQ(tiny.parameterCount(), size_t{4 * 5 + 4 + 3 * 4 + 3});  // 39

  const MlpShape defaults;  // 784-256-128-10
  EXPECT_EQ(defaults.widths(), (std::vector<int>{784, 256, 128, 10}));
  EXPECT_EQ(defaults.parameterCount(), size_t{784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10});

  const MlpShape noHidden{7, {}, 2};
  EXPECT_EQ(noHidden.parameterCount(), size_t{7 * 2 + 2});
}

TEST(Mlp, BuffersMatchTheShapeAndInitDependsOnTheSeed) {
  const MlpShape shape{5, {4, 6}, 3};
  Mlp a(shape, 7), b(shape, 7), c(shape, 8);
  EXPECT_EQ(a.params().size(), shape.parameterCount());
  EXPECT_EQ(a.grads().size(), shape.parameterCount());
  EXPECT_EQ(a.params(), b.params());  // every rank starts from the same weights
  EXPECT_NE(a.params(), c.params());
  // Biases start at zero: the first layer's 4 biases follow its 4x5 weights.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.params()[20 + i], 0.0f);
}

// The mean cross-entropy of `model` on the batch, in double from the model's own forward pass
// (lossAndGradient's return value), used as the function to differentiate numerically.
double lossAt(Mlp& model, const std::vector<float>& x, const std::vector<uint8_t>& y) {
  return model.lossAndGradient(x.data(), y.data(), static_cast<int>(y.size()));
}

TEST(Mlp, AnalyticGradientMatchesFiniteDifferences) {
  const MlpShape shape{5, {4}, 3};
  Mlp model(shape, 3);
  constexpr int kBatch = 3;
  std::mt19937 random(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(kBatch * 5);
  for (float& v : x) v = uniform(random);
  const std::vector<uint8_t> y = {0, 2, 1};
  // Non-zero biases, so no hidden unit sits exactly at the ReLU kink by construction.
  for (float& p : model.params()) p += 0.1f * uniform(random);

  model.lossAndGradient(x.data(), y.data(), kBatch);
  const std::vector<float> analytic = model.grads();
  const std::vector<float> start = model.params();

  ASSERT_EQ(start.size(), 39u);
  const auto check =
      testing::checkGradient(analytic, 0, start.size(), 1e-2, 1e-2, [&](size_t i, double delta) {
        model.params() = start;
        model.params()[i] = start[i] + float(delta);
        return lossAt(model, x, y);
      });
  EXPECT_LT(check.worst, 1e-2) << "parameter " << check.worstIndex << ": analytic "
                               << analytic[check.worstIndex];
  // The gradient is not trivially zero (a broken backward pass could agree with a flat loss).
  EXPECT_GT(*std::max_element(analytic.begin(), analytic.end(),
                              [](float a, float b) { return std::abs(a) < std::abs(b); }),
            0.0f);
}

TEST(Mlp, LossOfUniformLogitsIsLogClassesAndCountCorrectScores) {
  // All weights zero: every logit is zero, the loss is log(3), the gradient of the last bias is
  // mean(softmax - onehot).
  const MlpShape shape{2, {2}, 3};
  Mlp model(shape, 1);
  std::fill(model.params().begin(), model.params().end(), 0.0f);
  const std::vector<float> x = {1, 2, 3, 4};
  const std::vector<uint8_t> y = {0, 0};
  EXPECT_NEAR(model.lossAndGradient(x.data(), y.data(), 2), std::log(3.0), 1e-6);
  const size_t lastBias = shape.parameterCount() - 3;
  EXPECT_NEAR(model.grads()[lastBias + 0], 1.0 / 3 - 1, 1e-6);
  EXPECT_NEAR(model.grads()[lastBias + 1], 1.0 / 3, 1e-6);
  EXPECT_NEAR(model.grads()[lastBias + 2], 1.0 / 3, 1e-6);

  // Make class 2 win for every input through its bias alone.
  model.params()[lastBias + 2] = 1.0f;
  const std::vector<uint8_t> labels = {2, 1};
  EXPECT_EQ(model.countCorrect(x.data(), labels.data(), 2), 1);
}

TEST(Sgd, MatchesPyTorchsUpdateByHand) {
  // torch.optim.SGD(lr=0.1, momentum=0.9, weight_decay=0.01), dampening 0, no nesterov:
  //   g = grad + wd * p;  v = g (first step) / momentum * v + g;  p -= lr * v.
  Sgd sgd({0.1f, 0.9f, 0.01f}, 2);
  std::vector<float> params = {1.0f, -2.0f};
  // Step 1, grads (0.5, 0.25):
  //   g = (0.5 + 0.01, 0.25 - 0.02) = (0.51, 0.23); v = (0.51, 0.23)
  //   p = (1 - 0.051, -2 - 0.023) = (0.949, -2.023)
  sgd.step(params, {0.5f, 0.25f});
  EXPECT_NEAR(sgd.velocity()[0], 0.51f, 1e-6f);
  EXPECT_NEAR(sgd.velocity()[1], 0.23f, 1e-6f);
  EXPECT_NEAR(params[0], 0.949f, 1e-6f);
  EXPECT_NEAR(params[1], -2.023f, 1e-6f);
  // Step 2, grads (-1, 0):
  //   g = (-1 + 0.00949, -0.02023) = (-0.99051, -0.02023)
  //   v = (0.9 * 0.51 - 0.99051, 0.9 * 0.23 - 0.02023) = (-0.53151, 0.18677)
  //   p = (0.949 + 0.053151, -2.023 - 0.018677) = (1.002151, -2.041677)
  sgd.step(params, {-1.0f, 0.0f});
  EXPECT_NEAR(sgd.velocity()[0], -0.53151f, 1e-6f);
  EXPECT_NEAR(sgd.velocity()[1], 0.18677f, 1e-6f);
  EXPECT_NEAR(params[0], 1.002151f, 1e-6f);
  EXPECT_NEAR(params[1], -2.041677f, 1e-6f);
  // A new learning rate (the schedule) applies from the next step on.
  sgd.setLearningRate(0.0f);
  sgd.step(params, {3.0f, 3.0f});
  EXPECT_NEAR(params[0], 1.002151f, 1e-6f);
  EXPECT_NEAR(params[1], -2.041677f, 1e-6f);
}

TEST(Sgd, PlainSgdWithoutMomentumOrDecay) {
  Sgd sgd({0.5f, 0.0f, 0.0f}, 3);
  std::vector<float> params = {1.0f, 2.0f, 3.0f};
  sgd.step(params, {1.0f, -1.0f, 0.0f});
  sgd.step(params, {1.0f, -1.0f, 0.0f});
  EXPECT_EQ(params, (std::vector<float>{0.0f, 3.0f, 3.0f}));
}

#ifdef DLRUN_TRAIN_AVX2_MODULE
TEST(MlpMath, Avx2ModuleMatchesTheBaseline) {
  if (!cpuHasAvx2()) GTEST_SKIP() << "this CPU lacks AVX2 or FMA";
  const MlpMath& avx2 = loadMathModule(DLRUN_TRAIN_AVX2_MODULE);
  ASSERT_STREQ(avx2.isa, "avx2");
  ASSERT_STREQ(builtInMath().isa, "baseline");

  // The default model, at batches that fill SIMD registers and that do not.
  const MlpShape shape;
  Mlp baseline(shape, 5), fast(shape, 5, avx2);
  Sgd baselineSgd({0.05f, 0.9f, 5e-4f}, shape.parameterCount());
  Sgd fastSgd({0.05f, 0.9f, 5e-4f}, shape.parameterCount(), avx2);
  std::mt19937 random(3);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, shape.classes - 1);
  for (int batch : {64, 7, 1, 64, 64}) {
    std::vector<float> x(static_cast<size_t>(batch) * shape.inputs);
    std::vector<uint8_t> y(batch);
    for (float& v : x) v = pixel(random);
    for (uint8_t& v : y) v = static_cast<uint8_t>(label(random));
    const float loss = baseline.lossAndGradient(x.data(), y.data(), batch);
    EXPECT_NEAR(fast.lossAndGradient(x.data(), y.data(), batch), loss, 1e-5 * loss);
    EXPECT_LT(testing::relativeDifference(baseline.grads(), fast.grads()), 1e-5)
        << "batch " << batch;
    EXPECT_EQ(fast.countCorrect(x.data(), y.data(), batch),
              baseline.countCorrect(x.data(), y.data(), batch));
    // Each steps on its own gradient, so the parameters drift apart by rounding only.
    baselineSgd.step(baseline.params(), baseline.grads().data(), 0.5f);
    fastSgd.step(fast.params(), fast.grads().data(), 0.5f);
    EXPECT_LT(testing::relativeDifference(baseline.params(), fast.params()), 1e-5)
        << "batch " << batch;
  }
}
#endif

}  // namespace
}  // namespace dlrun::trainer
