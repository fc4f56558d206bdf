// In-process recovery's choice (agents/recovery.h): a failed worker is replaced alone only when
// its loop had marked, no replacement of the node is still recovering, it was not recovering
// itself, and it did not ask for the whole-group restart; and the marks as the loop writes them.
#include "agents/recovery.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "store/memory_store.h"

namespace dlrun::agents::recovery {
namespace {

namespace fs = std::filesystem;

TEST(Recovery, AMarkedWorkerIsReplacedAlone) {
  EXPECT_EQ(refusal({.exitCode = -1, .marked = true}), "");
  EXPECT_EQ(refusal({.exitCode = 1, .marked = true}), "");
}

TEST(Recovery, ASurvivorWhoseOldGroupWouldNotCloseIsReplacedEvenDuringARecovery) {
  EXPECT_EQ(
      refusal(
          {.exitCode = kReplaceCode, .marked = true, .recoveringItself = true, .recovering = {3}}),
      "");
  // The same code from a worker that was not recovering is a second failure like any other.
  EXPECT_EQ(refusal({.exitCode = kReplaceCode, .marked = true, .recovering = {3}}),
            "a failure during the in-process recovery of local rank 3");
}

TEST(Recovery, EveryOtherCaseRestartsTheGroupAndSaysWhy) {
  EXPECT_EQ(refusal({.exitCode = -1, .marked = false}), "it had not started dlrun.recovery's loop");
  EXPECT_EQ(refusal({.exitCode = kFallbackCode, .marked = true}),
            "it asked for the whole-group restart (exit 75)");
  EXPECT_EQ(refusal({.exitCode = -1, .marked = true, .recovering = {3}}),
            "a failure during the in-process recovery of local rank 3");
  EXPECT_EQ(refusal({.exitCode = -1, .marked = true, .done = true}),
            "it had left dlrun.recovery's loop");
  // A survivor dying in its own recovery (a lost node's round kept it): its replacement could
  // not meet where the others are meeting.
  EXPECT_EQ(refusal({.exitCode = -1, .marked = true, .recoveringItself = true}),
            "it failed during its own in-process recovery");
}

TEST(Recovery, AMarkPastTheLastBarrierSaysDone) {
  EXPECT_TRUE(parseMark(R"({"pid": 7, "generation": 1, "done": true})")->done);
  EXPECT_FALSE(parseMark(R"({"pid": 7, "generation": 1})")->done);
}

// A lost node's survivors have 2 s beyond three of their slowest marked step: their step watch
// frees them twice a step on, and a step may be half again as long as it was marked.
TEST(Recovery, KeptWorkersHaveTheirStepWatchsTimeToSeeALostNode) {
  EXPECT_EQ(parseMark(R"({"pid": 7, "step_s": 2.5})")->stepSeconds, 2.5);
  EXPECT_EQ(parseMark(R"({"pid": 7})")->stepSeconds, 0);
  EXPECT_EQ(keepGrace(0), std::chrono::milliseconds(2'000));
  EXPECT_EQ(keepGrace(0.04), std::chrono::milliseconds(2'120));
  EXPECT_EQ(keepGrace(2.5), std::chrono::milliseconds(9'500));
  // A worker's word bounded: a step past an hour counts as an hour, one that is no time as none.
  EXPECT_EQ(keepGrace(1e300), std::chrono::milliseconds(10'802'000));
  EXPECT_EQ(keepGrace(-1), std::chrono::milliseconds(2'000));
  EXPECT_EQ(keepGrace(std::nan("")), std::chrono::milliseconds(2'000));
}

TEST(Recovery, MarksAreThePidsTheLoopWrote) {
  const fs::path dir = fs::temp_directory_path() / ("recovery_test." + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "0") << R"({"pid": 4242, "generation": 0})";
  std::ofstream(dir / "1") << "4242\n";         // not a mark
  std::ofstream(dir / "3") << R"({"pid": 42)";  // half written
  EXPECT_EQ(markedPid(dir, 0), 4242);
  EXPECT_EQ(markedPid(dir, 1), 0);
  EXPECT_EQ(markedPid(dir, 2), 0);  // none yet
  EXPECT_EQ(markedPid(dir, 3), 0);
  fs::remove_all(dir);
}

TEST(Recovery, AReplacementsMarkSaysHowItsRecoveryWent) {
  const auto mark = parseMark(R"({"pid": 7, "generation": 2, "at": 1000.5, "phases":
      {"meet": 0.1, "group": 0.05, "state": 0.2, "total": 0.35}})");
  ASSERT_TRUE(mark);
  EXPECT_EQ(mark->generation, 2);
  EXPECT_EQ(mark->phases.at("state"), 0.2);
  EXPECT_EQ(
      describeRecovery(3, *mark, 999.9),
      "rank 3 recovered in process, generation 2: start 0.25 s, re-form 0.15 s, state 0.20 s; "
      "0.60 s after its failure");
  EXPECT_FALSE(parseMark(R"({"pid": -1})"));
  EXPECT_FALSE(parseMark(R"({"generation": 1})"));
  EXPECT_FALSE(parseMark("[]"));
}

TEST(Recovery, ASurvivorsMarkSaysItIsRecovering) {
  EXPECT_TRUE(parseMark(R"({"pid": 7, "generation": 0, "recovering": true})")->recovering);
  EXPECT_FALSE(parseMark(R"({"pid": 7, "generation": 1})")->recovering);
}

TEST(Recovery, AMoveTellsTheRoundAndWorldFirstThenEachRanksNewNumberPlusOne) {
  // Round 7 kept ranks 4-5 of 6 as ranks 2-3 of 4, in generation 3's keys as torch's client
  // names them.
  using Keys = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(moving(3, 7, 4, 2, 2, 4), (Keys{{"/dlrun/recovery/3/round7/world", "4"},
                                            {"/dlrun/recovery/3/move/4", "7000003"},
                                            {"/dlrun/recovery/3/move/5", "7000004"}}));
  EXPECT_TRUE(kGenerationKey.starts_with("/dlrun/recovery/"));
}

TEST(Recovery, NewsIsCountedAndEachCountHasItsOwnKeyForTheLoopsToWaitOn) {
  // A loop that read the count 0 waits for <news>/1, which the first news sets, and then for
  // <news>/2, which only the next sets.
  MemoryStore store;
  const std::string news = newsKey(4);
  EXPECT_EQ(news, "/dlrun/recovery/4/news");
  EXPECT_EQ(store.add(news, 0), 0);
  tellNews(store, news);
  EXPECT_TRUE(store.waitFor({news + "/1"}, std::chrono::milliseconds(0)));
  EXPECT_FALSE(store.check({news + "/2"}));
  tellNews(store, news);
  EXPECT_EQ(store.add(news, 0), 2);
  EXPECT_TRUE(store.check({news + "/2"}));
}

}  // namespace
}  // namespace dlrun::agents::recovery
