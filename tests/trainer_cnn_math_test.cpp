// The convolutional model's math (cnn_math.h): its parameter layout, its loss and gradient
// against a naive double-precision forward and that forward's central differences, losses
// worked out by hand, the mean gradient of a batch against its halves' (what data-parallel ranks
// average), bit-identical results wherever the buffers sit, and the AVX2 module's build against
// the baseline.
#include "trainer/cnn_math.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/program_files.h"
#include "tests/gradient_check.h"
#include "trainer/math_dispatch.h"
#include "trainer/mlp_math.h"

namespace dlrun::trainer {
namespace {

// A model's caller-owned buffers, sized for batches up to `batch`. Each buffer starts `offset`
// floats into its allocation, so two models can sit at different addresses and alignments.
class Model {
 public:
  Model(const CnnShape& shape, int batch, size_t offset = 0)
      : shape_(shape),
        offset_(offset),
        params_(cnnLayout(shape).parameterCount + offset),
        grads_(params_.size()),
        workspace_(cnnWorkspaceFloats(shape, batch) + offset),
        index_(cnnPoolIndexCount(shape, batch) + offset) {}

  float* params() { return params_.data() + offset_; }
  size_t size() const { return params_.size() - offset_; }
  std::vector<float> grads() const { return {grads_.begin() + offset_, grads_.end()}; }
  CnnBuffers buffers() {
    return {shape_, params(), grads_.data() + offset_, workspace_.data() + offset_,
            index_.data() + offset_};
  }
  float loss(const float* x, const uint8_t* y, int batch, const MlpMath& math = builtInMath()) {
    return math.cnnLossAndGradient(buffers(), x, y, batch);
  }
  int correct(const float* x, const uint8_t* y, int batch, const MlpMath& math = builtInMath()) {
    return math.cnnCountCorrect(buffers(), x, y, batch);
  }

