// Slurm hostlists: what libslurm expands (zero padding kept, suffixes added, order kept) and
// what the check refuses before libslurm sees it.
#include "slurm/hostlist.h"

#include <gtest/gtest.h>

#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "common/error.h"
#include "slurm/libslurm.h"

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

// dlrun's own expansion, for nodes without libslurm, against libslurm's on the same inputs. The
// test machine has Slurm's library (scripts/setup.sh --tests), so the comparison always runs.
Hosts own(const std::string& expression) {
  return expandHostlist(expression, "SLURM_JOB_NODELIST", Expander::Own);
}

Hosts libslurms(const std::string& expression) {
  return expandHostlist(expression, "SLURM_JOB_NODELIST", Expander::Libslurm);
}

TEST(SlurmHostlistTest, LibslurmOpensAtRunTimeFromTheNodesOwnLibrary) {
  EXPECT_NE(libslurmName(), "") << "no libslurm.so.NN on this test machine";
  EXPECT_EQ(libslurms("n[1-2]"), (Hosts{"n1", "n2"}));
}

TEST(SlurmHostlistTest, DlrunsOwnExpansionIsLibslurmsOnChosenCases) {
  for (const std::string expression :
       {"node1", "n[1-3]", "n[08-11]", "n[001-3,7,010-012]", "gpu-[1-2],cpu[3],login",
        "a[1-2]b[3-4]", "rack[1-2]-node[01-02]", "x[9-10]", "x[0-1]", "x[00-00]", "n[7,1-2]",
        "node[1-3]-ib,node[5]-ib", "a.b_c-d[1-2]", "n[1-3],n[2-4]", "n[099-101]", "n[1-010]"}) {
    EXPECT_EQ(own(expression), libslurms(expression)) << expression;
  }
}

TEST(SlurmHostlistTest, DlrunsOwnExpansionIsLibslurmsOnRandomLists) {
  std::mt19937 random(45);  // seeded: a failure names its input and repeats
  auto pick = [&](int n) { return static_cast<int>(random() % static_cast<unsigned>(n)); };
  const char* names[] = {"n", "node", "gpu-", "r.a_c-", "x"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string expression;
    for (int item = 0, items = 1 + pick(3); item < items; ++item) {
      if (item) expression += ',';
      expression += names[pick(5)];
      for (int group = 0, groups = pick(3); group < groups; ++group) {
        if (group) expression += "-r";
        expression += '[';
        for (int range = 0, ranges = 1 + pick(3); range < ranges; ++range) {
          const int width = pick(3);  // leading zeros
          const int low = pick(120);
          std::string bound = std::to_string(low);
          bound.insert(0, static_cast<size_t>(width), '0');
          expression += (range ? "," : "") + bound;
          if (pick(2)) expression += "-" + std::to_string(low + pick(15));
        }
        expression += ']';
      }
      if (pick(5) == 0) expression += "-ib";
    }
    ASSERT_EQ(own(expression), libslurms(expression)) << expression;
  }
}

// A node without libslurm: a fresh process (slurm_hostlist_probe) in a mount namespace of its
// own, where every libslurm file of the library directories reads as empty, opens none and
// expands the list as libslurm expands it here.
TEST(SlurmHostlistTest, WithoutLibslurmTheListExpandsAsLibslurmExpandsIt) {
  const std::string expression = "gpu[01-03,10]-ib,login,rack[1-2]-n[7-8]";
  std::vector<std::string> libraries;
  for (const char* dir : {"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib"}) {
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ignored))
      if (entry.path().filename().string().starts_with("libslurm.so"))
        libraries.push_back(entry.path().string());
  }
  ASSERT_FALSE(libraries.empty());
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // 97: no mount namespace here (not root).
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr))
      ::_exit(97);
    for (const auto& library : libraries)
      if (::mount("/dev/null", library.c_str(), nullptr, MS_BIND, nullptr) != 0) ::_exit(97);
    ::dup2(out[1], STDOUT_FILENO);
    ::execl(SLURM_HOSTLIST_PROBE, SLURM_HOSTLIST_PROBE, expression.c_str(), nullptr);
    ::_exit(98);
  }
  ::close(out[1]);
  std::string printed;
  char buffer[4096];
  for (ssize_t n; (n = ::read(out[0], buffer, sizeof buffer)) > 0;) printed.append(buffer, n);
  ::close(out[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 97) GTEST_SKIP() << "needs root for a mount namespace";
  ASSERT_EQ(WEXITSTATUS(status), 0) << printed;
  std::string expected = "none\n";
  for (const auto& host : libslurms(expression)) expected += host + "\n";
  EXPECT_EQ(printed, expected);
}

}  // namespace
}  // namespace dlrun::slurm
