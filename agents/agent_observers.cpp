#include "agents/agent_observers.h"

#include <chrono>

namespace dlrun::agents {

void MetricsObserver::onRoundStarted(const rendezvous::World& world, int workers,
                                     Clock::time_point now) {
  metrics_.view().roundStarted(world, workers, now);
}

void MetricsObserver::onRoundEnded(const rendezvous::RoundEnd& end, Clock::time_point now) {
  metrics_.view().roundEnded(end, now);
}

void MetricsObserver::onRestarting(const rendezvous::RoundEnd& end) {
  metrics_.view().restarting(end);
}

void MetricsObserver::onWorkerExited(int shellCode) { metrics_.view().workerExited(shellCode); }

void MetricsObserver::onProgress(const ProgressSample& sample) {
  metrics_.view().progress(sample.board, sample.wall);
}

void MetricsObserver::onNodeChanged(const control::NodeState& node) { metrics_.view().node(node); }

void MetricsObserver::onStragglers(const std::map<int, control::Straggler>& named) {
  metrics_.view().stragglers(named);
}

// Every node's page shows what it saw, whoever speaks for it.
void MetricsObserver::onEvent(const control::JobEvent& event, bool) {
  metrics_.view().event(event);
}

void ControlObserver::onRoundStarted(const rendezvous::World& world, int workers,
                                     Clock::time_point) {
  rates_.reset(world.round, world.baseRank, workers);
  sent_.reset();
  exited_.clear();
  rates_.period(control::recordPeriod(world.groupWorldSize));
  publisher_.round(world.round, world.groupWorldSize, world.groupRank == 0);
}

// Handed over when a step or a result changed, or every few seconds: the publisher writes the
// newest at most once a second.
void ControlObserver::onProgress(const ProgressSample& sample) {
  control::NodeProgress next =
      rates_.observe(sample.board, sample.metrics, sample.now, sample.wall);
  for (auto& rank : next.ranks) rank.exited = exited_.contains(rank.rank);
  if (next.ranks.empty() || (sent_ && !progressChanged(*sent_, next, kRefresh))) return;
  sent_ = next;
  publisher_.progress(std::move(next));
}

void ControlObserver::onNodeChanged(const control::NodeState& node) {
  for (const auto& w : node.workers)
    if (w.state != "running") exited_.insert(w.rank);
  publisher_.node(node);
}

void ControlObserver::onEvent(const control::JobEvent& event, bool spokenHere) {
  if (spokenHere) publisher_.event(event);
}

// The control plane's events reach the store before the report, so the events of the job
// (group rank 0 publishes the round's end and the restart) show the cause first. A writer that
// cannot reach the store costs the bound.
void ControlObserver::onReporting() { publisher_.flush(std::chrono::milliseconds(500)); }

}  // namespace dlrun::agents
