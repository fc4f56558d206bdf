// The node's shared memory for dlrun.checkpoint (agents/checkpoint_memory.h): its directory's
// name says whose it is, it goes with its agent, and a gone agent's is removed by the next.
#include "agents/checkpoint_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointMemory, ANameSaysItsOwnerAndReadsBack) {
  const MemoryOwner owner{1000, 4242, 987654321};
  EXPECT_EQ(memoryDirName(owner), "dlrun-checkpoints.1000.4242.987654321");
  EXPECT_EQ(parseMemoryDirName(memoryDirName(owner)), owner);
}

TEST(CheckpointMemory, OtherNamesAreNotOwned) {
  for (const char* name :
       {"dlrun-checkpoints.1000.4242", "dlrun-checkpoints.1000.4242.1.2", "dlrun-checkpoints.a.1.2",
        "dlrun-checkpoints.1000.0.5", "dlrun-checkpoints.1000..5", "other.1000.4242.5",
        "dlrun-checkpoints.1.2.99999999999999999999"})
    EXPECT_EQ(parseMemoryDirName(name), std::nullopt) << name;
}

TEST(CheckpointMemory, ThisProcessHasAStartTime) {
  EXPECT_TRUE(processStartTicks(::getpid()).has_value());
  EXPECT_EQ(processStartTicks(0), std::nullopt);
}

class CheckpointMemoryDir : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("checkpoint_memory_test." + std::to_string(::getpid()));
    fs::create_directories(base_);
  }
  void TearDown() override { fs::remove_all(base_); }
  fs::path base_;
};

TEST_F(CheckpointMemoryDir, TheDirectoryGoesWithItsAgent) {
  fs::path dir;
  {
    CheckpointMemory memory(base_);
    dir = memory.dir();
    EXPECT_EQ(parseMemoryDirName(dir.filename().string())->pid, ::getpid());
    fs::create_directories(dir / "rank-0" / "step-3");
    std::ofstream(dir / "rank-0" / "step-3" / "tensors") << "bytes";
  }
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(CheckpointMemoryDir, AGoneAgentsDirectoryIsRemovedAndALiveOnesKept) {
  const uint64_t ticks = *processStartTicks(::getpid());
  // The test's own parent runs; a start time that is not this process's is a reused PID's.
  const fs::path live =
      base_ / memoryDirName({::getuid(), ::getppid(), *processStartTicks(::getppid())});
  const fs::path reused = base_ / memoryDirName({::getuid(), ::getppid(), ticks + 12345});
  const fs::path gone = base_ / memoryDirName({::getuid(), 99999999, 5});  // over any pid_max
  const fs::path otherUser = base_ / memoryDirName({::getuid() + 1, ::getppid(), 1});
  const fs::path unrelated = base_ / "something-else";
  for (const auto& dir : {live, reused, gone, otherUser, unrelated})
    fs::create_directories(dir / "x");
  CheckpointMemory memory(base_);
  EXPECT_TRUE(fs::exists(live));
  EXPECT_FALSE(fs::exists(reused));
  EXPECT_FALSE(fs::exists(gone));
  EXPECT_TRUE(fs::exists(otherUser));  // another user's is theirs to remove
  EXPECT_TRUE(fs::exists(unrelated));
}

}  // namespace
}  // namespace dlrun::agents
