// The first failure first (failure_summary.h): this node notes how each of its workers ended;
// when a final failure ends the job, each node shares its list with the round once its own
// workers are gone, and group rank 0 gathers the lists (bounded: a node that does not report
// in time is named) and prints one summary instead of the round's report, writes it where
// GetJob's root cause reads it (ctl/summary) and gives its first line to the job_ended event.
#include <signal.h>
#include <unistd.h>

#include <chrono>

#include "agents/agent_impl.h"
#include "common/clock.h"

namespace dlrun::agents::detail {

namespace {

bool sent(uint64_t signals, int sig) { return sig > 0 && sig < 64 && (signals >> sig) & 1U; }

}  // namespace

WorkerFailure AgentImpl::failureOf(const Worker& w) const {
  const auto timer = expiredTimers_.find(w.pid());
  return {w.rank(),
          w.localRank(),
          options_.nodeName,
          w.status(),
          readErrorFile(w.errorFile()),
          w.lastErrorLines(),
          timer == expiredTimers_.end() ? "" : timer->second};
}

// A worker that ended by the very signal dlrun sent it while stopping (or that exited 0 or
// 128 + that signal then, as a shell reports it) was stopped by dlrun; any other non-zero end is
// a failure, also one that came after the stop (a worker that traps SIGTERM and exits 4).
void AgentImpl::noteWorkerEnd(const Worker& w) {
  const ExitStatus& status = w.status();
  const bool stopping = stopSignalsSent_ != 0;
  if (status.success()) {
    ++(stopping ? nodeFailures_.stopped : nodeFailures_.succeeded);
    return;
  }
  if ((status.signaled && sent(stopSignalsSent_, status.value)) ||
      (!status.signaled && status.value > 128 && sent(stopSignalsSent_, status.value - 128))) {
    ++nodeFailures_.stopped;
    return;
  }
  const double now = unixSeconds();
  nodeFailures_.add({.rank = w.rank(),
                     .localRank = w.localRank(),
                     .node = options_.nodeName,
                     .attempt = world_.round,
                     .time = now,
                     .exit = status.describe(),
                     .report = nodeFailures_.failures.empty()
                                   ? formatFailureReport(failureOf(w), world_.failures)
                                   : ""});
}

// A final failure (not a hang, whose report is its stacks'): true where the summary is under
// way; the agent finishes once it is done (afterSummary).
bool AgentImpl::summarizeFailure(const rendezvous::RoundEnd& end) {
  if (summaryThread_.joinable()) return true;  // under way already
  NodeFailures mine = nodeFailures_;
  mine.node = options_.nodeName;
  mine.baseRank = world_.baseRank;
  mine.workers = world_.localWorldSize;
  const bool gather = world_.groupRank == 0;
  // Share and gather are blocking store calls (the gather waits for the other nodes): on a
  // thread of their own, while the io_context goes on heeding signals.
  summaryThread_ =
      std::thread([this, end, mine = std::move(mine), gather, endpoints = world_.workerEndpoints] {
        auto summary = shareFailures(mine, gather, endpoints);
        asio::post(io_, [this, end, summary = std::move(summary)] { afterSummary(end, summary); });
      });
  return true;
}

// On the summary's thread: this node's list to the round; group rank 0's gathered summary.
std::optional<FailureSummary> AgentImpl::shareFailures(const NodeFailures& mine, bool gather,
                                                       const std::vector<std::string>& endpoints) {
  try {
    rendezvous_.shareWithRound(rendezvous::RoundTopic::Failures, mine.encode());
    if (!gather) return std::nullopt;
    std::vector<NodeFailures> lists;
    for (const auto& text :
         rendezvous_.gatherFromRound(rendezvous::RoundTopic::Failures, kSummaryGather)) {
      if (text.empty()) continue;
      try {
        lists.push_back(NodeFailures::decode(text));
      } catch (const ProtocolError& e) {  // its ranks count as not reported
        log::info(std::string("failure summary: ") + e.what());
      }
    }
    FailureSummary summary = summarize(lists, unreported(lists, endpoints));
    if (summary.any) publishSummary(summary.text);
    return summary;
  } catch (const std::exception& e) {  // the round's report is said instead
    log::info(std::string("failure summary: not ") + (gather ? "gathered: " : "shared: ") +
              e.what());
    return std::nullopt;
  }
}

// On the summary's thread: before the job_ended event, so that whoever sees the event reads the
// summary. Best effort, as the control plane is (its connection's bounded timeouts).
void AgentImpl::publishSummary(const std::string& text) {
  if (!options_.control || !options_.control->connect) return;
  try {
    options_.control->connect()->set(control::Keys(options_.control->runId).summary(), text);
  } catch (const std::exception& e) {
    log::debug(std::string("cannot publish the failure summary: ") + e.what());
  }
}

void AgentImpl::afterSummary(const rendezvous::RoundEnd& end,
                             const std::optional<FailureSummary>& summary) {
  if (state_ == State::Finished) return;
  std::string text = end.report;
  if (summary && summary->any) {
    text = reportPreface(end.report) + summary->text;
    summaryLine_ = summary->firstLine;
  }
  [[maybe_unused]] auto n = ::write(STDERR_FILENO, text.data(), text.size());
  finish(end.exitCode);
}

}  // namespace dlrun::agents::detail
