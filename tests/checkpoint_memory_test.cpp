// The node's shared memory for dlrun.checkpoint (agents/checkpoint_memory.h): its directory's
// name says whose it is, it goes with its agent, and one nobody holds is removed by the next.
#include "agents/checkpoint_memory.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointMemory, ANameSaysItsOwnerAndReadsBack) {
  const MemoryOwner owner{1000, 4242};
  EXPECT_EQ(memoryDirName(owner, "a1B2c3"), "dlrun-checkpoints.1000.4242.a1B2c3");
  EXPECT_EQ(parseMemoryDirName(memoryDirName(owner, "a1B2c3")), owner);
}

TEST(CheckpointMemory, OtherNamesAreNotOwned) {
  for (const char* name :
       {"dlrun-checkpoints.1000.4242", "dlrun-checkpoints.1000.4242.ab.cd",
        "dlrun-checkpoints.a.1.xyz", "dlrun-checkpoints.1000.0.xyz", "dlrun-checkpoints.1000..x",
        "other.1000.4242.xyz", "dlrun-checkpoints.1000.4242.", "dlrun-checkpoints.1.2.a-b",
        ".dlrun-checkpoints-new.abcdef"})
    EXPECT_EQ(parseMemoryDirName(name), std::nullopt) << name;
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
    EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all, fs::perms::owner_all);
    fs::create_directories(dir / "rank-0" / "slot-0");
    std::ofstream(dir / "rank-0" / "slot-0" / "tensors") << "bytes";
  }
  EXPECT_FALSE(fs::exists(dir));
}

TEST_F(CheckpointMemoryDir, OnlyDirectoriesNobodyHoldsAreRemoved) {
  // A live agent's (its lock held, as this test holds it), a SIGKILLed one's (the lock free),
  // one with no lock at all (not dlrun's making), another user's, and something else.
  const fs::path live = base_ / memoryDirName({::getuid(), 11}, "live01");
  const fs::path gone = base_ / memoryDirName({::getuid(), 12}, "gone01");
  const fs::path lockless = base_ / memoryDirName({::getuid(), 13}, "nolock");
  const fs::path otherUser = base_ / memoryDirName({::getuid() + 1, 14}, "other1");
  const fs::path unrelated = base_ / "something-else";
  for (const auto& dir : {live, gone, lockless, otherUser, unrelated})
    fs::create_directories(dir / "rank-0");
  for (const auto& dir : {live, gone, otherUser}) std::ofstream(dir / "lock");
  // flock's locks belong to the open file: this descriptor holds `live` as its agent would.
  const int held = ::open((live / "lock").c_str(), O_RDONLY);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  {
    CheckpointMemory memory(base_);
    EXPECT_TRUE(fs::exists(live));
    EXPECT_FALSE(fs::exists(gone));
    EXPECT_FALSE(fs::exists(lockless));
    EXPECT_TRUE(fs::exists(otherUser));  // another user's is theirs to remove
    EXPECT_TRUE(fs::exists(unrelated));
    // And this agent's own, locked, survives another agent's start.
    CheckpointMemory second(base_);
    EXPECT_TRUE(fs::exists(memory.dir()));
    EXPECT_NE(second.dir(), memory.dir());
  }
  ::close(held);
}

}  // namespace
}  // namespace dlrun::agents
