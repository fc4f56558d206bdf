// What the kernel lets a node's start use (agents/limits.h): exec sizes against the limits of
// fs/exec.c, the descriptor budget and its one-line refusal, and the process's own limits.
#include "agents/limits.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dlrun::agents {
namespace {

constexpr size_t kKiB = 1024, kMiB = 1024 * 1024;

TEST(Limits, ExecLimitsFollowTheStackLimit) {
  const ExecLimits usual = ExecLimits::forStack(8 * kMiB, 4096);
  EXPECT_EQ(usual.maxString, 128 * kKiB);                              // MAX_ARG_STRLEN
  EXPECT_EQ(usual.maxTotal, 2 * kMiB);                                 // a quarter of 8 MiB
  EXPECT_EQ(ExecLimits::forStack(SIZE_MAX, 4096).maxTotal, 6 * kMiB);  // unlimited: 3/4 of 8 MiB
  EXPECT_EQ(ExecLimits::forStack(256 * kKiB, 4096).maxTotal, 128 * kKiB);  // never below ARG_MAX
  EXPECT_GE(ExecLimits::ofThisProcess().maxString, 128 * kKiB);
}

TEST(Limits, ExecSizesCountEachStringWithItsNul) {
  ExecSizes sizes;
  sizes.add(3);
  sizes.add(10);
  ExecSizes more;
  more.add(0);
  sizes.add(more);
  EXPECT_EQ(sizes.count, 3u);
  EXPECT_EQ(sizes.bytes, 4u + 11u + 1u);
  EXPECT_EQ(sizes.longest, 11u);
}

TEST(Limits, AnExecOverEitherLimitIsNamed) {
  const ExecLimits limits = ExecLimits::forStack(8 * kMiB, 4096);
  ExecSizes fits;
  fits.add(128 * kKiB - 1);  // with its NUL, exactly the limit
  EXPECT_EQ(execProblem(fits, limits), std::nullopt);

  ExecSizes longString;
  longString.add(128 * kKiB);
  const auto tooLong = execProblem(longString, limits);
  ASSERT_TRUE(tooLong);
  EXPECT_NE(tooLong->find("131072 bytes"), std::string::npos) << *tooLong;

  ExecSizes many;
  for (int i = 0; i < 20; ++i) many.add(120 * kKiB);
  const auto tooMuch = execProblem(many, limits);
  ASSERT_TRUE(tooMuch);
  EXPECT_NE(tooMuch->find("ulimit -s"), std::string::npos) << *tooMuch;
  EXPECT_NE(tooMuch->find(std::to_string(2 * kMiB)), std::string::npos) << *tooMuch;

  // The pointers count too: a million empty strings take 9 MB.
  ExecSizes pointers;
  for (int i = 0; i < 1'000'000; ++i) pointers.add(0);
  EXPECT_TRUE(execProblem(pointers, ExecLimits::forStack(SIZE_MAX, 4096)));
}

TEST(Limits, TheDescriptorBudgetIsRefusedInOneLineNamingTheLimit) {
  const DescriptorNeeds needs{
      .inUse = 10, .workers = 8192, .workerFiles = 16384, .storeClients = 8192};
  EXPECT_EQ(needs.total(), 10 + DescriptorNeeds::kReserve + 16384 + 8192);
  EXPECT_EQ(descriptorProblem(needs, needs.total()), std::nullopt);
  const auto problem = descriptorProblem(needs, 20000);
  ASSERT_TRUE(problem);
  EXPECT_EQ(problem->find('\n'), std::string::npos);
  for (const std::string& part :
       std::vector<std::string>{"8192 workers", std::to_string(needs.total()), "limit of 20000",
                                "ulimit -n", "--nproc-per-node"})
    EXPECT_NE(problem->find(part), std::string::npos) << part << " in: " << *problem;
}

TEST(Limits, TheSoftDescriptorLimitIsRaisedToTheHardOneAndWorkersGetTheOldOneBack) {
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_max < 64) GTEST_SKIP() << "a hard limit below 64";
  const rlim_t lowered = files.rlim_max / 2;
  rlimit low = files;
  low.rlim_cur = lowered;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  const size_t raised = raiseDescriptorLimit();
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  EXPECT_EQ(files.rlim_cur, files.rlim_max);
  if (files.rlim_max != RLIM_INFINITY) {
    EXPECT_EQ(raised, files.rlim_max);
  }
  EXPECT_EQ(workerDescriptorLimit(), std::optional<size_t>(lowered));
}

TEST(Limits, OpenDescriptorsAreCounted) {
  const int before = openDescriptors();
  EXPECT_GE(before, 3);
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(openDescriptors(), before + 1);
  ::close(fd);
}

}  // namespace
}  // namespace dlrun::agents
