#include "agents/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/signal_name.h"

namespace dlrun::agents {
namespace {

std::vector<char*> pointers(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (const auto& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

void makePipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(std::string("cannot create a pipe for a worker: ") + std::strerror(errno));
}

// Runs in the child between fork and exec: only async-signal-safe calls.
[[noreturn]] void becomeWorker(pid_t agent, const SpawnRequest& request, char** argv,
                               char** envp, int out[2], int err[2], int report) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != agent) ::_exit(127);  // the agent died before the line above
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  if (request.pipeStdout) ::dup2(out[1], STDOUT_FILENO);
  if (request.pipeStderr) ::dup2(err[1], STDERR_FILENO);
  ::execvpe(argv[0], argv, envp);
  const int error = errno;
  [[maybe_unused]] auto n = ::write(report, &error, sizeof(error));
  ::_exit(127);
}

}  // namespace

SpawnedProcess spawnProcess(const SpawnRequest& request) {
  if (request.argv.empty()) throw Error("cannot start a worker: empty command");
  auto argv = pointers(request.argv);
  auto envp = pointers(request.envp);
  int out[2] = {-1, -1}, err[2] = {-1, -1}, report[2];
  if (request.pipeStdout) makePipe(out);
  if (request.pipeStderr) makePipe(err);
  makePipe(report);
  const pid_t agent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) becomeWorker(agent, request, argv.data(), envp.data(), out, err, report[1]);
  const int forkError = errno;
  for (int fd : {out[1], err[1], report[1]}) {
    if (fd >= 0) ::close(fd);
  }
  auto closeReadEnds = [&] {
    for (int fd : {out[0], err[0], report[0]}) {
      if (fd >= 0) ::close(fd);
    }
  };
  if (pid < 0) {
    closeReadEnds();
    throw Error("cannot start " + request.argv[0] + ": fork: " + std::strerror(forkError));
  }
  for (int fd : {out[0], err[0]}) {
    if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  return {pid, out[0], err[0], report[0]};
}

void confirmExec(pid_t pid, int execReportFd, const std::string& program) {
  int execError = 0;
  ssize_t n;
  do {
    n = ::read(execReportFd, &execError, sizeof(execError));
  } while (n < 0 && errno == EINTR);
  ::close(execReportFd);
  if (n != sizeof(execError)) return;
  ::waitpid(pid, nullptr, 0);
  throw Error("cannot execute " + program + ": " + std::strerror(execError));
}

ExitStatus ExitStatus::fromWaitStatus(int status) {
  if (WIFSIGNALED(status)) return {true, WTERMSIG(status)};
  return {false, WEXITSTATUS(status)};
}

std::string ExitStatus::describe() const {
  return signaled ? "signal " + signalName(value) : "exit code " + std::to_string(value);
}

void becomeSubreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    throw Error(std::string("cannot become a child subreaper: ") + std::strerror(errno));
}

}  // namespace dlrun::agents
