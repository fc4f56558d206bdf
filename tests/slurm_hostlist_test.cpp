// Slurm hostlists: what libslurm expands (zero padding kept, suffixes added, order kept) and
// what the check refuses before libslurm sees it.
#include "slurm/hostlist.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::slurm {
namespace {

using Hosts = std::vector<std::string>;

std::string errorOf(const std::string& expression) {
  try {
    expandHostlist(expression, "SLURM_JOB_NODELIST");
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError for '" << expression << "'";
  return {};
}

TEST(SlurmHostlistTest, ExpandsRangesAndListsKeepingZeroPadding) {
  EXPECT_EQ(expandHostlist("node[01-04,7]", "v"),
            (Hosts{"node01", "node02", "node03", "node04", "node7"}));
  EXPECT_EQ(expandHostlist("node[08-10]", "v"), (Hosts{"node08", "node09", "node10"}));
}

TEST(SlurmHostlistTest, ExpandsSeveralItemsInOrder) {
  EXPECT_EQ(expandHostlist("gpu-[1-2],cpu1", "v"), (Hosts{"gpu-1", "gpu-2", "cpu1"}));
  EXPECT_EQ(expandHostlist("b,a", "v"), (Hosts{"b", "a"}));
  EXPECT_EQ(expandHostlist("x[3,1]", "v"), (Hosts{"x3", "x1"}));
}

TEST(SlurmHostlistTest, AddsTheSuffixThatFollowsTheBrackets) {
  EXPECT_EQ(expandHostlist("a[1-3]-ib", "v"), (Hosts{"a1-ib", "a2-ib", "a3-ib"}));
  EXPECT_EQ(expandHostlist("r[1-2]-n[1-2].ib", "v"),
            (Hosts{"r1-n1.ib", "r1-n2.ib", "r2-n1.ib", "r2-n2.ib"}));
}

TEST(SlurmHostlistTest, PlainNamesNeedNoBrackets) {
  EXPECT_EQ(expandHostlist("node1", "v"), (Hosts{"node1"}));
  EXPECT_EQ(expandHostlist("login-01.cluster_a", "v"), (Hosts{"login-01.cluster_a"}));
}

TEST(SlurmHostlistTest, CountsWithoutExpanding) {
  EXPECT_EQ(checkHostlist("node[01-04,7],gpu-[1-2]", "v"), 7u);
  EXPECT_EQ(checkHostlist("r[1-4]-n[1-8]", "v"), 32u);
}

TEST(SlurmHostlistTest, RefusesAnUnclosedBracket) {
  const std::string message = errorOf("x[1-");
  EXPECT_EQ(message,
            "SLURM_JOB_NODELIST='x[1-' is not a Slurm hostlist: '[' at character 2 "
            "is never closed");
  EXPECT_NE(errorOf("x[").find("never closed"), std::string::npos);
  EXPECT_NE(errorOf("x[1,2").find("never closed"), std::string::npos);
}

TEST(SlurmHostlistTest, RefusesAReversedRange) {
  EXPECT_NE(errorOf("x[3-1]").find("the range 3-1 is reversed"), std::string::npos);
}

TEST(SlurmHostlistTest, RefusesBoundsThatAreNotNumbers) {
  EXPECT_NE(errorOf("x[a-b]").find("'a' at character 3 is not a range bound"), std::string::npos);
  EXPECT_NE(errorOf("x[]").find("']' at character 3 is not a range bound"), std::string::npos);
  EXPECT_NE(errorOf("x[1,,2]").find("',' at character 5 is not a range bound"), std::string::npos);
  EXPECT_NE(errorOf("x[1-2-3]").find("'-' at character 6 follows a range where"),
            std::string::npos);
}

TEST(SlurmHostlistTest, RefusesStrayBracketsAndCharacters) {
  EXPECT_NE(errorOf("x1]").find("']' at character 3 has no '['"), std::string::npos);
  EXPECT_NE(errorOf("x[[1]").find("'[' at character 3 is not a range bound"), std::string::npos);
  EXPECT_NE(errorOf("a b").find("' ' at character 2 is not allowed"), std::string::npos);
  EXPECT_NE(errorOf("a:1").find("':' at character 2 is not allowed"), std::string::npos);
}

TEST(SlurmHostlistTest, RefusesEmptyNames) {
  EXPECT_NE(errorOf("").find("it is empty"), std::string::npos);
  EXPECT_NE(errorOf("a,,b").find("an empty host name at character 3"), std::string::npos);
  EXPECT_NE(errorOf("a,").find("an empty host name at character 3"), std::string::npos);
}

TEST(SlurmHostlistTest, RefusesMoreHostsThanTheLimitBeforeExpanding) {
  EXPECT_NE(errorOf("x[0-70000]").find("more than 65536 hosts"), std::string::npos);
  EXPECT_NE(errorOf("r[1-1000]-n[1-1000]").find("more than 65536 hosts"), std::string::npos);
  EXPECT_NE(errorOf("x[1-999999999999]").find("too long"), std::string::npos);
  EXPECT_EQ(checkHostlist("x[1-65536]", "v"), kMaxHosts);
}

}  // namespace
}  // namespace dlrun::slurm
