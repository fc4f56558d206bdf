// The agent's hang watch under --hang-timeout (ARCHITECTURE.md section 9), on the agent's
// io_context. Workers report progress on the round's progress board (DLRUN_PROGRESS_FILE, which
// the agent's ProgressSampler makes) and, set up here each round, in one heartbeat file a worker
// (DLRUN_HEARTBEAT_FILE: touch it, or write a step number). It looks at both a few times a
// second and calls back once when a worker that made progress before has made none for the
// timeout. When a hang ends a round, collect() takes every worker's stack into the log
// directory, shares this node's ranks through the rendezvous and, on the node that saw the
// hang, prints the summary that names the suspect across the job.
//
// Threads: everything runs on the io_context but collect()'s work, which blocks (debuggers
// attached to each worker, a wait for the other nodes' reports), so it runs on a thread of its
// own and posts `done` back.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agents/hang_watch.h"
#include "agents/stack_dump.h"
#include "agents/worker_env.h"
#include "common/asio.h"
#include "common/progress_board.h"
#include "rendezvous/rendezvous.h"

namespace dlrun::agents {

// A worker as the watch needs it.
struct WatchedWorker {
  pid_t pid = -1;
  int rank = 0;
  int localRank = 0;
};

// What the callback hears: the suspect (hang_watch.h) among the hung workers and the stopped.
struct HungWorker {
  int rank = 0;
  double silentSeconds = 0;
  std::optional<int64_t> step;
};

class HangWatcher {
 public:
  HangWatcher(boost::asio::io_context& io, HangOptions options, std::string nodeName,
              rendezvous::Rendezvous& rendezvous);
  ~HangWatcher();  // waits for a collection under way
  HangWatcher(const HangWatcher&) = delete;
  HangWatcher& operator=(const HangWatcher&) = delete;

  const HangOptions& options() const { return options_; }

  // A round begins in `attemptDir`: its workers report on `board` (which outlives the round's
  // watch); a fresh heartbeat directory, and the variables that point workers at it (and Python
  // workers at the stack hook, before the PYTHONPATH `spec` or else `inherited` gives) added to
  // `spec`.
  // The Python stack hook's PYTHONPATH over `base`'s, the hook made under `runDir` if it was
  // not: for workers started before a round (--ready-spares), which read sitecustomize once.
  Environment hookEnvironment(const std::filesystem::path& runDir, const Environment& base);
  void prepareRound(const std::filesystem::path& attemptDir, const ProgressBoard& board,
                    const Environment& inherited, RoundSpec& spec);
  // The round's workers run: watched until unwatch(). `onHang` runs on the io_context once per
  // stall (again only after every hung worker made progress since).
  void watch(std::vector<WatchedWorker> workers, std::function<void(const HungWorker&)> onHang);
  void unwatch();

  // What collect() does beyond taking this node's stacks.
  struct Collect {
    // Share this node's ranks through the rendezvous (a hang that ended the round); without
    // it (--hang-action=report) the summary covers this node alone.
    bool shareWithJob = false;
    // Print the summary; with shareWithJob, once every node's ranks are gathered.
    bool summarize = false;
    // When set, only this worker's native stack is taken, the others' Python stacks alone
    // (their native ones where the hook does not answer).
    pid_t nativeOnlyOf = 0;
    // Posted to the io_context once every stack is taken, before the report is made (an
    // in-process replacement kills the hung worker there).
    std::function<void()> taken;
  };
  // Takes every watched worker's stack into attemptDir/stacks/rank_R.txt, then does `what`.
  // `done` is posted to the io_context when all is written.
  void collect(Collect what, std::function<void()> done);
  // Where collect() writes, for the log line that points users there.
  std::filesystem::path stackDir() const { return attemptDir_ / "stacks"; }

 private:
  void schedule();
  void look();
  RankReport report(size_t i, Clock::time_point now) const;  // workers_[i]'s, as it is now
  std::vector<RankReport> localReports(Clock::time_point now) const;

  boost::asio::io_context& io_;
  const HangOptions options_;
  const std::string nodeName_;
  rendezvous::Rendezvous& rendezvous_;
  boost::asio::steady_timer timer_;
  std::filesystem::path attemptDir_;
  std::filesystem::path heartbeatDir_;
  const ProgressBoard* board_ = nullptr;
  std::unique_ptr<PythonStackHook> pythonHook_;  // the job's, made with its first round
  std::vector<WatchedWorker> workers_;
  std::vector<ProgressTrack> tracks_;
  std::vector<uint64_t> heartbeats_;  // each heartbeat file's last modification time
  std::function<void(const HungWorker&)> onHang_;
  bool stalled_ = false;  // called back for the current stall
  std::thread collector_;
};

}  // namespace dlrun::agents
