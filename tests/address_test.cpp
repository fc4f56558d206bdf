// store/address.h: resolving with patience for a name that does not resolve yet.
#include "store/address.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace dlrun {
namespace {

TEST(ResolveNumericWaiting, AnAddressOrAKnownNameResolvesAtOnceWithoutWaiting) {
  std::vector<std::string> waits;
  const auto waiting = [&](const std::string& error) { waits.push_back(error); };
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  EXPECT_EQ(resolveNumericWaiting("127.0.0.1", "--master-addr", deadline, waiting), "127.0.0.1");
  EXPECT_EQ(resolveNumericWaiting("::1", "--master-addr", deadline, waiting), "::1");
  const std::string local = resolveNumericWaiting("localhost", "--master-addr", deadline, waiting);
  EXPECT_TRUE(local == "127.0.0.1" || local == "::1") << local;
  EXPECT_TRUE(waits.empty());
}

// RFC 6761: no name under .invalid ever resolves.
TEST(ResolveNumericWaiting, ANameThatNeverResolvesIsWaitedForUntilTheDeadlineThenNamed) {
  std::vector<std::string> waits;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(400);
  try {
    resolveNumericWaiting("master-0.job.invalid", "--master-addr", deadline,
                          [&](const std::string& error) { waits.push_back(error); });
    FAIL() << "resolved a name under .invalid";
  } catch (const NetworkError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("cannot resolve --master-addr 'master-0.job.invalid': "),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("(tried until the rendezvous timeout)"), std::string::npos) << message;
  }
  EXPECT_GE(Clock::now(), deadline);  // it did not give up early
  ASSERT_EQ(waits.size(), 1u);        // one line, at the first miss
  EXPECT_FALSE(waits[0].empty());
}

TEST(ResolveNumericWaiting, ADeadlineAlreadyPastFailsAtTheFirstMissWithoutWaiting) {
  bool waited = false;
  EXPECT_THROW(resolveNumericWaiting("master-0.job.invalid", "--rdzv-endpoint host",
                                     Clock::now() - std::chrono::seconds(1),
                                     [&](const std::string&) { waited = true; }),
               NetworkError);
  EXPECT_FALSE(waited);
}

}  // namespace
}  // namespace dlrun
