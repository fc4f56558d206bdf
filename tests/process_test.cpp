// Spawning and reaping worker processes: many children started at once are all reaped with
// their own exit codes, a program that cannot be executed is an error (not a worker exit), and
// a grandchild orphaned by its parent comes back to this subreaper to be reaped.
#include "agents/process.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>

#include "common/error.h"

namespace dlrun::agents {
namespace {

SpawnedProcess spawnShell(const std::string& script) {
  SpawnedProcess p = spawnProcess({.argv = {"/bin/sh", "-c", script}, .envp = {"PATH=/bin"}});
  confirmExec(p.pid, p.execReportFd, "/bin/sh");
  return p;
}

// Reaps children (any pid, as the agent does) until `count` were collected.
std::map<pid_t, ExitStatus> reapAll(size_t count) {
  std::map<pid_t, ExitStatus> reaped;
  while (reaped.size() < count) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) break;  // no child left: the assertion below says what is missing
    reaped.emplace(pid, ExitStatus::fromWaitStatus(status));
  }
  return reaped;
}

TEST(ProcessTest, ManyChildrenAreAllReapedWithTheirOwnCodes) {
  constexpr int kChildren = 64;
  std::map<pid_t, int> expected;
  for (int i = 0; i < kChildren; ++i)
    expected[spawnShell("exit " + std::to_string(i)).pid] = i;
  const auto reaped = reapAll(kChildren);
  ASSERT_EQ(reaped.size(), expected.size());
  for (const auto& [pid, code] : expected) {
    ASSERT_TRUE(reaped.contains(pid)) << "pid " << pid << " was not reaped";
    EXPECT_FALSE(reaped.at(pid).signaled);
    EXPECT_EQ(reaped.at(pid).value, code);
  }
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);  // nothing left behind
}

TEST(ProcessTest, ASignalledChildReportsTheSignal) {
  const pid_t pid = spawnShell("kill -TERM $$").pid;
  const auto reaped = reapAll(1);
  ASSERT_TRUE(reaped.contains(pid));
  EXPECT_TRUE(reaped.at(pid).signaled);
  EXPECT_EQ(reaped.at(pid).shellCode(), 128 + SIGTERM);
  EXPECT_EQ(reaped.at(pid).describe(), "signal SIGTERM");
}

TEST(ProcessTest, AProgramThatCannotBeExecutedIsAnError) {
  SpawnedProcess p = spawnProcess({.argv = {"/nonexistent/program"}, .envp = {}});
  try {
    confirmExec(p.pid, p.execReportFd, "/nonexistent/program");
    FAIL() << "exec of a missing program was confirmed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/program"), std::string::npos) << e.what();
  }
  EXPECT_EQ(::waitpid(p.pid, nullptr, WNOHANG), -1);  // confirmExec reaped it
}

TEST(ProcessTest, OrphanedGrandchildrenComeBackToTheSubreaper) {
  becomeSubreaper();
  // The child starts a grandchild and exits at once; the grandchild is re-parented here.
  const pid_t child = spawnShell("sh -c 'exit 7' & exit 0").pid;
  const auto reaped = reapAll(2);
  ASSERT_EQ(reaped.size(), 2u);
  ASSERT_TRUE(reaped.contains(child));
  EXPECT_EQ(reaped.at(child).value, 0);
  for (const auto& [pid, status] : reaped)
    if (pid != child) EXPECT_EQ(status.value, 7);
}

}  // namespace
}  // namespace dlrun::agents
