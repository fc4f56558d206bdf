// In-process recovery's choice (agents/recovery.h): a failed worker is replaced alone only when
// its loop had marked, no replacement of the node is still recovering, and it did not ask for
// the whole-group restart; and the marks as the loop writes them.
#include "agents/recovery.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace dlrun::agents::recovery {
namespace {

namespace fs = std::filesystem;

TEST(Recovery, AMarkedWorkerIsReplacedAlone) {
  EXPECT_EQ(refusal({.exitCode = -1, .marked = true}), "");
  EXPECT_EQ(refusal({.exitCode = 1, .marked = true}), "");
}

TEST(Recovery, EveryOtherCaseRestartsTheGroupAndSaysWhy) {
  EXPECT_EQ(refusal({.exitCode = -1, .marked = false}), "it had not started dlrun.recovery's loop");
  EXPECT_EQ(refusal({.exitCode = kFallbackCode, .marked = true}),
            "it asked for the whole-group restart (exit 75)");
  EXPECT_EQ(refusal({.exitCode = -1, .marked = true, .recovering = {3}}),
            "a failure during the in-process recovery of local rank 3");
}

TEST(Recovery, MarksAreThePidsTheLoopWrote) {
  const fs::path dir = fs::temp_directory_path() / ("recovery_test." + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "0") << "4242\n";
  std::ofstream(dir / "1") << "not a pid\n";
  EXPECT_EQ(markedPid(dir, 0), 4242);
  EXPECT_EQ(markedPid(dir, 1), 0);
  EXPECT_EQ(markedPid(dir, 2), 0);  // none yet
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dlrun::agents::recovery
