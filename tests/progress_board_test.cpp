// The progress board between an agent and its workers: what a worker reports is what the agent
// reads, slot by slot, and a worker outside dlrun reports into nothing.
#include "common/progress_board.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>

#include "common/error.h"

namespace dlrun {
namespace {

std::filesystem::path boardPath() {
  return std::filesystem::temp_directory_path() /
         ("dlrun-progress-test-" + std::to_string(::getpid()));
}

class ProgressBoardTest : public ::testing::Test {
 protected:
  void TearDown() override {
    ::unsetenv("DLRUN_PROGRESS_FILE");
    ::unsetenv("LOCAL_RANK");
  }
};

TEST_F(ProgressBoardTest, AWorkersReportsReachItsSlotOnly) {
  ProgressBoard board(boardPath(), 3);
  ::setenv("DLRUN_PROGRESS_FILE", board.path().c_str(), 1);
  ::setenv("LOCAL_RANK", "2", 1);
  ProgressReporter reporter = ProgressReporter::fromEnvironment();
  ASSERT_TRUE(reporter.active());
  EXPECT_EQ(board.read(2).beats, 0u);  // nothing reported yet
  reporter.step(7, 1);
  reporter.phase(ProgressPhase::Collective);
  const ProgressReading r = board.read(2);
  EXPECT_EQ(r.beats, 2u);
  EXPECT_EQ(r.step, 7);
  EXPECT_EQ(r.epoch, 1);
  EXPECT_EQ(r.phase, ProgressPhase::Collective);
  reporter.step(8, 1);  // a new step is computing again
  EXPECT_EQ(board.read(2).phase, ProgressPhase::Computing);
  EXPECT_EQ(board.read(0).beats, 0u);
  EXPECT_EQ(board.read(1).beats, 0u);
}

TEST_F(ProgressBoardTest, OutsideDlrunReportingDoesNothing) {
  ProgressReporter reporter = ProgressReporter::fromEnvironment();
  EXPECT_FALSE(reporter.active());
  reporter.step(1, 0);  // no crash, no file
}

TEST_F(ProgressBoardTest, AnUnusableSettingIsOneClearError) {
  ProgressBoard board(boardPath(), 2);
  ::setenv("DLRUN_PROGRESS_FILE", board.path().c_str(), 1);
  ::setenv("LOCAL_RANK", "2", 1);  // no such slot
  EXPECT_THROW(ProgressReporter::fromEnvironment(), ConfigError);
  ::setenv("LOCAL_RANK", "x", 1);
  EXPECT_THROW(ProgressReporter::fromEnvironment(), ConfigError);
  ::setenv("LOCAL_RANK", "0", 1);
  ::setenv("DLRUN_PROGRESS_FILE", "/nonexistent/board", 1);
  EXPECT_THROW(ProgressReporter::fromEnvironment(), ConfigError);
}

TEST_F(ProgressBoardTest, TheBoardGoesWithTheAgent) {
  const auto path = boardPath();
  {
    ProgressBoard board(path, 1);
    EXPECT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

}  // namespace
}  // namespace dlrun
