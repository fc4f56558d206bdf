#include "agents/tool_run.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string_view>
#include <utility>

#include "common/clock.h"

extern char** environ;

namespace dlrun::agents {
namespace {

// A tool's output beyond this is dropped (a process of thousands of threads).
constexpr size_t kMaxToolOutput = 8 << 20;
// How long a killed tool may take to go (SIGKILL: at once, unless the machine is stuck).
constexpr std::chrono::milliseconds kKillWait{1000};
// waitid's P_PIDFD (Linux 5.4), which glibc 2.36's <sys/wait.h> does not name yet.
constexpr auto kByPidfd = static_cast<idtype_t>(3);

// The tools' environment: the agent's, in the C locale (their messages are read), without
// DEBUGINFOD_URLS, which would have eu-stack and gdb download debug files while a job hangs.
std::vector<std::string> toolEnvironment() {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view item(*entry);
    if (item.starts_with("DEBUGINFOD_URLS=") || item.starts_with("LC_ALL=")) continue;
    env.emplace_back(item);
  }
  env.emplace_back("LC_ALL=C");
  return env;
}

}  // namespace

// The system call direct: glibc 2.36's <sys/pidfd.h> declares its wrappers without C linkage.
int pidfdSignal(int pidfd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

ToolRun::ToolRun(std::string name, std::vector<std::string> argv)
    : name_(std::move(name)),
      process_(spawnProcess({.argv = std::move(argv),
                             .envp = toolEnvironment(),
                             .pipeStdout = true,
                             .pipeStderr = true,
                             .nullStdin = true,
                             .wantPidfd = true})) {}

ToolRun::~ToolRun() {
  if (!exited_) kill();
  for (int fd : {process_.stdoutFd, process_.stderrFd, process_.pidfd}) {
    if (fd >= 0) ::close(fd);
  }
}

void ToolRun::addPollFds(std::vector<pollfd>& fds) const {
  if (exited_) return;
  for (int fd : {process_.stdoutFd, process_.stderrFd, process_.pidfd})
    fds.push_back({fd, POLLIN, 0});
}

bool ToolRun::advance() {
  if (exited_) return true;
  // Exit first: what it wrote before is in the pipes by then.
  pollfd exit{process_.pidfd, POLLIN, 0};
  const bool gone = ::poll(&exit, 1, 0) == 1;
  drain(process_.stdoutFd, out_);
  drain(process_.stderrFd, err_);
  if (gone) reap();
  return exited_;
}

bool ToolRun::finishWithin(std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!advance()) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      kill();
      return false;
    }
    std::vector<pollfd> fds;
    addPollFds(fds);
    ::poll(fds.data(), fds.size(), static_cast<int>(left.count()) + 1);
  }
  return true;
}

void ToolRun::kill() {
  pidfdSignal(process_.pidfd, SIGKILL);
  pollfd exit{process_.pidfd, POLLIN, 0};
  ::poll(&exit, 1, static_cast<int>(kKillWait.count()));
  killed_ = true;
  reap();
}

std::string ToolRun::trouble() const {
  std::string what;
  if (killed_)
    what = "killed at the deadline";
  else if (status_ && !status_->success())
    what = status_->describe();
  const std::string_view message = [&] {
    std::string_view m(err_);
    while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.remove_suffix(1);
    return m;
  }();
  if (!message.empty()) what += (what.empty() ? "" : ": ") + std::string(message);
  return what;
}

void ToolRun::drain(int fd, std::string& into) {
  char buffer[65536];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof buffer)) > 0) {
    const size_t room = kMaxToolOutput - std::min(kMaxToolOutput, into.size());
    into.append(buffer, std::min(static_cast<size_t>(n), room));
  }
}

void ToolRun::reap() {
  siginfo_t info{};
  if (::waitid(kByPidfd, process_.pidfd, &info, WEXITED | WNOHANG) == 0 && info.si_pid != 0)
    status_ = info.si_code == CLD_EXITED ? ExitStatus{false, info.si_status}
                                         : ExitStatus{true, info.si_status};
  exited_ = true;
  drain(process_.stdoutFd, out_);
  drain(process_.stderrFd, err_);
}

}  // namespace dlrun::agents
