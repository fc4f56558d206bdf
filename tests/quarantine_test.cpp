// Repeat offenders put out (agents/quarantine.h): N failures of a node's workers within the
// window put it out for the cool-down; failures spread wider than the window do not.
#include "agents/quarantine.h"

#include <gtest/gtest.h>

namespace dlrun::agents {
namespace {

using std::chrono::seconds;

TEST(Quarantine, NFailuresWithinTheWindowPutTheNodeOutForTheCoolDown) {
  Quarantine quarantine({.after = 3, .window = seconds(60), .coolDown = seconds(30)});
  const Clock::time_point t0{};
  quarantine.failed(t0);
  quarantine.failed(t0 + seconds(10));
  EXPECT_EQ(quarantine.reason(t0 + seconds(11)), std::nullopt);
  quarantine.failed(t0 + seconds(20));
  EXPECT_EQ(quarantine.reason(t0 + seconds(21)),
            "quarantined: its workers failed 3 times within 60 s (--quarantine-after); let in "
            "again in 29 s");
  EXPECT_EQ(quarantine.reason(t0 + seconds(50)), std::nullopt);  // the cool-down is over
  quarantine.failed(t0 + seconds(55));                           // a clean record after it
  EXPECT_EQ(quarantine.reason(t0 + seconds(56)), std::nullopt);
}

TEST(Quarantine, FailuresSpreadWiderThanTheWindowDoNot) {
  Quarantine quarantine({.after = 2, .window = seconds(60), .coolDown = seconds(30)});
  const Clock::time_point t0{};
  quarantine.failed(t0);
  quarantine.failed(t0 + seconds(61));
  EXPECT_EQ(quarantine.reason(t0 + seconds(62)), std::nullopt);
  quarantine.failed(t0 + seconds(100));
  EXPECT_NE(quarantine.reason(t0 + seconds(101)), std::nullopt);
}

TEST(Quarantine, ZeroIsOff) {
  Quarantine quarantine({.after = 0});
  for (int i = 0; i < 10; ++i) quarantine.failed(Clock::time_point{} + seconds(i));
  EXPECT_EQ(quarantine.reason(Clock::time_point{} + seconds(10)), std::nullopt);
}

}  // namespace
}  // namespace dlrun::agents
