// One worker process as the agent sees it: running once start() returned (its exec succeeded),
// then exited. It owns the worker's output pumps and log files, and knows its process group, so
// signals and the final clean-up reach whatever the worker started too.
//
//   start() ──> Running ──exited(status)──> Exited
//   start() throws (a log file, the pipes, the fork or the exec failed): no worker
//
// Lives on the agent's io_context thread; nothing here blocks but start(), for the exec itself.
#pragma once

#include <sys/types.h>

#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "agents/output.h"
#include "agents/process.h"

namespace boost::asio {
class io_context;
}

namespace dlrun::agents {

class Zygote;

// Which of a worker's streams go to files (torchrun's Std: 0 none, 1 stdout, 2 stderr, 3 both).
enum class Streams : uint8_t { None = 0, Out = 1, Err = 2, Both = 3 };

// Where one worker's output goes.
struct WorkerOutput {
  std::string prefix;  // before each console line of a `prefixed` stream
  Streams prefixed = Streams::Both;
  bool exactBytes = false;                   // add no newline to an unterminated last line
  bool pythonText = false;                   // prefixed lines as torchrun reads them (asPythonText)
  bool shown = true;                         // on the console at all (--local-ranks-filter)
  Streams fileOnly = Streams::None;          // streams kept off the console (--redirects)
  Streams toFile = Streams::None;            // streams written to files (--redirects | --tee)
  std::optional<std::filesystem::path> dir;  // where stdout.log and stderr.log go
  // --duplicate-stdout-filters/--duplicate-stderr-filters: the node's shared copies (output.h)
  // of the `prefixed` streams' console lines
  std::shared_ptr<FilteredLog> filteredOut, filteredErr;
  // The node's console grouping identical lines (console_dedup.h); none: each line as it comes
  std::shared_ptr<ConsoleDedup> dedup;
};

struct WorkerLaunch {
  int localRank = 0;
  int rank = 0;
  std::vector<std::string> argv;
  std::vector<std::string> envp;  // "KEY=VALUE": the worker's own, dropped once it started
  std::span<const std::string> sharedEnvp;  // the round's shared entries (NodeEnvironment)
  std::string errorFile;                    // the worker's TORCHELASTIC_ERROR_FILE
  std::vector<int> cpus;                    // --numa-binding's CPUs; empty: the agent's
  WorkerOutput output;
};

class Worker {
 public:
  enum class State { Running, Exited };

  // Opens the log files and starts the process: forked from `zygote` (--warm-start) where one
  // is given, else executed. Throws Error (nothing left behind) when a log file cannot be
  // opened, or the fork or the exec fails (naming the program). `reserved`: the zygote's
  // worker started ahead for this local rank takes the launch where one waits (--ready-spares).
  static std::unique_ptr<Worker> start(boost::asio::io_context& io, WorkerLaunch launch,
                                       Zygote* zygote = nullptr, bool reserved = false);
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // The descriptors the agent holds for a running worker with this output: its output pipes
  // and log files.
  static int descriptors(const WorkerOutput& output);

  ~Worker();

  // The process was reaped: reads what its pipes still hold and closes them. `groupFd`, its
  // pidfd from reapChild (or -1), is kept: it names the worker's group past the reap.
  void exited(ExitStatus status, int groupFd = -1);

  // To the worker's process group while it runs.
  void signal(int sig) const;
  // SIGKILL to the process group, whether or not the worker itself is gone: its children may
  // outlive it. Once reaped, the group's number may be another's (signalReapedGroup); once only.
  void killGroup();

  State state() const { return state_; }
  bool alive() const { return state_ != State::Exited; }
  pid_t pid() const { return pid_; }
  int rank() const { return launch_.rank; }
  // A round kept this worker running under another RANK (in-process recovery, a node lost).
  void renumber(int rank) { launch_.rank = rank; }
  int localRank() const { return launch_.localRank; }
  const std::string& errorFile() const { return launch_.errorFile; }
  const ExitStatus& status() const { return status_; }
  // The last lines of its stderr, for the failure report.
  const std::deque<std::string>& lastErrorLines() const { return err_->lastLines(); }

  static constexpr size_t kReportLines = 20;

 private:
  explicit Worker(WorkerLaunch launch) : launch_(std::move(launch)) {}

  WorkerLaunch launch_;  // without its environment; only its rank changes (renumber)
  State state_ = State::Running;
  bool groupKilled_ = false;
  pid_t pid_ = -1;
  int groupFd_ = -1;  // from exited()
  ExitStatus status_;
  std::unique_ptr<StreamPump> out_, err_;
};

}  // namespace dlrun::agents
