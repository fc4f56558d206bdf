// Starting worker processes and reading how they ended. A worker leads its own process group
// (signals reach its children too), dies with the agent (PR_SET_PDEATHSIG), and a program that
// cannot be executed is reported to the caller as an error, not as a worker exit.
//
// A start costs the same whatever the agent's size: the child borrows the agent's memory until
// its exec (vfork, no page tables copied) and copies only the few descriptors below two parking
// slots (close_range with CLOSE_RANGE_UNSHARE), not the thousands of pipes a large node holds.
// Descriptors the agent opens after its first start are never inherited, close-on-exec or not.
//
// Under Yama's ptrace_scope=1 a process may attach only to its descendants; a worker declares the
// agent its ptracer (PR_SET_PTRACER), so the agent's other children (the stack tools of a hang
// report, stack_dump.h) may attach to it too.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace dlrun::agents {

struct SpawnRequest {
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up on PATH
  std::vector<std::string> envp;  // "KEY=VALUE": this process's own
  // More "KEY=VALUE" entries, shared by every worker of a round: passed on, never copied.
  std::span<const std::string> sharedEnvp;
  bool pipeStdout = false;  // else the worker inherits the agent's stdout
  bool pipeStderr = false;
  bool nullStdin = false;  // else the worker inherits the agent's stdin
  bool pipeStdin = false;  // a pipe the caller writes to (an ssh client's, remote/fanout.h)
  // A descriptor of the caller's as the child's stdin (the warm-start zygote's control socket,
  // warm_start.h); -1: none
  int stdinFrom = -1;
  // SpawnedProcess::pidfd: signals and waits that cannot reach a recycled pid, for a child that
  // the agent's waitpid(-1) may reap first (CLONE_PIDFD, Linux 5.2).
  bool wantPidfd = false;
  std::vector<int> cpus;  // --numa-binding: the CPUs the worker may run on; empty: the agent's
};

struct SpawnedProcess {
  pid_t pid = -1;
  int stdoutFd = -1;  // read end of the pipe, when requested (non-blocking, close-on-exec)
  int stderrFd = -1;
  int stdinFd = -1;  // write end of the stdin pipe, when requested (close-on-exec)
  int pidfd = -1;    // when requested (close-on-exec); the caller closes it
};

// Starts the program and returns once it has been executed. Throws Error naming the program
// when the fork or the exec fails; the child is then reaped and nothing is left open.
SpawnedProcess spawnProcess(const SpawnRequest& request);

// How a process ended.
struct ExitStatus {
  bool signaled = false;
  int value = 0;  // exit code, or signal number when signaled

  static ExitStatus fromWaitStatus(int status);
  bool success() const { return !signaled && value == 0; }
  int shellCode() const { return signaled ? 128 + value : value; }  // as a shell reports it
  std::string describe() const;  // "exit code 3" or "signal SIGKILL"
};

// A child that ended, reaped by reapChild.
struct ReapedChild {
  pid_t pid = -1;
  ExitStatus status;
  int groupFd = -1;  // its pidfd where asked for (close-on-exec); the caller closes it
};

// Reaps one child that ended, without blocking; nullopt when none has. For a child that
// `holdGroup` picks (a process group's leader), a pidfd is opened first, while the child is a
// zombie whose number no new process can take: once reaped and its group empty, that number is
// free, and only the pidfd still names the group (signalReapedGroup).
std::optional<ReapedChild> reapChild(const std::function<bool(pid_t)>& holdGroup);

// Sends `sig` to what is left of the process group whose leader `group` was reaped (`groupFd`:
// its pidfd from reapChild, or -1), never to a later group that took its number. Linux 6.9's
// PIDFD_SIGNAL_PROCESS_GROUP signals the group the pidfd names. Before it, the number is
// signalled only while a member is this process's child (an orphan of the group, re-parented
// to this subreaper: it holds the number until reaped here) and no process has that number (it
// would lead a new group).
void signalReapedGroup(int groupFd, pid_t group, int sig);

// Makes this process a child subreaper: orphaned descendants are reparented to it and reaped.
void becomeSubreaper();

// The state letter of /proc/PID/stat ('T': stopped by a signal, 't': by a tracer), or 0 when
// the process is gone.
char processState(pid_t pid);

}  // namespace dlrun::agents
