// The GPU check before every round (agents/gpu_health.h): what NVML said, judged (pure), and the
// run-time opening of NVML against a fake libnvidia-ml (tests/fake_nvml.cpp, its answers set by
// DLRUN_FAKE_NVML), against none, and against a library that is not NVML.
#include "agents/gpu_health.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "agents/health_check.h"

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;

// An environment variable set (or unset: nullptr) for one test's scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

GpuAnswer answered(unsigned index) { return {.index = index}; }
GpuAnswer failed(unsigned index, int error, const std::string& text) {
  return {.index = index, .error = error, .text = text};
}

NvmlSaid listing(unsigned count, std::vector<GpuAnswer> gpus, bool fromVisible = false) {
  return {.count = count, .gpus = std::move(gpus), .fromVisibleDevices = fromVisible};
}

TEST(GpuHealth, CudaVisibleDevicesNamesTheGpusOnlyByNumbers) {
  using Indices = std::vector<unsigned>;
  EXPECT_EQ(visibleIndices(std::nullopt), std::nullopt);
  EXPECT_EQ(visibleIndices(""), std::nullopt);
  EXPECT_EQ(visibleIndices(" "), std::nullopt);
  EXPECT_EQ(visibleIndices("0,2"), Indices({0, 2}));
  EXPECT_EQ(visibleIndices(" 1 , 3"), Indices({1, 3}));
  EXPECT_EQ(visibleIndices("GPU-8a6b2f3c-0d4e,1"), std::nullopt);
  EXPECT_EQ(visibleIndices("MIG-1a2b3c4d"), std::nullopt);
  EXPECT_EQ(visibleIndices("-1"), std::nullopt);
}

TEST(GpuHealth, ANodeWithoutGpusIsSkippedUnlessTheJobExpectsSome) {
  const NvmlSaid noLibrary{.unopened = "libnvidia-ml.so.1: cannot open shared object file"};
  EXPECT_EQ(gpuProblem(noLibrary, 0), std::nullopt);
  EXPECT_EQ(gpuProblem(noLibrary, 8),
            "--health-gpus=8, but NVML does not open here to count them: libnvidia-ml.so.1: "
            "cannot open shared object file");
  const NvmlSaid noDriver{.initError = nvml::kDriverNotLoaded, .initText = "Driver Not Loaded"};
  EXPECT_EQ(gpuProblem(noDriver, 0), std::nullopt);
  EXPECT_EQ(gpuProblem(noDriver, 2),
            "--health-gpus=2, but this node has no GPU driver (NVML: Driver Not Loaded)");
  const NvmlSaid noLibraryBehind{.initError = nvml::kLibraryNotFound, .initText = "Not Found"};
  EXPECT_EQ(gpuProblem(noLibraryBehind, 0), std::nullopt);
  EXPECT_EQ(gpuProblem(listing(0, {}), 0), std::nullopt);
  EXPECT_EQ(gpuProblem(listing(0, {}), 1), "--health-gpus=1, but NVML lists no GPU on this node");
}

TEST(GpuHealth, AnNvmlThatDoesNotStartOrCountFailsTheNode) {
  const NvmlSaid mismatch{.initError = 18,
                          .initText = "RM has detected an NVML/RM version mismatch."};
  EXPECT_EQ(gpuProblem(mismatch, 0),
            "NVML does not start: RM has detected an NVML/RM version mismatch.");
  const NvmlSaid uncounted{.countError = 999, .countText = "Unknown Error"};
  EXPECT_EQ(gpuProblem(uncounted, 0), "NVML cannot count the GPUs: Unknown Error");
}

TEST(GpuHealth, AGpuThatDoesNotAnswerIsNamed) {
  EXPECT_EQ(gpuProblem(listing(4, {answered(0), answered(1), answered(2), answered(3)}), 0),
            std::nullopt);
  EXPECT_EQ(gpuProblem(listing(4, {answered(0), answered(1), answered(2),
                                   failed(3, nvml::kGpuIsLost, "GPU is lost")}),
                       0),
            "GPU 3 does not answer: GPU is lost");
  EXPECT_EQ(gpuProblem(listing(4,
                               {failed(1, nvml::kGpuIsLost, "GPU is lost"), answered(2),
                                failed(3, 999, "Unknown Error")},
                               true),
                       2),
            "GPU 1 does not answer: GPU is lost; GPU 3 does not answer: Unknown Error");
}

