// The CUDA engine against the CPU engine: the same initial weights, then the same losses,
// updates and predictions (up to float rounding) over a few steps, with the gradients summed by
// NCCL and through host memory. Skipped where no CUDA device is usable.
#include "trainer/cuda_engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "trainer/cpu_engine.h"

namespace dlrun::trainer {
namespace {

constexpr float kTolerance = 1e-5f;

float maxDifference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float most = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    most = std::max(most, std::abs(a[i] - b[i]));
  return most;
}

class CudaEngineTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const CudaDevices devices = findCudaDevices();
    if (devices.count == 0) GTEST_SKIP() << "no CUDA device: " << devices.problem;
    std::mt19937 random(5);
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    for (float& v : x) v = uniform(random);
    for (auto& label : y) label = static_cast<uint8_t>(random() % options.model.mlp.classes);
    // More ranks on the node than devices: the gradients go through host memory.
    placement.localWorldSize = GetParam() ? devices.count + 1 : 1;
  }

  static constexpr int kBatch = 8;
  EngineOptions options{{.mlp = {20, {16, 12}, 5}}, 3, {0.1f, 0.9f, 1e-3f}};
  std::vector<float> x = std::vector<float>(kBatch * 20);
  std::vector<uint8_t> y = std::vector<uint8_t>(kBatch);
  Placement placement;
  std::unique_ptr<Collective> solo = makeSoloCollective();
};

TEST_P(CudaEngineTest, MatchesTheCpuEngine) {
  auto cpu = makeCpuEngine(options, *solo);
  auto gpu = makeCudaEngine(options, placement, *solo, nullptr);
  EXPECT_STREQ(gpu->device(), "cuda");
  EXPECT_EQ(gpu->params(), cpu->params());  // the same initial weights, bit for bit
  for (int step = 0; step < 5; ++step) {
    const float rate = 0.1f / static_cast<float>(step + 1);
    const StepResult a = cpu->step(x.data(), y.data(), kBatch, rate, step == 4);
    const StepResult b = gpu->step(x.data(), y.data(), kBatch, rate, step == 4);
    EXPECT_NEAR(a.loss, b.loss, kTolerance) << "step " << step;
    EXPECT_EQ(a.stop, b.stop) << "step " << step;
  }
  EXPECT_LE(maxDifference(cpu->params(), gpu->params()), kTolerance);
  EXPECT_LE(maxDifference(cpu->velocity(), gpu->velocity()), kTolerance);
  EXPECT_EQ(gpu->countCorrect(x.data(), y.data(), kBatch),
            cpu->countCorrect(x.data(), y.data(), kBatch));
}

TEST_P(CudaEngineTest, LoadReplacesTheState) {
  auto gpu = makeCudaEngine(options, placement, *solo, nullptr);
  const size_t n = options.model.parameterCount();
  std::vector<float> params(n), velocity(n);
  for (size_t i = 0; i < n; ++i) {
    params[i] = 0.001f * static_cast<float>(i);
    velocity[i] = -0.5f * static_cast<float>(i);
  }
  gpu->load(params, velocity);
  EXPECT_EQ(gpu->params(), params);
  EXPECT_EQ(gpu->velocity(), velocity);
}

INSTANTIATE_TEST_SUITE_P(Sum, CudaEngineTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "ThroughHost" : "Nccl"; });

}  // namespace
}  // namespace dlrun::trainer
