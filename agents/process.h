// Starting worker processes and reading how they ended. A worker leads its own process group
// (signals reach its children too), dies with the agent (PR_SET_PDEATHSIG), and a program that
// cannot be executed is reported to the caller as an error, not as a worker exit.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace dlrun::agents {

struct SpawnRequest {
  std::vector<std::string> argv;  // argv[0]: a path, or a name looked up on PATH
  std::vector<std::string> envp;  // "KEY=VALUE"
  bool pipeStdout = false;        // else the worker inherits the agent's stdout
  bool pipeStderr = false;
};

struct SpawnedProcess {
  pid_t pid = -1;
  int stdoutFd = -1;  // read end of the pipe, when requested (non-blocking, close-on-exec)
  int stderrFd = -1;
  int execReportFd = -1;  // closed by a successful exec; carries errno when exec failed
};

// Forks; the child execs on its own. Throws Error naming the program when fork fails.
// Starting many workers first and confirming them afterwards lets their execs overlap.
SpawnedProcess spawnProcess(const SpawnRequest& request);

// Waits until the child has exec'd, reading (and closing) its exec report pipe. Throws Error
// naming the program when exec failed (the child is then reaped; its output pipes stay the
// caller's to close).
void confirmExec(pid_t pid, int execReportFd, const std::string& program);

// How a process ended.
struct ExitStatus {
  bool signaled = false;
  int value = 0;  // exit code, or signal number when signaled

  static ExitStatus fromWaitStatus(int status);
  bool success() const { return !signaled && value == 0; }
  int shellCode() const { return signaled ? 128 + value : value; }  // as a shell reports it
  std::string describe() const;  // "exit code 3" or "signal SIGKILL"
};

// Makes this process a child subreaper: orphaned descendants are reparented to it and reaped.
void becomeSubreaper();

}  // namespace dlrun::agents
