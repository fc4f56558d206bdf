// What the agent tells its observers (agent_observer.h): its node's state and the job's events.
#include <chrono>

#include "agents/agent_impl.h"
#include "common/clock.h"

namespace dlrun::agents::detail {

// What the control plane shows of this node: its state and its workers'. One that sat out is
// in no round until its next workers start: no group rank, and the last round's workers are
// gone (their ranks went to others); `round` stays its last.
void AgentImpl::publishNode(const std::string& state) {
  if (observers_.empty()) return;
  control::NodeState node{.name = options_.control ? options_.control->nodeName : options_.nodeName,
                          .address = options_.control ? options_.control->address : "",
                          .groupRank = world_.groupRank,
                          .state = state,
                          .round = world_.round,
                          .logDir = logRoot_.string(),
                          .updated = unixSeconds()};
  if (sittingOut_) {
    node.groupRank = -1;
    if (state == control::kSittingOut) node.sittingOut = sittingOut_;
    for (const auto& observer : observers_) observer->onNodeChanged(node);
    return;
  }
  for (const auto& w : workers_) {
    const bool done = !w->alive();
    node.workers.push_back({.rank = w->rank(),
                            .localRank = w->localRank(),
                            .pid = w->pid(),
                            .state = !done                      ? "running"
                                     : w->status().success()    ? "succeeded"
                                     : stopSignal_ || roundEnd_ ? "stopped"
                                                                : "failed",
                            .exit = done ? w->status().describe() : ""});
  }
  for (const auto& observer : observers_) observer->onNodeChanged(node);
}

const char* AgentImpl::stateName() const {
  switch (state_) {
    case State::Joining: return "joining";
    case State::Running: return "running";
    case State::Done: return "done";
    case State::Stopping: return "stopping";
    case State::Finished: return "exited";
  }
  return "?";
}

void AgentImpl::publishEvent(const std::string& kind, int rank, const std::string& detail,
                             bool spokenHere) {
  if (observers_.empty()) return;
  control::JobEvent event{.time = unixSeconds(),
                          .kind = kind,
                          .node = options_.control ? options_.control->nodeName : options_.nodeName,
                          .round = world_.round,
                          .rank = rank,
                          .detail = detail};
  for (const auto& observer : observers_) observer->onEvent(event, spokenHere);
}

// An event of the job as a whole: group rank 0 speaks for every node to the control plane;
// every node's page shows what it saw.
void AgentImpl::publishJobEvent(const std::string& kind, int rank, const std::string& detail) {
  if (attempt_ > 0) publishEvent(kind, rank, detail, world_.groupRank == 0);
}

void AgentImpl::publishStarted() {
  sittingOut_.reset();
  if (observers_.empty() || workers_.empty()) return;
  publishNode("running");
  publishJobEvent("round_closed", -1,
                  "round " + std::to_string(world_.round) + ": " +
                      std::to_string(world_.groupWorldSize) + " nodes, " +
                      std::to_string(world_.worldSize) + " workers");
  publishEvent("worker_started", -1,
               "ranks " + std::to_string(world_.baseRank) + "-" +
                   std::to_string(world_.baseRank + world_.localWorldSize - 1) + " started");
}

// This node's events reach the store before a report that ends the round, so the events of
// the job (group rank 0 publishes the round's end and the restart) show the cause first. It
// blocks, as the report itself does.
void AgentImpl::flushEvents() {
  for (const auto& observer : observers_) observer->onReporting();
}

}  // namespace dlrun::agents::detail
