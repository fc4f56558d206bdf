// What the files of dumpStacks (stack_dump.h) share: one target's collection, TargetDump, whose
// functions live in files named for their part (each group below names its file), and the
// helpers they have in common. agents/ only, not an interface.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <ios>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/process.h"
#include "agents/stack_dump.h"
#include "agents/stack_text.h"
#include "agents/tool_run.h"
#include "common/clock.h"
#include "common/environment.h"

namespace dlrun::agents::stack_dump_detail {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string errnoText(int error);
// pidfds: signals and waits that reach the process meant, never one that took its pid after it
// was reaped (by the agent's waitpid(-1) as likely as by this code).
int pidfdOpen(pid_t pid);
std::string readFile(const fs::path& path, std::streamoff from = 0);

struct FileMark {
  bool exists = false;
  off_t size = 0;
  timespec mtime{};
  bool operator==(const FileMark& o) const {
    return exists == o.exists && size == o.size && mtime.tv_sec == o.mtime.tv_sec &&
           mtime.tv_nsec == o.mtime.tv_nsec;
  }
};

// A file that another process is about to write: settled() once it differs from what it was
// when watching began and has not changed for kSettle.
class FileWatch {
 public:
  explicit FileWatch(fs::path path);

  bool settled(Clock::time_point now);
  const fs::path& path() const { return path_; }
  off_t sizeBefore() const { return before_.size; }

 private:
  fs::path path_;
  FileMark before_, last_;
  Clock::time_point changed_;
};

// The native tools found on PATH (stack_dump_native.cpp).
struct Tools {
  Tools();
  std::optional<fs::path> euStack;
  std::optional<fs::path> gdb;
};

// One target's collection: Python stacks, then native ones; the flight recorder alongside.
class TargetDump {
 public:
  // stack_dump.cpp: the steps and the report
  TargetDump(const StackTarget& target, const PythonStackHook* hook, const Tools& tools,
             Clock::time_point start, milliseconds timeout);
  TargetDump(const TargetDump&) = delete;
  TargetDump& operator=(const TargetDump&) = delete;
  ~TargetDump();

  void advance(Clock::time_point now);
  bool done() const { return step_ == Step::Done && ncclDumps_.empty(); }
  bool waitsOnFiles() const { return step_ == Step::Python || !ncclDumps_.empty(); }
  void addPollFds(std::vector<pollfd>& fds) const {
    if (step_ == Step::Native) tool_->addPollFds(fds);
  }
  // The deadline passed: stop what still runs.
  void expire();
  StackDump result() &&;

 private:
  enum class Step { Python, Native, Done };

  std::string report(const std::string& python) const;
  // Empty, or why the file could not be written.
  static std::string write(const fs::path& path, const std::string& text);

  // stack_dump_python.cpp: signals the hook where the process has it; true when its dump is
  // then awaited (step_ Python).
  bool startPython(const PythonStackHook* hook, Clock::time_point start, milliseconds timeout);

  // stack_dump_native.cpp: eu-stack, else gdb
  void startNative();
  void startTool(const std::string& name);
  void finishTool();
  void resume();

  // stack_dump_nccl.cpp: the flight recorder
  void pokeFlightRecorder(const Environment& env);
  void copyFlightRecorder(const fs::path& from);

  const StackTarget& target_;
  const Tools& tools_;
  StackDump dump_;
  int pidfd_ = -1;
  bool stoppedBefore_ = false;
  Step step_ = Step::Done;
  std::optional<FileWatch> python_;
  Clock::time_point pythonUntil_;
  std::string pythonText_;
  std::unique_ptr<ToolRun> tool_;
  std::string toolCommand_;
  std::string nativeText_;
  std::vector<StackThread> nativeThreads_;
  std::vector<FileWatch> ncclDumps_;  // where the flight recorder's dump may appear, until it does
  std::vector<std::string> notes_;
};

}  // namespace dlrun::agents::stack_dump_detail
