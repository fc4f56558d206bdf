// What a waiting agent says: at once on a change, at most every 10 s otherwise, nothing once
// the minimum is there; and whom it names when it gives up.
#include "rendezvous/waiting_report.h"

#include <gtest/gtest.h>

namespace dlrun::rendezvous {
namespace {

using namespace std::chrono_literals;

TEST(WaitingReport, SpeaksAtOnceOnAChangeAndEvery10SecondsOtherwise) {
  WaitingReport report(3);
  const Clock::time_point t0{};
  const auto giveUp = t0 + 600s;
  EXPECT_EQ(report.update(1, t0, giveUp),
            "waiting for 2 more node(s): 1 of 3 joined, giving up in 600 s");
  EXPECT_EQ(report.update(1, t0 + 9s, giveUp), std::nullopt);
  EXPECT_EQ(report.update(2, t0 + 9500ms, giveUp),
            "waiting for 1 more node(s): 2 of 3 joined, giving up in 591 s");  // rounded up
  EXPECT_EQ(report.update(2, t0 + 19s, giveUp), std::nullopt);
  EXPECT_EQ(report.update(2, t0 + 19500ms, giveUp),
            "waiting for 1 more node(s): 2 of 3 joined, giving up in 581 s");
  EXPECT_EQ(report.update(3, t0 + 20s, giveUp), std::nullopt);  // the last call runs now
}

TEST(WaitingReport, NeverCountsBelowZeroSeconds) {
  WaitingReport report(2);
  const Clock::time_point t0{};
  EXPECT_EQ(report.update(0, t0 + 5s, t0),
            "waiting for 2 more node(s): 0 of 2 joined, giving up in 0 s");
}

TEST(MissingNodes, AreTheExpectedOnesThatDidNotJoinInTheirOrder) {
  EXPECT_EQ(missingNodes({"a (1)", "b (2)", "c (3)"}, {"c (3)", "a (1)", "d (4)"}),
            std::vector<std::string>{"b (2)"});
  EXPECT_TRUE(missingNodes({}, {"a (1)"}).empty());
  EXPECT_EQ(missingNodes({"a (1)", "b (2)"}, {}), (std::vector<std::string>{"a (1)", "b (2)"}));
}

}  // namespace
}  // namespace dlrun::rendezvous
