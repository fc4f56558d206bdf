// "The first failure first": when a job ends in failure, one summary of every node's failed
// workers, the earliest in time first (docs/design/agent.md, "Failure reports"). Each node keeps
// its own workers' ends (NodeFailures), shares them with the round, and the round's group rank 0
// prints summarize()'s text. Pure: the codec and the text, no I/O.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::agents {

// One worker of the node that failed: it exited non-zero, or by a signal dlrun did not send it
// while stopping.
struct FailureRecord {
  int rank = 0;
  int localRank = 0;
  std::string node;
  int attempt = 0;     // the round's TORCHELASTIC_RESTART_COUNT
  double time = 0;     // unix seconds of its exit, as its agent reaped it
  std::string exit;    // ExitStatus::describe(): "exit code 3", "signal SIGKILL"
  std::string report;  // formatFailureReport(); kept for the node's earliest failure alone
};

// One node's workers at the end of a failed job: its failures, earliest first, and how many
// others ended otherwise. Bounded, so that a round of many nodes gathers little: the first
// kListed failures are kept (only the earliest with its report, cut to kReportBytes), the rest
// counted.
struct NodeFailures {
  static constexpr size_t kListed = 16;
  static constexpr size_t kReportBytes = 8 * 1024;

  std::string node;
  int baseRank = 0;  // the node's ranks: baseRank .. baseRank + workers - 1
  int workers = 0;
  int stopped = 0;    // ended by the signal dlrun sent them while stopping (or exited 0 then)
  int succeeded = 0;  // exited 0 before dlrun stopped anything
  int unlisted = 0;   // failures past kListed
  std::vector<FailureRecord> failures;

  // In the order the node's agent reaped them (its clock's order).
  void add(FailureRecord failure);
  int failed() const { return static_cast<int>(failures.size()) + unlisted; }

  std::string encode() const;  // JSON, for Rendezvous::shareWithRound
  // Throws ProtocolError for text that is not one node's list.
  static NodeFailures decode(std::string_view text);
};

// A report cut to about `limit` bytes: its first line, then its last lines that fit (the end of
// a traceback says most).
std::string capReport(const std::string& report, size_t limit);

struct FailureSummary {
  bool any = false;       // some node reported a failure; else there is nothing to say
  std::string firstLine;  // the headline, without the "dlrun: " of the text
  std::string text;       // every line, each starting with "dlrun: "
};

// The summary of the nodes' lists: the earliest failure (its rank, node, attempt, exit and
// report), then the others in time order (at most kOthersShown, then a count), the counts of
// ranks failed after it and stopped by dlrun, and a line for each node in `missing` (described
// by the caller) that did not report in time.
inline constexpr size_t kOthersShown = 8;
FailureSummary summarize(const std::vector<NodeFailures>& nodes,
                         const std::vector<std::string>& missing);

// The nodes that reported nothing, from the round's workers' endpoints (host:port, by RANK):
// each host with ranks that no reported list covers, as "HOST (ranks A-B)".
std::vector<std::string> unreported(const std::vector<NodeFailures>& reported,
                                    const std::vector<std::string>& workerEndpoints);

// What a final failure's report says before its worker's report (a crash loop, a
// --no-restart-exit-code exit): kept above the summary. Empty where it says nothing more.
std::string reportPreface(const std::string& report);

}  // namespace dlrun::agents