 private:
  CnnShape shape_;
  size_t offset_;
  std::vector<float> params_, grads_, workspace_;
  std::vector<int32_t> index_;
};

// torch's default initialisation: each block uniform in +-1/sqrt(its layer's fan-in).
void randomize(Model& model, const CnnShape& s, unsigned seed) {
  const CnnLayout l = cnnLayout(s);
  const size_t k2 = static_cast<size_t>(s.kernel) * s.kernel;
  const struct {
    size_t begin, end, fanIn;
  } blocks[] = {{l.conv1Weight, l.conv2Weight, k2},
                {l.conv2Weight, l.fc1Weight, s.channels1 * k2},
                {l.fc1Weight, l.fc2Weight, s.channels2 * 49u},
                {l.fc2Weight, l.parameterCount, static_cast<size_t>(s.hidden)}};
  std::mt19937 random(seed);
  for (const auto& block : blocks) {
    const float bound = 1.0f / std::sqrt(static_cast<float>(block.fanIn));
    std::uniform_real_distribution<float> uniform(-bound, bound);
    for (size_t i = block.begin; i < block.end; ++i) model.params()[i] = uniform(random);
  }
}

struct Batch {
  std::vector<float> x;
  std::vector<uint8_t> y;
};

Batch randomBatch(int batch, int classes, unsigned seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  std::uniform_int_distribution<int> label(0, classes - 1);
  Batch b{std::vector<float>(static_cast<size_t>(batch) * kCnnInputs), std::vector<uint8_t>(batch)};
  for (float& v : b.x) v = pixel(random);
  for (uint8_t& v : b.y) v = static_cast<uint8_t>(label(random));
  return b;
}

TEST(CnnLayout, IsTorchsStateDictOrder) {
  const CnnLayout l = cnnLayout(CnnShape{});
  EXPECT_EQ(l.conv1Weight, 0u);
  EXPECT_EQ(l.conv1Bias, 16u * 9);
  EXPECT_EQ(l.conv2Weight, 16u * 9 + 16);
  EXPECT_EQ(l.conv2Bias, 160u + 32 * 16 * 9);
  EXPECT_EQ(l.fc1Weight, 4768u + 32);
  EXPECT_EQ(l.fc1Bias, 4800u + 128 * 32 * 49);
  EXPECT_EQ(l.fc2Weight, 205504u + 128);
  EXPECT_EQ(l.fc2Bias, 205632u + 10 * 128);
  EXPECT_EQ(l.parameterCount, 206922u);  // torch's sum(p.numel()) for the default model
  EXPECT_THROW(cnnLayout(CnnShape{16, 32, 4}), ConfigError);
  EXPECT_THROW(cnnLayout(CnnShape{0}), ConfigError);
  EXPECT_THROW(cnnWorkspaceFloats(CnnShape{}, 0), ConfigError);
  EXPECT_THROW(cnnPoolIndexCount(CnnShape{}, 1 << 20), ConfigError);
}

// torch's forward written naively in double (NCHW, direct convolution), sharing no code with
// cnn_math.cpp: a reference for the loss and, through central differences with a step too small
// to cross a ReLU or max-pool kink, for the gradient.
std::vector<double> convRelu(const std::vector<double>& in, int inChannels, int side,
                             const double* weight, const double* bias, int outChannels,
                             int kernel) {
  std::vector<double> out(static_cast<size_t>(outChannels) * side * side);
  const int pad = kernel / 2;
  for (int o = 0; o < outChannels; ++o) {
    for (int y = 0; y < side; ++y) {
      for (int x = 0; x < side; ++x) {
        double sum = bias[o];
        for (int c = 0; c < inChannels; ++c) {
          for (int kh = 0; kh < kernel; ++kh) {
            for (int kw = 0; kw < kernel; ++kw) {
              const int iy = y + kh - pad, ix = x + kw - pad;
              if (iy < 0 || iy >= side || ix < 0 || ix >= side) continue;
              sum += weight[((o * inChannels + c) * kernel + kh) * kernel + kw] *
                     in[(c * side + iy) * side + ix];
            }
          }
        }
        out[(o * side + y) * side + x] = std::max(sum, 0.0);
      }
    }
  }
  return out;
}

std::vector<double> maxPool(const std::vector<double>& in, int channels, int side) {
  const int half = side / 2;
  std::vector<double> out(static_cast<size_t>(channels) * half * half);
  for (int c = 0; c < channels; ++c) {
    for (int y = 0; y < half; ++y) {
      for (int x = 0; x < half; ++x) {
        const double* at = &in[(c * side + 2 * y) * side + 2 * x];
        out[(c * half + y) * half + x] = std::max({at[0], at[1], at[side], at[side + 1]});
      }
    }
  }
  return out;
}

std::vector<double> dense(const std::vector<double>& in, const double* weight, const double* bias,
                          int outputs, bool relu) {
  std::vector<double> out(outputs);
  for (int o = 0; o < outputs; ++o) {
    double sum = bias[o];
    for (size_t i = 0; i < in.size(); ++i) sum += weight[o * in.size() + i] * in[i];
    out[o] = relu ? std::max(sum, 0.0) : sum;
  }
  return out;
}

double referenceLoss(const CnnShape& s, const std::vector<double>& p, const Batch& data) {
  const CnnLayout l = cnnLayout(s);
  double total = 0;
  for (size_t b = 0; b < data.y.size(); ++b) {
    const std::vector<double> image(data.x.begin() + b * kCnnInputs,
                                    data.x.begin() + (b + 1) * kCnnInputs);
    const std::vector<double> pool1 =
        maxPool(convRelu(image, 1, 28, &p[l.conv1Weight], &p[l.conv1Bias], s.channels1, s.kernel),
                s.channels1, 28);
    const std::vector<double> pool2 = maxPool(
        convRelu(pool1, s.channels1, 14, &p[l.conv2Weight], &p[l.conv2Bias], s.channels2, s.kernel),
        s.channels2, 14);
    const std::vector<double> hidden = dense(pool2, &p[l.fc1Weight], &p[l.fc1Bias], s.hidden, true);
    const std::vector<double> z = dense(hidden, &p[l.fc2Weight], &p[l.fc2Bias], s.classes, false);
    const double max = *std::max_element(z.begin(), z.end());
    double sum = 0;
    for (double v : z) sum += std::exp(v - max);
    total += std::log(sum) + max - z[data.y[b]];
  }
  return total / static_cast<double>(data.y.size());
}

TEST(CnnMath, LossAndGradientMatchANaiveDoubleReferenceInEveryBlock) {
  const CnnShape shape{2, 3, 3, 8, 10};
  constexpr int kBatch = 3;
  Model model(shape, kBatch);
  randomize(model, shape, 4);
  const Batch data = randomBatch(kBatch, shape.classes, 21);
  const float loss = model.loss(data.x.data(), data.y.data(), kBatch);
  const std::vector<float> analytic = model.grads();
  std::vector<double> p(model.params(), model.params() + model.size());
  EXPECT_NEAR(loss, referenceLoss(shape, p, data), 1e-5);

  const CnnLayout l = cnnLayout(shape);
  const struct {
    const char* name;
    size_t begin, end;
  } blocks[] = {
      {"conv1.weight", l.conv1Weight, l.conv1Bias}, {"conv1.bias", l.conv1Bias, l.conv2Weight},
      {"conv2.weight", l.conv2Weight, l.conv2Bias}, {"conv2.bias", l.conv2Bias, l.fc1Weight},
      {"fc1.weight", l.fc1Weight, l.fc1Bias},       {"fc1.bias", l.fc1Bias, l.fc2Weight},
      {"fc2.weight", l.fc2Weight, l.fc2Bias},       {"fc2.bias", l.fc2Bias, l.parameterCount}};
  const auto lossAt = [&](size_t i, double delta) {
    const double start = p[i];
    p[i] = start + delta;
    const double moved = referenceLoss(shape, p, data);
    p[i] = start;
    return moved;
  };
  for (const auto& block : blocks) {
    const auto check = testing::checkGradient(analytic, block.begin, block.end, 1e-6, 1e-3, lossAt);
    EXPECT_LT(check.worst, 1e-3) << block.name << " [" << check.worstIndex - block.begin
                                 << "]: analytic " << analytic[check.worstIndex];
    // Not trivially zero: a broken backward pass could agree with a flat loss.
    EXPECT_GT(check.largest, 1e-4) << block.name;
  }
}

// One kernel tap and one channel, so each stage is checked by hand: the image's block maxima
// flow through; the loss and a gradient follow from the logits.
TEST(CnnMath, HandCheckedLossGradientAndCount) {
  const CnnShape shape{1, 1, 1, 1, 10};
  const CnnLayout l = cnnLayout(shape);
  Model model(shape, 2);
  std::fill(model.params(), model.params() + model.size(), 0.0f);
  model.params()[l.conv1Weight] = 1.0f;  // relu(x), pooled 2x2
  model.params()[l.conv2Weight] = 1.0f;  // again: the maxima of 4x4 blocks
  std::fill(model.params() + l.fc1Weight, model.params() + l.fc1Bias, 1.0f);  // their sum
  model.params()[l.fc2Weight + 3] = 0.5f;  // class 3's logit is half the sum, the others 0
  std::vector<float> x(2 * kCnnInputs, 0.0f);
  x[1 * 28 + 2] = 3.0f;                   // the top-left block's max ...
  x[1 * 28 + 3] = 2.0f;                   // ... over this one
  x[27 * 28 + 27] = 1.0f;                 // the bottom-right block's
  x[10 * 28 + 10] = -5.0f;                // clipped by the ReLU
  const std::vector<uint8_t> y = {3, 0};  // the second image is blank: all logits 0
  const double e2 = std::exp(2.0);
  const double loss0 = std::log(e2 + 9) - 2, loss1 = std::log(10.0);
  EXPECT_NEAR(model.loss(x.data(), y.data(), 2), (loss0 + loss1) / 2, 1e-6);
  // dL/dfc2.weight[3] = mean over the batch of (p3 - [label 3]) * hidden; the hidden unit is 4
  // on the first image, 0 on the second.
  EXPECT_NEAR(model.grads()[l.fc2Weight + 3], (e2 / (e2 + 9) - 1) * 4 / 2, 1e-6);
  EXPECT_NEAR(model.grads()[l.fc2Bias + 0], (1 / (e2 + 9) + 0.1 - 1) / 2, 1e-6);
  // Both right: class 3 wins the first; the blank's tie goes to the first class, as torch.
  EXPECT_EQ(model.correct(x.data(), y.data(), 2), 2);
}

// fc1 reads the second pool's output in torch's flatten order, channel by channel.
TEST(CnnMath, FlattenIsTorchsChannelMajorOrder) {
  const CnnShape shape{1, 2, 1, 1, 10};
  const CnnLayout l = cnnLayout(shape);
  Model model(shape, 1);
  std::fill(model.params(), model.params() + model.size(), 0.0f);
  model.params()[l.conv1Weight] = 1.0f;
  model.params()[l.conv2Weight] = 1.0f;  // both channels copy the pooled image
  model.params()[l.conv2Weight + 1] = 1.0f;
  model.params()[l.fc1Weight + 1 * 49 + 2 * 7 + 5] = 1.0f;  // channel 1, row 2, column 5
  model.params()[l.fc2Weight + 1] = 1.0f;
  std::vector<float> x(kCnnInputs, 0.0f);
  x[9 * 28 + 22] = 3.0f;   // in the 4x4 block at row 2, column 5
  x[17 * 28 + 25] = 7.0f;  // row 4, column 6, channel 0: index 68 of an NHWC flatten
  const uint8_t y = 1;
  EXPECT_NEAR(model.loss(x.data(), &y, 1), std::log(std::exp(3.0) + 9) - 3, 1e-6);
}

TEST(CnnMath, MeanGradientOfABatchIsTheMeanOfItsHalves) {
  const CnnShape shape;
  Model whole(shape, 8), half(shape, 4);
  randomize(whole, shape, 1);
  std::copy(whole.params(), whole.params() + whole.size(), half.params());
  const Batch data = randomBatch(8, shape.classes, 2);
  const float loss = whole.loss(data.x.data(), data.y.data(), 8);
  const float loss1 = half.loss(data.x.data(), data.y.data(), 4);
  const std::vector<float> first = half.grads();
  const float loss2 = half.loss(data.x.data() + 4 * kCnnInputs, data.y.data() + 4, 4);
  const std::vector<float> second = half.grads(), all = whole.grads();
  EXPECT_NEAR(loss, (loss1 + loss2) / 2, 1e-5);
  double worst = 0, largest = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    worst = std::max(worst, std::abs(double{all[i]} - (double{first[i]} + second[i]) / 2));
    largest = std::max(largest, std::abs(double{all[i]}));
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_GT(largest, 1e-3);
}

TEST(CnnMath, BitIdenticalAcrossCallsAndAddresses) {
  const CnnShape shape;
  for (int batch : {64, 7}) {
    const Batch data = randomBatch(batch, shape.classes, 5);
    // The second model's buffers and input sit one float off the first's, as malloc might.
    Model a(shape, batch), b(shape, batch, 1);
    randomize(a, shape, 6);
    std::copy(a.params(), a.params() + a.size(), b.params());
    std::vector<float> shifted(data.x.size() + 3);
    std::copy(data.x.begin(), data.x.end(), shifted.begin() + 3);

    const float first = a.loss(data.x.data(), data.y.data(), batch);
    const std::vector<float> grads = a.grads();
    const float again = a.loss(data.x.data(), data.y.data(), batch);
    const float moved = b.loss(shifted.data() + 3, data.y.data(), batch);
    EXPECT_EQ(std::memcmp(&first, &again, sizeof first), 0) << "batch " << batch;
    EXPECT_EQ(std::memcmp(&first, &moved, sizeof first), 0) << "batch " << batch;
    EXPECT_TRUE(a.grads() == grads) << "batch " << batch;
    EXPECT_TRUE(b.grads() == grads) << "batch " << batch;
    EXPECT_EQ(a.correct(data.x.data(), data.y.data(), batch),
              b.correct(shifted.data() + 3, data.y.data(), batch));
  }
}

TEST(CnnMath, Avx2ModuleMatchesTheBaseline) {
  if (!cpuHasAvx2()) GTEST_SKIP() << "this CPU lacks AVX2 or FMA";
  // The build puts the module beside the tests (build/bin), as beside dlrun-train.
  const std::string path = findProgramFile(kAvx2ModuleName, ".");
  if (path.empty()) GTEST_SKIP() << "no " << kAvx2ModuleName << " beside the test: build it";
  const MlpMath& avx2 = loadMathModule(path);
  ASSERT_STREQ(avx2.isa, "avx2");
  ASSERT_STREQ(builtInMath().isa, "baseline");

  const CnnShape shape;
  Model baseline(shape, 64), fast(shape, 64);
  randomize(baseline, shape, 8);
  std::copy(baseline.params(), baseline.params() + baseline.size(), fast.params());
  for (int batch : {64, 7, 1}) {
    const Batch data = randomBatch(batch, shape.classes, 10 + batch);
    const float loss = baseline.loss(data.x.data(), data.y.data(), batch);
    EXPECT_NEAR(fast.loss(data.x.data(), data.y.data(), batch, avx2), loss, 1e-5 * loss);
    EXPECT_LT(testing::relativeDifference(baseline.grads(), fast.grads()), 1e-5)
        << "batch " << batch;
    EXPECT_EQ(fast.correct(data.x.data(), data.y.data(), batch, avx2),
              baseline.correct(data.x.data(), data.y.data(), batch));
  }
}

}  // namespace
}  // namespace dlrun::trainer
