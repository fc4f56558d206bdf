// The torch probe (agents/torch_probe.h): its answer read, the versions whose client refuses an
// agent's store, and the real probe (python/dlrun_torch_probe.py) under the system's Python
// against torch trees made here: a library with the no-libuv message, one without, none; an
// interpreter that never answers is killed at the limit.
#include "agents/torch_probe.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

TEST(TorchProbe, ItsLineIsRead) {
  const auto build = parseTorchProbe(R"({"version": "2.6.0", "path": "/t", "libuv": false})");
  ASSERT_TRUE(build);
  EXPECT_EQ(build->version, "2.6.0");
  EXPECT_EQ(build->path, "/t");
  EXPECT_EQ(build->libuv, false);
  EXPECT_FALSE(parseTorchProbe(R"({"version": "2.6.0", "path": "/t", "libuv": null})")->libuv);
  EXPECT_FALSE(parseTorchProbe("{}"));
  EXPECT_FALSE(parseTorchProbe(R"({"error": "OSError: gone"})"));
  EXPECT_FALSE(parseTorchProbe("Traceback (most recent call last):"));
  EXPECT_FALSE(parseTorchProbe(""));
}

TEST(TorchProbe, OnlyATorchWithoutLibuvFrom24OnRefusesTheAgentsStore) {
  auto build = [](std::string version, std::optional<bool> libuv) {
    return TorchBuild{.version = std::move(version), .path = "/t", .libuv = libuv};
  };
  EXPECT_TRUE(build("2.6.0", false).refusesAgentStore());
  EXPECT_TRUE(build("2.4.1", false).refusesAgentStore());
  EXPECT_TRUE(build("3.0.0", false).refusesAgentStore());
  EXPECT_TRUE(build("", false).refusesAgentStore());
  EXPECT_FALSE(build("2.3.1", false).refusesAgentStore());  // its client asked for no libuv
  EXPECT_FALSE(build("1.13.1", false).refusesAgentStore());
  EXPECT_FALSE(build("2.13.0+cpu", true).refusesAgentStore());
  EXPECT_FALSE(build("2.6.0", std::nullopt).refusesAgentStore());  // nothing read: as before
}

class TorchProbeRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("torch_probe_test." + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    if (const char* path = std::getenv("PYTHONPATH")) saved_ = path;
  }
  void TearDown() override {
    if (saved_)
      ::setenv("PYTHONPATH", saved_->c_str(), 1);
    else
      ::unsetenv("PYTHONPATH");
    fs::remove_all(dir_);
  }

  static void write(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << text;
  }

  // A torch package of `version` whose lib/libtorch_cpu.so holds `library`, first on the path.
  fs::path fakeTorch(const std::string& version, const std::string& library) {
    const fs::path torch = dir_ / "site" / "torch";
    write(torch / "__init__.py", "raise ImportError('the probe must not import torch')\n");
    write(torch / "version.py", "__version__ = '" + version + "'\ngit_version = 'x'\n");
    write(torch / "lib" / "libtorch_cpu.so", library);
    ::setenv("PYTHONPATH", (dir_ / "site").c_str(), 1);
    return torch;
  }

  fs::path dir_;
  std::optional<std::string> saved_;
};

constexpr milliseconds kLimit{30'000};
const std::string kNoLibuv = "LibUV TCPStore implementation missing";

TEST_F(TorchProbeRun, ABuildWithoutLibuvIsFoundByItsLibrary) {
  const fs::path torch =
      fakeTorch("2.6.0", std::string(4096, '\x7f') + kNoLibuv + std::string(4096, '\0'));
  const auto build = probeTorch("/usr/bin/python3", kLimit);
  ASSERT_TRUE(build);
  EXPECT_EQ(build->version, "2.6.0");
  EXPECT_EQ(fs::canonical(build->path), fs::canonical(torch));
  EXPECT_EQ(build->libuv, false);
  EXPECT_TRUE(build->refusesAgentStore());
}

TEST_F(TorchProbeRun, ABuildWithLibuvChangesNothing) {
  fakeTorch("2.13.0", "uv_loop_init");
  const auto build = probeTorch("/usr/bin/python3", kLimit);
  ASSERT_TRUE(build);
  EXPECT_EQ(build->libuv, true);
  EXPECT_FALSE(build->refusesAgentStore());
}

TEST_F(TorchProbeRun, NoTorchPackageNoAnswer) {
  // A module named torch that is no package: not torch.
  write(dir_ / "site" / "torch.py", "");
  ::setenv("PYTHONPATH", (dir_ / "site").c_str(), 1);
  EXPECT_FALSE(probeTorch("/usr/bin/python3", kLimit));
}

TEST_F(TorchProbeRun, AnInterpreterThatCannotStartOrNeverAnswersGivesNoAnswer) {
  EXPECT_FALSE(probeTorch((dir_ / "no-such-python").string(), kLimit));
  const fs::path silent = dir_ / "python3";
  write(silent, "#!/bin/sh\nexec sleep 600\n");
  ::chmod(silent.c_str(), 0755);
  EXPECT_FALSE(probeTorch(silent.string(), milliseconds(200)));
}

}  // namespace
}  // namespace dlrun::agents