TEST(GpuHealth, TheJobsGpusAreCountedAgainstHealthGpus) {
  const NvmlSaid seven = listing(7, {answered(0), answered(1), answered(2), answered(3),
                                     answered(4), answered(5), answered(6)});
  EXPECT_EQ(gpuProblem(seven, 7), std::nullopt);
  EXPECT_EQ(gpuProblem(seven, 8), "only 7 GPUs on this node, under --health-gpus's 8");
  const NvmlSaid two = listing(8, {answered(2), answered(3)}, /*fromVisible=*/true);
  EXPECT_EQ(gpuProblem(two, 2), std::nullopt);
  EXPECT_EQ(gpuProblem(two, 4), "only 2 GPUs in CUDA_VISIBLE_DEVICES, under --health-gpus's 4");
  EXPECT_EQ(gpuProblem(listing(8, {answered(5)}, true), 2),
            "only 1 GPU in CUDA_VISIBLE_DEVICES, under --health-gpus's 2");
}

TEST(GpuHealth, AVisibleIndexNvmlDoesNotListFailsTheNode) {
  EXPECT_EQ(gpuProblem(listing(4, {answered(0), {.index = 5, .listed = false}}, true), 0),
            "CUDA_VISIBLE_DEVICES names GPU 5, but NVML lists 4 GPUs on this node (0-3)");
}

// Not supported: the GPU answered. No permission: another job's GPU (a cgroup hides it).
TEST(GpuHealth, AGpuHiddenFromTheJobIsNeitherLostNorCounted) {
  const NvmlSaid said =
      listing(3, {answered(0), failed(1, nvml::kNoPermission, "Insufficient Permissions"),
                  failed(2, nvml::kNotSupported, "Not Supported")});
  EXPECT_EQ(gpuProblem(said, 2), std::nullopt);
  EXPECT_EQ(gpuProblem(said, 3), "only 2 GPUs on this node, under --health-gpus's 3");
}

TEST(GpuHealthNvml, NoLibraryIsANodeWithoutGpus) {
  const std::string absent = "/nonexistent/libnvidia-ml.so.1";
  const NvmlSaid said = askNvml(absent, std::nullopt);
  EXPECT_NE(said.unopened.find(absent), std::string::npos) << said.unopened;
  EXPECT_EQ(checkGpus(absent, 0), std::nullopt);
  const auto problem = checkGpus(absent, 4);
  ASSERT_TRUE(problem);
  EXPECT_TRUE(
      problem->starts_with("--health-gpus=4, but NVML does not open here to count them: "
                           "/nonexistent/libnvidia-ml.so.1"))
      << *problem;
}

TEST(GpuHealthNvml, ALibraryThatIsNotNvmlDoesNotOpen) {
  EXPECT_EQ(askNvml("libm.so.6", std::nullopt).unopened, "libm.so.6 has no nvmlInit_v2");
}

TEST(GpuHealthNvml, TheFakeNvmlsLostGpuIsNamed) {
  const ScopedEnv visible("CUDA_VISIBLE_DEVICES", nullptr);
  const ScopedEnv fake("DLRUN_FAKE_NVML", "count=4;lost=3");
  const NvmlSaid said = askNvml(FAKE_NVML, std::nullopt);
  EXPECT_EQ(said.unopened, "");
  EXPECT_EQ(said.count, 4u);
  ASSERT_EQ(said.gpus.size(), 4u);
  EXPECT_EQ(said.gpus[3].error, nvml::kGpuIsLost);
  EXPECT_EQ(checkGpus(FAKE_NVML, 0), "GPU 3 does not answer: GPU is lost");
  {
    const ScopedEnv others("CUDA_VISIBLE_DEVICES", "0,1");
    EXPECT_EQ(checkGpus(FAKE_NVML, 2), std::nullopt);
    EXPECT_EQ(checkGpus(FAKE_NVML, 3),
              "only 2 GPUs in CUDA_VISIBLE_DEVICES, under --health-gpus's 3");
  }
  {
    const ScopedEnv beyond("CUDA_VISIBLE_DEVICES", "0,5");
    EXPECT_EQ(checkGpus(FAKE_NVML, 0),
              "CUDA_VISIBLE_DEVICES names GPU 5, but NVML lists 4 GPUs on this node (0-3)");
  }
  const ScopedEnv healthy("DLRUN_FAKE_NVML", "count=4");
  EXPECT_EQ(checkGpus(FAKE_NVML, 4), std::nullopt);
  EXPECT_EQ(checkGpus(FAKE_NVML, 8), "only 4 GPUs on this node, under --health-gpus's 8");
}

