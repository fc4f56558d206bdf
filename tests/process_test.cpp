// Spawning and reaping worker processes: many children started at once are all reaped with
// their own exit codes, a program that cannot be executed is an error (not a worker exit), and
// a grandchild orphaned by its parent comes back to this subreaper to be reaped, and a worker's
// group is killed after its reap but a later group of the same number is not.
#include "agents/process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <map>

#include "agents/worker.h"
#include "common/asio.h"
#include "common/error.h"

namespace dlrun::agents {
namespace {

SpawnedProcess spawnShell(const std::string& script) {
  return spawnProcess({.argv = {"/bin/sh", "-c", script}, .envp = {"PATH=/bin"}});
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
  for (int i = 0; i < kChildren; ++i) expected[spawnShell("exit " + std::to_string(i)).pid] = i;
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
  try {
    spawnProcess({.argv = {"/nonexistent/program"}, .envp = {}, .pipeStderr = true});
    FAIL() << "exec of a missing program was confirmed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot execute /nonexistent/program"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);  // the failed child was reaped
}

// Reads a child's whole output from a pipe read end (non-blocking: polls until EOF).
std::string readAll(int fd) {
  std::string text;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      text.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno == EAGAIN) {
      ::usleep(1000);  // a bounded wait: the child exits at once
    } else {
      break;
    }
  }
  ::close(fd);
  return text;
}

TEST(ProcessTest, TheEnvironmentIsTheSharedPartThenTheWorkersOwn) {
  const std::vector<std::string> shared = {"PATH=/bin", "A=shared"};
  SpawnedProcess p = spawnProcess({.argv = {"/bin/sh", "-c", "echo \"$A $B\""},
                                   .envp = {"B=own"},
                                   .sharedEnvp = shared,
                                   .pipeStdout = true});
  EXPECT_EQ(readAll(p.stdoutFd), "shared own\n");
  const auto reaped = reapAll(1);
  ASSERT_TRUE(reaped.contains(p.pid));
  EXPECT_TRUE(reaped.at(p.pid).success());
}

TEST(ProcessTest, DescriptorsOpenedAfterTheFirstStartAreNotInherited) {
  spawnShell("exit 0");  // the parking slots are reserved now
  reapAll(1);
  // Not close-on-exec, and above the slots: a worker never sees it.
  const int leaked = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(leaked, 0);
  SpawnedProcess p = spawnProcess(
      {.argv = {"/bin/sh", "-c",
                "test -e /proc/self/fd/" + std::to_string(leaked) + " && echo open || echo closed"},
       .envp = {"PATH=/bin"},
       .pipeStdout = true});
  EXPECT_EQ(readAll(p.stdoutFd), "closed\n");
  reapAll(1);
  ::close(leaked);
}

// The agent blocks signals and ignores SIGPIPE; its workers start with neither.
TEST(ProcessTest, WorkersStartWithNoSignalBlockedAndSigpipeAtItsDefault) {
  sigset_t blocked, old;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGUSR2);
  ::pthread_sigmask(SIG_BLOCK, &blocked, &old);
  auto* const before = ::signal(SIGPIPE, SIG_IGN);
  const pid_t usr2 = spawnShell("kill -USR2 $$; exit 0").pid;
  const pid_t pipe = spawnShell("kill -PIPE $$; exit 0").pid;
  ::signal(SIGPIPE, before);
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  const auto reaped = reapAll(2);
  ASSERT_TRUE(reaped.contains(usr2) && reaped.contains(pipe));
  EXPECT_EQ(reaped.at(usr2).describe(), "signal SIGUSR2");
  EXPECT_EQ(reaped.at(pipe).describe(), "signal SIGPIPE");
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
    if (pid != child) {
      EXPECT_EQ(status.value, 7);
    }
}

// Runs `scenario` as the first process (the init) of a pid namespace of its own, where a process
// number can be handed out again at will; returns its exit code, or -1 without such a namespace.
int inPidNamespace(const std::function<int()>& scenario) {
  const pid_t outer = ::fork();
  if (outer == 0) {
    if (::unshare(CLONE_NEWPID) != 0 && ::unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0) ::_exit(99);
    const pid_t init = ::fork();
    if (init == 0) ::_exit(scenario());
    int status = 0;
    ::waitpid(init, &status, 0);
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 98);
  }
  int status = 0;
  ::waitpid(outer, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) == 99) return -1;
  return WEXITSTATUS(status);
}

// A child that takes the number `pid` (clone3's set_tid, allowed in a namespace of one's own)
// and waits to be signalled; -1 when the number is taken.
pid_t childNumbered(pid_t pid) {
  struct {
    uint64_t flags, pidfd, childTid, parentTid, exitSignal, stack, stackSize, tls, setTid,
        setTidSize, cgroup;
  } args{};
  args.exitSignal = SIGCHLD;
  args.setTid = reinterpret_cast<uintptr_t>(&pid);
  args.setTidSize = 1;
  const long child = ::syscall(SYS_clone3, &args, sizeof args);
  if (child == 0) {
    for (;;) ::pause();
  }
  return static_cast<pid_t>(child);
}

// Reaps the worker as the agent does (keeping its pidfd), and tells it so.
void reapWorker(Worker& worker) {
  siginfo_t info{};
  ::waitid(P_PID, worker.pid(), &info, WEXITED | WNOWAIT);  // until it has ended
  const auto child = reapChild([](pid_t) { return true; });
  worker.exited(child->status, child->groupFd);
}

// How a process this one reaps (waiting for it) ended: the signal, or 0.
int killedBy(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) < 0 || !WIFSIGNALED(status)) return 0;
  return WTERMSIG(status);
}

// After the agent reaped a worker, its group goes (the children it left); once the group was
// empty its number may lead another process's group, which must not get the SIGKILL.
TEST(ProcessTest, AReapedWorkersGroupIsKilledButNotALaterGroupOfItsNumber) {
  const int code = inPidNamespace([] {
    boost::asio::io_context io;
    auto start = [&](const std::string& script) {
      return Worker::start(io, {.argv = {"/bin/sh", "-c", script}, .envp = {"PATH=/bin:/usr/bin"}});
    };
    const auto leaving = start("sleep 30 & exit 0");
    reapWorker(*leaving);
    leaving->killGroup();
    if (killedBy(-1) != SIGKILL) return 3;  // its sleep, orphaned to this init, is killed
    const auto quick = start("exit 0");
    reapWorker(*quick);
    const pid_t foreign = childNumbered(quick->pid());
    if (foreign < 0 || ::setpgid(foreign, foreign) != 0) return 2;
    quick->killGroup();
    ::kill(foreign, SIGTERM);
    return killedBy(foreign) == SIGTERM ? 0 : 4;
  });
  if (code < 0) GTEST_SKIP() << "no pid namespace can be made here";
  // 3: the group's leftover lived on; 4: the later group was killed; 2: no number reused.
  EXPECT_EQ(code, 0);
}

}  // namespace
}  // namespace dlrun::agents
