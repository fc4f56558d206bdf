// In-memory checkpoints written to --checkpoint-dir (agents/checkpoint_flush.h): as the agent ends
// every marked copy of every rank goes there whole, an unmarked one (being written) does not;
// while the job runs, the copies the workers ask for; what each rank keeps there.
#include "agents/checkpoint_flush.h"
#include "agents/checkpoint_files.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;

TEST(CheckpointFlush, TheNewestStepEveryRankHoldsAndNewerOnesStay) {
  // Ranks 0 and 1 both hold 4 and 6; rank 0 holds 7 and 8 too (rank 1 lost before them).
  const std::map<int, std::set<int64_t>> whole{{0, {2, 4, 6, 7, 8}}, {1, {4, 6}}};
  EXPECT_EQ(stepsToRemove(whole, 0, 2), (std::set<int64_t>{2, 4}));
  EXPECT_EQ(stepsToRemove(whole, 1, 2), (std::set<int64_t>{4}));
}

TEST(CheckpointFlush, WithoutAStepInCommonTheThreeNewestStay) {
  // A directory of this node only (the other ranks' are elsewhere), or a rank alone so far.
  EXPECT_EQ(stepsToRemove({{0, {1, 2, 3, 4, 5}}}, 0, 2), (std::set<int64_t>{1, 2}));
  // The step in common stays however many newer ones there are.
  EXPECT_EQ(stepsToRemove({{0, {1, 2, 3, 4, 5}}, {1, {1}}}, 0, 2), (std::set<int64_t>{2}));
  EXPECT_EQ(stepsToRemove({{0, {1, 2, 3, 4, 5, 6}}, {1, {2}}}, 0, 2), (std::set<int64_t>{1, 3}));
  EXPECT_EQ(stepsToRemove({{1, {4}}}, 0, 2), (std::set<int64_t>{}));
}

TEST(CheckpointFlush, AMarkNamesItsStep) {
  EXPECT_EQ(markedStep("12 00ab\n"), 12);
  for (const char* mark : {"12 00ab", "12\n", "x 00ab\n", "-1 00ab\n", "12 00ab cd\n", ""})
    EXPECT_EQ(markedStep(mark), std::nullopt) << mark;
}

class CheckpointFlushDir : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("checkpoint_flush_test." + std::to_string(::getpid()));
    fs::create_directories(base_);
  }
  void TearDown() override { fs::remove_all(base_); }

  // A copy of `step` in memory: rank R's slot K, marked unless `marked` is false.
  void copy(int rank, int slot, int step, bool marked = true) {
    const fs::path dir =
        base_ / "memory" / ("rank-" + std::to_string(rank)) / ("slot-" + std::to_string(slot));
    fs::create_directories(dir);
    std::ofstream(dir / "tensors") << "tensors of " << step;
    std::ofstream(dir / "meta") << "meta of " << step;
    fs::remove(dir / "step");
    if (marked) std::ofstream(dir / "step") << step << " c0ffee\n";
  }
  std::string read(const fs::path& file) {
    std::ifstream in(file);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  std::vector<std::string> listed(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }
  fs::path base_;
};

TEST_F(CheckpointFlushDir, EveryMarkedCopyIsWrittenWholeAndAnUnmarkedOneIsNot) {
  copy(0, 0, 4);
  copy(0, 1, 5);
  copy(1, 0, 4);
  copy(1, 1, 5, /*marked=*/false);  // being written as the worker ended
  const CopyReport report = flushCheckpoints(base_ / "memory", base_ / "disk", 2);
  EXPECT_TRUE(report.problems.empty());
  EXPECT_EQ(report.copied.size(), 3u);
  EXPECT_EQ(listed(base_ / "disk" / "rank-0"), (std::vector<std::string>{"step-4", "step-5"}));
  EXPECT_EQ(listed(base_ / "disk" / "rank-1"), (std::vector<std::string>{"step-4"}));
  const fs::path five = base_ / "disk" / "rank-0" / "step-5";
  EXPECT_EQ(listed(five), (std::vector<std::string>{"meta", "step", "tensors"}));
  EXPECT_EQ(read(five / "tensors"), "tensors of 5");
  EXPECT_EQ(read(five / "step"), "5 c0ffee\n");
}

TEST_F(CheckpointFlushDir, OlderStepsThanOneEveryRankHoldsGoAndNothingIsWrittenTwice) {
  copy(0, 0, 4);
  copy(0, 1, 5);
  copy(1, 0, 4);
  copy(1, 1, 5);
  flushCheckpoints(base_ / "memory", base_ / "disk", 2);
  copy(0, 0, 6);
  copy(0, 1, 7);
  copy(1, 0, 6);
  copy(1, 1, 7);
  fs::create_directories(base_ / "disk" / "rank-0" / ".step-3.new");  // an end cut short
  EXPECT_EQ(flushCheckpoints(base_ / "memory", base_ / "disk", 2).copied.size(), 4u);
  EXPECT_EQ(listed(base_ / "disk" / "rank-0"), (std::vector<std::string>{"step-7"}));
  EXPECT_EQ(listed(base_ / "disk" / "rank-1"), (std::vector<std::string>{"step-7"}));
  EXPECT_TRUE(flushCheckpoints(base_ / "memory", base_ / "disk", 2).copied.empty());
}

TEST_F(CheckpointFlushDir, ARequestedCopyIsWrittenAndAStaleRequestDropped) {
  copy(0, 0, 4);
  copy(0, 1, 5);
  const fs::path slots = base_ / "memory" / "rank-0";
  std::ofstream(slots / "slot-0" / "write") << "4 2\n";
  std::ofstream(slots / "slot-1" / "write") << "3 2\n";  // step 3 was written over since
  const CopyReport report = writeRequested(base_ / "memory", base_ / "disk");
  EXPECT_TRUE(report.problems.empty());
  EXPECT_EQ(report.copied, (std::vector<std::pair<int, int64_t>>{{0, 4}}));
  EXPECT_EQ(listed(base_ / "disk" / "rank-0"), (std::vector<std::string>{"step-4"}));
  EXPECT_FALSE(fs::exists(slots / "slot-0" / "write"));
  EXPECT_FALSE(fs::exists(slots / "slot-1" / "write"));
  EXPECT_TRUE(writeRequested(base_ / "memory", base_ / "disk").copied.empty());
}

TEST_F(CheckpointFlushDir, ADirectoryThatCannotBeMadeIsAProblemNamed) {
  copy(0, 0, 4);
  std::ofstream(base_ / "file") << "not a directory";
  const CopyReport report = flushCheckpoints(base_ / "memory", base_ / "file" / "disk", 1);
  EXPECT_TRUE(report.copied.empty());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_TRUE(report.problems[0].starts_with("rank 0: ")) << report.problems[0];
}

}  // namespace
}  // namespace dlrun::agents
