// Each rank's pace as its agent publishes it (agents/rank_rates.h), and the sampler's reading of
// the figures a worker names (agents/progress_sampler.h). Time is the test's.
#include <gtest/gtest.h>

#include "agents/progress_sampler.h"
#include "agents/rank_rates.h"

namespace dlrun::agents {
namespace {

ProgressReading at(int64_t step, double loss = 0) {
  return {.beats = static_cast<uint64_t>(step + 1),
          .step = step,
          .results = loss > 0 ? kReportedLoss : 0u,
          .loss = loss};
}

TEST(RankRates, APaceIsKnownOnceReportsSettleThenTakenOverTheWindow) {
  RankRates rates;
  rates.reset(2, 8, 2);
  // Local rank 0 steps 4 a second; local rank 1 has reported nothing.
  auto record = rates.observe({at(0, 1.5), {}}, {}, 0, 1000);
  EXPECT_EQ(record.round, 2);
  EXPECT_EQ(record.time, 1000);
  ASSERT_EQ(record.ranks.size(), 1u);  // only the ranks that reported
  EXPECT_EQ(record.ranks[0].rank, 8);
  EXPECT_EQ(record.ranks[0].stepsPerSecond, -1);  // not known yet
  EXPECT_EQ(record.ranks[0].loss, 1.5);
  for (int i = 1; i <= 20; ++i) record = rates.observe({at(2 * i), {}}, {}, 0.5 * i, 1000);
  EXPECT_DOUBLE_EQ(record.ranks[0].stepsPerSecond, 4);
  EXPECT_EQ(record.ranks[0].sinceStep, 0);
  // It stops: the pace falls over the window and the time since its step grows.
  for (int i = 21; i <= 24; ++i) record = rates.observe({at(40), {}}, {}, 0.5 * i, 1000);
  EXPECT_DOUBLE_EQ(record.ranks[0].sinceStep, 2);
  EXPECT_LT(record.ranks[0].stepsPerSecond, 4);
  for (int i = 25; i <= 40; ++i) record = rates.observe({at(40), {}}, {}, 0.5 * i, 1000);
  EXPECT_EQ(record.ranks[0].stepsPerSecond, 0);
}

TEST(RankRates, AWorkerRestartedAloneStartsItsPaceAgain) {
  RankRates rates;
  rates.reset(0, 0, 1);
  for (int i = 0; i <= 10; ++i) rates.observe({at(100 + i)}, {}, i, 0);
  const auto record = rates.observe({at(1)}, {}, 11, 0);  // its steps start over
  EXPECT_EQ(record.ranks[0].stepsPerSecond, -1);
  EXPECT_EQ(record.ranks[0].step, 1);
}

TEST(RankRates, NamedFiguresGoWithTheirRank) {
  RankRates rates;
  rates.reset(0, 4, 2);
  const auto record = rates.observe({at(1), at(2)}, {{}, {{"lr", 0.1}}}, 0, 0);
  ASSERT_EQ(record.ranks.size(), 2u);
  EXPECT_TRUE(record.ranks[0].metrics.empty());
  EXPECT_EQ(record.ranks[1].metrics.at("lr"), 0.1);
}

TEST(RankRates, ARecordIsWorthWritingWhenAStepOrResultChangedOrAtTheRefresh) {
  control::NodeProgress a{.time = 10, .round = 1, .ranks = {{.rank = 0, .step = 5}}};
  control::NodeProgress b = a;
  b.time = 11;
  b.ranks[0].sinceStep = 1;  // only its age changed
  EXPECT_FALSE(progressChanged(a, b, 5));
  b.time = 15;
  EXPECT_TRUE(progressChanged(a, b, 5));
  b.time = 11;
  b.ranks[0].step = 6;
  EXPECT_TRUE(progressChanged(a, b, 5));
  b.ranks[0].step = 5;
  b.ranks[0].exited = true;
  EXPECT_TRUE(progressChanged(a, b, 5));
}

TEST(ReportedMetrics, NumbersByNameAtMostEightAndNothingFromGarbage) {
  EXPECT_EQ(parseReportedMetrics(R"({"lr":0.1,"tokens":5e3})"),
            (std::map<std::string, double>{{"lr", 0.1}, {"tokens", 5000}}));
  EXPECT_TRUE(parseReportedMetrics("not json").empty());
  EXPECT_TRUE(parseReportedMetrics("[1,2]").empty());
  EXPECT_EQ(parseReportedMetrics(R"({"s":"text","n":null,"ok":1})"),
            (std::map<std::string, double>{{"ok", 1}}));
  EXPECT_TRUE(
      parseReportedMetrics(R"({"a_name_that_is_far_too_long_to_show_anywhere":1})").empty());
  std::string many = "{";
  for (int i = 0; i < 12; ++i)
    many += (i ? "," : "") + std::string("\"m") + std::to_string(i) + "\":1";
  EXPECT_EQ(parseReportedMetrics(many + "}").size(), 8u);
}

}  // namespace
}  // namespace dlrun::agents
