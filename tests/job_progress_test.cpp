// The job's view, its pure parts (control/state/): the progress record's codec and the
// straggler rule.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/error.h"
#include "control/state/control_state.h"
#include "control/state/progress_record.h"
#include "control/state/stragglers.h"

namespace dlrun::control {
namespace {

TEST(ProgressRecord, RoundTripsEveryField) {
  NodeProgress p{.time = 1000.5, .round = 3, .period = 2.5};
  p.ranks.push_back({.rank = 4,
                     .step = 120,
                     .epoch = 2,
                     .stepsPerSecond = 3.5,
                     .sinceStep = 0.25,
                     .loss = 0.125,
                     .samples = 7680,
                     .metrics = {{"lr", 0.01}},
                     .exited = true});
  p.ranks.push_back({.rank = 5, .step = 7, .stepsPerSecond = -1, .accuracy = 0.9});
  const NodeProgress back = decodeNodeProgress(encode(p));
  EXPECT_EQ(back.time, 1000.5);
  EXPECT_EQ(back.round, 3);
  EXPECT_EQ(back.period, 2.5);
  ASSERT_EQ(back.ranks.size(), 2u);
  EXPECT_EQ(back.ranks[0].rank, 4);
  EXPECT_EQ(back.ranks[0].step, 120);
  EXPECT_EQ(back.ranks[0].epoch, 2);
  EXPECT_EQ(back.ranks[0].stepsPerSecond, 3.5);
  EXPECT_EQ(back.ranks[0].sinceStep, 0.25);
  EXPECT_EQ(back.ranks[0].loss, 0.125);
  EXPECT_FALSE(back.ranks[0].accuracy);
  EXPECT_EQ(back.ranks[0].samples, 7680);
  EXPECT_EQ(back.ranks[0].metrics.at("lr"), 0.01);
  EXPECT_TRUE(back.ranks[0].exited);
  EXPECT_FALSE(back.ranks[1].loss);
  EXPECT_EQ(back.ranks[1].accuracy, 0.9);
  EXPECT_FALSE(back.ranks[1].exited);
  EXPECT_EQ(back.ranks[1].stepsPerSecond, -1);
}

TEST(ProgressRecord, ADivergedLossIsSentAsNone) {
  NodeProgress p{.time = 1, .round = 0};
  p.ranks.push_back({.rank = 0,
                     .loss = std::numeric_limits<double>::infinity(),
                     .metrics = {{"bad", std::nan("")}, {"good", 1}}});
  const NodeProgress back = decodeNodeProgress(encode(p));
  EXPECT_FALSE(back.ranks[0].loss);
  EXPECT_FALSE(back.ranks[0].metrics.contains("bad"));
  EXPECT_EQ(back.ranks[0].metrics.at("good"), 1);
}

TEST(ProgressRecord, MalformedRecordsAreProtocolErrors) {
  for (const char* text :
       {"", "[]", "{}", R"({"t":1,"round":0,"ranks":[]})", R"({"t":1,"round":0,"p":1,"ranks":[1]})",
        R"({"t":1,"round":0,"p":1,"ranks":[{"r":0}]})",
        R"({"t":1,"round":0,"p":1,"ranks":[{"r":0,"s":1,"e":0,"v":1,"a":0,"n":0,"l":"x"}]})"})
    EXPECT_THROW(decodeNodeProgress(text), ProtocolError) << text;
}

TEST(ProgressRecord, TheTimeSinceAStepGrowsOnlyPastTheRecordsPeriod) {
  const RankProgress r{.sinceStep = 2};
  const NodeProgress written{.time = 100, .period = 4};
  EXPECT_EQ(secondsSinceStep(r, written, 100), 2);
  EXPECT_EQ(secondsSinceStep(r, written, 104.5), 2);  // the next record may be on its way
  EXPECT_EQ(secondsSinceStep(r, written, 110), 2 + 10 - 4.5);
  EXPECT_EQ(secondsSinceStep(r, written, 50), 2);  // a reader's clock behind the writer's
}

TEST(ProgressRecord, ALargeJobsAgentsWriteLessOftenSoTheJobStaysWithinItsRate) {
  EXPECT_EQ(recordPeriod(1), 1);
  EXPECT_EQ(recordPeriod(static_cast<int>(kRecordsPerSecond)), 1);
  EXPECT_EQ(recordPeriod(1000), 1000 / kRecordsPerSecond);
  for (int agents : {1, 50, 200, 201, 1000, 12500})
    EXPECT_LE(agents / recordPeriod(agents), kRecordsPerSecond + 1e-9) << agents;
}

TEST(ProgressRecord, KeysLiveUnderTheControlPlanes) {
  const Keys keys("job");
  EXPECT_EQ(keys.progress(7), "dlrun/job/ctl/prog/7");
  EXPECT_EQ(keys.stragglers(), "dlrun/job/ctl/stragglers");
}

TEST(Stragglers, MedianOfOddEvenAndNone) {
  EXPECT_EQ(median({}), 0);
  EXPECT_EQ(median({3, 1, 2}), 2);
  EXPECT_EQ(median({4, 1, 3, 2}), 2.5);
}

std::vector<RankRate> rates(std::vector<double> perRank) {
  std::vector<RankRate> out;
  for (size_t r = 0; r < perRank.size(); ++r)
    out.push_back({.rank = static_cast<int>(r),
                   .node = "n" + std::to_string(r / 2),
                   .stepsPerSecond = perRank[r]});
  return out;
}

TEST(Stragglers, ARankBelowTheLineForTheWindowIsNamedOnceThenCleared) {
  StragglerTracker t({.fraction = 0.7, .window = 30});
  EXPECT_TRUE(t.observe(rates({10, 10, 10, 6}), 0).named.empty());  // below since 0
  EXPECT_TRUE(t.observe(rates({10, 10, 10, 6}), 29).named.empty());
  const auto named = t.observe(rates({10, 10, 10, 6}), 30);
  ASSERT_EQ(named.named.size(), 1u);
  EXPECT_EQ(named.named[0].rank, 3);
  EXPECT_EQ(named.named[0].node, "n1");
  EXPECT_EQ(named.named[0].median, 10);
  EXPECT_EQ(named.named[0].below, 0);
  EXPECT_TRUE(t.observe(rates({10, 10, 10, 6}), 40).named.empty());  // named once
  EXPECT_EQ(t.named().size(), 1u);
  EXPECT_EQ(describe(t.named().at(3), 40),
            "rank 3 on n1 at 6.00 steps/s, 0.60 of the median 10.00, for 40 s");
  const auto back = t.observe(rates({10, 10, 10, 9}), 41);
  ASSERT_EQ(back.cleared.size(), 1u);
  EXPECT_EQ(back.cleared[0].rank, 3);
  EXPECT_EQ(back.cleared[0].stepsPerSecond, 9);
  EXPECT_TRUE(t.named().empty());
}

TEST(Stragglers, ARankThatComesUpBeforeTheWindowStartsAgain) {
  StragglerTracker t({.fraction = 0.7, .window = 30});
  t.observe(rates({10, 10, 10, 5}), 0);
  t.observe(rates({10, 10, 10, 10}), 20);  // back up: its time below starts over
  t.observe(rates({10, 10, 10, 5}), 25);
  EXPECT_TRUE(t.observe(rates({10, 10, 10, 5}), 50).named.empty());
  EXPECT_EQ(t.observe(rates({10, 10, 10, 5}), 55).named.size(), 1u);
}

TEST(Stragglers, NoJudgementWithoutTwoKnownRatesOrAMovingJob) {
  StragglerTracker t({.fraction = 0.7, .window = 1});
  t.observe(rates({10, -1, -1}), 0);  // one known rate: no median to speak of
  EXPECT_TRUE(t.observe(rates({10, -1, -1}), 5).named.empty());
  t.observe(rates({0, 0, 0}), 10);  // the whole job stalled: a hang's business
  EXPECT_TRUE(t.observe(rates({0, 0, 0}), 20).named.empty());
  StragglerTracker off({.fraction = 0, .window = 1});
  off.observe(rates({10, 10, 1}), 0);
  EXPECT_TRUE(off.observe(rates({10, 10, 1}), 5).named.empty());
}

TEST(Stragglers, AStalledRankAmongMovingOnesIsNamed) {
  StragglerTracker t({.fraction = 0.7, .window = 10});
  t.observe(rates({5, 5, 0}), 0);
  EXPECT_EQ(t.observe(rates({5, 5, 0}), 10).named.size(), 1u);
}

TEST(Stragglers, ARankThatLeftIsForgottenAndAResetStartsAfresh) {
  StragglerTracker t({.fraction = 0.7, .window = 1});
  t.observe(rates({10, 10, 1}), 0);
  ASSERT_EQ(t.observe(rates({10, 10, 1}), 1).named.size(), 1u);
  const auto gone = t.observe(rates({10, 10}), 2);
  EXPECT_EQ(gone.cleared.size(), 1u);
  t.observe(rates({10, 10, 1}), 3);
  t.reset();
  EXPECT_TRUE(t.observe(rates({10, 10, 1}), 3.5).named.empty());  // its time below restarted
}

TEST(Stragglers, WithoutAMedianTheNamedStayUntilTheyAreGone) {
  StragglerTracker t({.fraction = 0.7, .window = 1});
  t.observe(rates({10, 10, 10, 2}), 0);
  ASSERT_EQ(t.observe(rates({10, 10, 10, 2}), 1).named.size(), 1u);
  // The fast ranks finished: one known pace is no median, so rank 3 is neither cleared nor
  // said to keep pace.
  std::vector<RankRate> alone{{.rank = 3, .node = "n1", .stepsPerSecond = 2}};
  const auto still = t.observe(alone, 2);
  EXPECT_TRUE(still.cleared.empty());
  EXPECT_EQ(t.named().size(), 1u);
  const auto gone = t.observe({}, 3);
  ASSERT_EQ(gone.cleared.size(), 1u);
  EXPECT_LT(gone.cleared[0].stepsPerSecond, 0);  // gone, not back to pace
  EXPECT_TRUE(t.named().empty());
}

TEST(Stragglers, TheListRoundTripsAndMalformedOnesAreProtocolErrors) {
  std::map<int, Straggler> named{
      {5, {.rank = 5, .node = "h", .stepsPerSecond = 1, .median = 4, .below = 12}}};
  const auto back = decodeStragglers(encodeStragglers(named));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].rank, 5);
  EXPECT_EQ(back[0].node, "h");
  EXPECT_EQ(back[0].median, 4);
  EXPECT_EQ(back[0].below, 12);
  EXPECT_TRUE(decodeStragglers(encodeStragglers({})).empty());
  EXPECT_THROW(decodeStragglers("{}"), ProtocolError);
  EXPECT_THROW(decodeStragglers(R"({"stragglers":[3]})"), ProtocolError);
}

}  // namespace
}  // namespace dlrun::control
