// One bounded run of a helper program (eu-stack or gdb for a hang report, the torch probe): its
// output gathered while it runs, killed through its pidfd when its caller's time is up, never a
// recycled pid.
#pragma once

#include <poll.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "agents/process.h"

namespace dlrun::agents {

// pidfd_send_signal(2): a signal that reaches the process meant, or none.
int pidfdSignal(int pidfd, int sig);

class ToolRun {
 public:
  // Starts argv with the agent's environment in the C locale, without DEBUGINFOD_URLS (which
  // would have eu-stack and gdb download debug files), stdin from /dev/null. Throws Error
  // naming the program when it cannot be started.
  ToolRun(std::string name, std::vector<std::string> argv);
  ToolRun(const ToolRun&) = delete;
  ToolRun& operator=(const ToolRun&) = delete;
  ~ToolRun();

  void addPollFds(std::vector<pollfd>& fds) const;
  // Reads what the tool wrote; true once it has exited and all it wrote was read.
  bool advance();
  // advance() until the tool has exited or `limit` has passed, then kill() it if it runs on.
  // True when it exited by itself.
  bool finishWithin(std::chrono::milliseconds limit);
  // SIGKILL through the pidfd (never a recycled pid), then waits for the exit.
  void kill();

  const std::string& name() const { return name_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  // Killed, or ended by a signal: it may have died while attached to a process.
  bool diedAttached() const { return killed_ || (status_ && status_->signaled); }
  // The exit status is lost where the caller reaped the tool first.
  bool statusKnown() const { return status_.has_value(); }
  bool succeeded() const { return status_ && status_->success(); }
  // "exit code 1: <its message>"; empty after a clean run.
  std::string trouble() const;

 private:
  void drain(int fd, std::string& into);
  // The status, unless the caller's waitpid(-1) took it first (ECHILD): the output tells.
  void reap();

  std::string name_;
  SpawnedProcess process_;
  std::string out_, err_;
  bool exited_ = false, killed_ = false;
  std::optional<ExitStatus> status_;
};

}  // namespace dlrun::agents