TEST(GpuHealthNvml, AnNvmlThatHangsFailsTheCheckInTimeAndIsNotAskedAgainMeanwhile) {
  const ScopedEnv visible("CUDA_VISIBLE_DEVICES", nullptr);
  const std::string tag = std::to_string(::getpid());
  const std::string release = testing::TempDir() + "nvml-release-" + tag;
  const std::string calls = testing::TempDir() + "nvml-calls-" + tag;
  std::filesystem::remove(release);
  std::filesystem::remove(calls);
  const ScopedEnv logged("DLRUN_FAKE_NVML_CALLS", calls.c_str());
  const ScopedEnv hanging("DLRUN_FAKE_NVML", ("count=2;hang=" + release).c_str());
  const std::string stuck = "NVML did not answer within 0.05 s (a GPU or its driver hangs)";
  EXPECT_EQ(checkGpus(FAKE_NVML, 0, std::chrono::milliseconds(50)), stuck);
  EXPECT_EQ(checkGpus(FAKE_NVML, 0, std::chrono::milliseconds(50)), stuck);
  std::ifstream in(calls);
  std::string said((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(said, "init\n");         // the second check asked nothing: the first ask is still stuck
  std::ofstream(release).put('\n');  // the driver answers again
  std::optional<std::string> after = stuck;
  const auto stillStuck = [&] { return after && after->starts_with("NVML did not answer"); };
  for (int tries = 0; stillStuck() && tries < 100'000; ++tries) {
    std::this_thread::yield();  // the stuck ask ends within moments of the release
    after = checkGpus(FAKE_NVML, 0, std::chrono::seconds(10));
  }
  EXPECT_EQ(after, std::nullopt);
  std::filesystem::remove(release);
  std::filesystem::remove(calls);
}

TEST(GpuHealthNvml, TheFakeNvmlWithoutDriverOrGpusIsSkipped) {
  {
    const ScopedEnv fake("DLRUN_FAKE_NVML", "init=9");
    EXPECT_EQ(checkGpus(FAKE_NVML, 0), std::nullopt);
    EXPECT_EQ(checkGpus(FAKE_NVML, 1),
              "--health-gpus=1, but this node has no GPU driver (NVML: Driver Not Loaded)");
  }
  const ScopedEnv fake("DLRUN_FAKE_NVML", "count=0");
  EXPECT_EQ(checkGpus(FAKE_NVML, 0), std::nullopt);
}

// Each check starts NVML and shuts it down; one that did not start is not shut down.
TEST(GpuHealthNvml, EveryNvmlStartedIsShutDown) {
  const fs::path calls =
      fs::temp_directory_path() / ("gpu_health_test." + std::to_string(::getpid()));
  const ScopedEnv log("DLRUN_FAKE_NVML_CALLS", calls.c_str());
  {
    const ScopedEnv fake("DLRUN_FAKE_NVML", "count=2;lost=1");
    EXPECT_TRUE(checkGpus(FAKE_NVML, 0));
  }
  {
    const ScopedEnv fake("DLRUN_FAKE_NVML", "init=18");
    EXPECT_EQ(checkGpus(FAKE_NVML, 0),
              "NVML does not start: RM has detected an NVML/RM version mismatch.");
  }
  std::stringstream said;
  said << std::ifstream(calls).rdbuf();
  fs::remove(calls);
  EXPECT_EQ(said.str(), "init\nshutdown\ninit\n");
}

// checkHealth runs the GPU check after the free space and before the user's command.
TEST(GpuHealthNvml, HealthChecksRunTheGpuCheckBeforeTheUsersCommand) {
  const ScopedEnv visible("CUDA_VISIBLE_DEVICES", nullptr);
  const ScopedEnv fake("DLRUN_FAKE_NVML", "count=2;lost=0");
  HealthOptions options{.command = "exit 3", .minFreeBytes = 0, .nvml = FAKE_NVML};
  EXPECT_EQ(checkHealth(options), "GPU 0 does not answer: GPU is lost");
  options.minFreeBytes = 1ull << 62;
  options.dirs = {fs::temp_directory_path()};
  ASSERT_TRUE(checkHealth(options));
  EXPECT_TRUE(checkHealth(options)->starts_with("only ")) << *checkHealth(options);
  const ScopedEnv healthy("DLRUN_FAKE_NVML", "count=2");
  options.minFreeBytes = 0;
  EXPECT_EQ(checkHealth(options), "--health-check 'exit 3' failed (exit code 3)");
  options.command.reset();
  options.gpus = 3;
  EXPECT_EQ(checkHealth(options), "only 2 GPUs on this node, under --health-gpus's 3");
}

}  // namespace
}  // namespace dlrun::agents
