// A crash loop (agents/crash_loop.h): failed attempts in a row without the job's step advancing
// end the job; one that advances starts the count again; without reports, short lives count.
#include "agents/crash_loop.h"

#include <gtest/gtest.h>

namespace dlrun::agents {
namespace {

TEST(CrashLoop, AttemptsThatNeverGetPastAStepEndTheJob) {
  CrashLoop loop(3, 60);
  EXPECT_FALSE(loop.ended({.attempt = 1, .step = 41, .livedSeconds = 100}));  // progress
  EXPECT_FALSE(loop.ended({.attempt = 2, .step = 41, .livedSeconds = 100}));
  EXPECT_FALSE(loop.ended({.attempt = 3, .step = 40, .livedSeconds = 100}));
  EXPECT_FALSE(loop.ended({.attempt = 3, .step = 40, .livedSeconds = 100}));  // counted once
  EXPECT_TRUE(loop.ended({.attempt = 4, .step = 41, .livedSeconds = 100}));
  EXPECT_EQ(loop.describe(), "the last 3 attempts ended without a step past 41");
}

TEST(CrashLoop, AnAttemptThatAdvancesStartsTheCountAgain) {
  CrashLoop loop(2, 60);
  EXPECT_FALSE(loop.ended({.attempt = 1, .step = 10}));
  EXPECT_FALSE(loop.ended({.attempt = 2, .step = 10}));
  EXPECT_FALSE(loop.ended({.attempt = 3, .step = 11}));
  EXPECT_FALSE(loop.ended({.attempt = 4, .step = 11}));
  EXPECT_TRUE(loop.ended({.attempt = 5}));  // nothing reported, at once: no progress either
}

TEST(CrashLoop, WithoutReportsShortLivesCount) {
  CrashLoop loop(3, 60);
  EXPECT_FALSE(loop.ended({.attempt = 1, .livedSeconds = 2.5}));
  EXPECT_FALSE(loop.ended({.attempt = 2, .livedSeconds = 300}));  // long: it may have trained
  EXPECT_FALSE(loop.ended({.attempt = 3, .livedSeconds = 1}));
  EXPECT_FALSE(loop.ended({.attempt = 4, .livedSeconds = 3.25}));
  EXPECT_TRUE(loop.ended({.attempt = 5, .livedSeconds = 2}));
  EXPECT_EQ(loop.describe(),
            "the last 3 attempts ended within 3.2 s of their start, no step "
            "reported");
}

TEST(CrashLoop, ZeroAttemptsIsOff) {
  CrashLoop loop(0, 60);
  for (uint64_t attempt = 1; attempt < 10; ++attempt)
    EXPECT_FALSE(loop.ended({.attempt = attempt}));
}

}  // namespace
}  // namespace dlrun::agents
