// Deciding that a job hangs and whom to blame (--hang-timeout; ARCHITECTURE.md section 9): pure
// rules over what the agent read of its workers' progress, and the per-rank reports the nodes
// share through the rendezvous so one summary names the suspect across the whole job. No I/O.
//
// A worker is hung when it reported progress at least once and then nothing for the timeout:
// one that never reports (a program that knows nothing of dlrun) is never called hung. A stuck
// rank stalls the others in their next collective, so every rank goes silent at about the same
// time; the suspect is therefore a stopped process (SIGSTOP, a tracer) if there is one, else a
// rank behind the others, else one NOT waiting in a collective (by its own phase report or by
// its stack), and among those the one silent longest.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"

namespace dlrun::agents {

// --hang-action: what a hang does.
enum class HangAction {
  Report,   // stacks and a summary; the job keeps waiting (again only after progress resumes)
  Restart,  // stacks and a summary, then a failure restart (counts against --max-restarts)
  Exit,     // stacks and a summary, then the job ends, restarts left or not
};

// --hang-timeout and --hang-action.
struct HangOptions {
  std::chrono::milliseconds timeout{0};
  HangAction action = HangAction::Restart;
};

// The exit code of a job that a hang ended (as GNU timeout's).
inline constexpr int kHangExitCode = 124;

// Where a worker's progress comes from.
enum class ProgressSource { Board, Heartbeat };

// One look at a worker's progress in one source.
struct ProgressSighting {
  // Changes whenever the worker makes progress there (the board's beats, the heartbeat file's
  // modification time); 0 means nothing reported yet.
  uint64_t marker = 0;
  std::optional<int64_t> step;
  bool inCollective = false;  // the board says the worker waits in a collective
};

// What the agent knows of one worker's progress.
class ProgressTrack {
 public:
  void observe(ProgressSource source, const ProgressSighting& seen, Clock::time_point now);
  // A marker that is not this worker's progress (its slot's, left by the process it replaced).
  void startFrom(ProgressSource source, uint64_t marker) {
    markers_[static_cast<size_t>(source)] = marker;
  }
  // Its silence counted from `now` on (a peer was replaced: the wait for it was no hang).
  void silentSince(Clock::time_point now) { last_ = now; }
  bool reported() const { return reported_; }
  Clock::duration silentFor(Clock::time_point now) const { return now - last_; }
  bool hung(Clock::time_point now, Clock::duration timeout) const {
    return reported_ && silentFor(now) >= timeout;
  }
  std::optional<int64_t> step() const { return step_; }
  bool inCollective() const { return inCollective_; }

 private:
  std::array<uint64_t, 2> markers_{};
  bool reported_ = false;
  Clock::time_point last_{};
  std::optional<int64_t> step_;
  bool inCollective_ = false;
};

// One rank's part of a hang report, as nodes share it.
struct RankReport {
  int rank = 0;
  std::string node;
  bool reported = false;  // it had made progress before
  bool stopped = false;   // its process was stopped (SIGSTOP, a tracer) when looked at
  std::optional<int64_t> step;
  double silentSeconds = 0;
  std::optional<std::string> collective;      // the collective it waits in, where known
  std::optional<std::string> lastCollective;  // NCCL's flight recorder's newest entry
  std::vector<std::string> topFrames;
  std::string stackFile;  // where its stack was written (on its node)
};

std::string encodeRankReports(const std::vector<RankReport>& reports);
// Throws ProtocolError for text that is not a rank report list.
std::vector<RankReport> decodeRankReports(std::string_view text);

// The suspect's index in `reports`: a stopped rank first (one stopped inside a collective may
// have entered it after the peers that wait on it), then one at an earlier step than another
// (a rank ahead waits for the others), then ranks not waiting in a collective, then the
// longest silent, then the lowest rank. Ranks that never reported are not suspected. Nothing
// when no rank reported.
std::optional<size_t> suspect(const std::vector<RankReport>& reports);

// The summary the node that saw the hang prints: the suspect (rank, node, last step, top
// frames), how long the others have waited and where, and how many nodes sent their part.
std::string hangSummary(std::vector<RankReport> reports, double timeoutSeconds, int nodesReported,
                        int nodes);

}  // namespace dlrun::agents
