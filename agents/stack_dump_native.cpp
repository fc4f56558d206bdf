// The native part of the stack reports (stack_dump.h): eu-stack, else gdb, run against a
// worker (ToolRun), and the worker continued where a tool leaves it stopped.
#include "agents/stack_dump_internal.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>

#include "agents/process.h"
#include "agents/stack_text.h"
#include "common/error.h"

namespace dlrun::agents::stack_dump_detail {
namespace {

// A tool's output beyond this is dropped (a process of thousands of threads).
constexpr size_t kMaxToolOutput = 8 << 20;
// How long a killed tool may take to go (SIGKILL: at once, unless the machine is stuck).
constexpr milliseconds kKillWait{1000};
// waitid's P_PIDFD (Linux 5.4), which glibc 2.36's <sys/wait.h> does not name yet.
constexpr auto kByPidfd = static_cast<idtype_t>(3);

std::optional<fs::path> findProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/bin:/bin";
  while (true) {
    const size_t colon = dirs.find(':');
    const std::string_view dir = dirs.substr(0, colon);
    if (!dir.empty()) {
      fs::path candidate = fs::path(dir) / name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    if (colon == std::string_view::npos) return std::nullopt;
    dirs.remove_prefix(colon + 1);
  }
}

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
  if (message.find("Operation not permitted") != std::string_view::npos ||
      message.find("Permission denied") != std::string_view::npos)
    what += " (ptrace refused: see /proc/sys/kernel/yama/ptrace_scope, or another user's process)";
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

Tools::Tools() : euStack(findProgram("eu-stack")), gdb(findProgram("gdb")) {}

void TargetDump::startNative() {
  if (tools_.euStack) return startTool("eu-stack");
  if (tools_.gdb) return startTool("gdb");
  notes_.emplace_back(
      "no native stacks: neither eu-stack nor gdb is installed (Debian: "
      "apt-get install elfutils)");
  step_ = Step::Done;
}

void TargetDump::startTool(const std::string& name) {
  const std::string pid = std::to_string(target_.pid);
  std::vector<std::string> argv;
  if (name == "eu-stack") {
    argv = {tools_.euStack->string(), "-p", pid};
  } else {
    // No debuginfod queries, no scripts from auto-load: a quick, local backtrace.
    argv = {tools_.gdb->string(),
            "-batch",
            "-nx",
            "-iex",
            "set debuginfod enabled off",
            "-iex",
            "set auto-load python-scripts off",
            "-p",
            pid,
            "-ex",
            "thread apply all bt"};
  }
  try {
    tool_ = std::make_unique<ToolRun>(name, std::move(argv));
    toolCommand_ = name + " -p " + pid;
    step_ = Step::Native;
  } catch (const Error& e) {
    notes_.emplace_back(e.what());
    step_ = Step::Done;
  }
}

void TargetDump::finishTool() {
  if (tool_->diedAttached() || (!tool_->statusKnown() && stateOf(target_.pid) == 'T')) resume();
  nativeThreads_ = tool_->name() == "eu-stack" ? parseEuStack(tool_->out(), target_.pid)
                                               : parseGdbBacktrace(tool_->out(), target_.pid);
  if (const std::string trouble = tool_->trouble(); !trouble.empty())
    notes_.push_back(tool_->name() + ": " + trouble);
  if (!nativeThreads_.empty()) nativeText_ = tool_->out();
}

// A tracer killed while attaching can leave its tracee stopped: PTRACE_ATTACH queues a
// SIGSTOP that the tracee takes once the tracer is gone. SIGCONT continues it and drops a
// SIGSTOP still queued. A worker that was stopped before (by its user) stays so.
void TargetDump::resume() {
  if (!stoppedBefore_) pidfdSignal(pidfd_, SIGCONT);
}

}  // namespace dlrun::agents::stack_dump_detail
