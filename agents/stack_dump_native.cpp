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

}  // namespace

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
  if (tool_->diedAttached() || (!tool_->statusKnown() && processState(target_.pid) == 'T'))
    resume();
  nativeThreads_ = tool_->name() == "eu-stack" ? parseEuStack(tool_->out(), target_.pid)
                                               : parseGdbBacktrace(tool_->out(), target_.pid);
  if (std::string trouble = tool_->trouble(); !trouble.empty()) {
    if (trouble.find("Operation not permitted") != std::string::npos ||
        trouble.find("Permission denied") != std::string::npos)
      trouble +=
          " (ptrace refused: see /proc/sys/kernel/yama/ptrace_scope, or another user's "
          "process)";
    notes_.push_back(tool_->name() + ": " + trouble);
  }
  if (!nativeThreads_.empty()) nativeText_ = tool_->out();
}

// A tracer killed while attaching can leave its tracee stopped: PTRACE_ATTACH queues a
// SIGSTOP that the tracee takes once the tracer is gone. SIGCONT continues it and drops a
// SIGSTOP still queued. A worker that was stopped before (by its user) stays so.
void TargetDump::resume() {
  if (!stoppedBefore_) pidfdSignal(pidfd_, SIGCONT);
}

}  // namespace dlrun::agents::stack_dump_detail
