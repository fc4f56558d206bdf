#include "agents/agent_observers.h"

#include <chrono>

namespace dlrun::agents {

void MetricsObserver::onRoundPreparing(const std::filesystem::path& attemptDir, int workers,
                                       const ProgressBoard* shared, RoundSpec& spec) {
  metrics_.prepareRound(attemptDir, workers, shared, spec);
}

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

void MetricsObserver::onNodeChanged(const control::NodeState& node) { metrics_.view().node(node); }

// Every node's page shows what it saw, whoever speaks for it.
void MetricsObserver::onEvent(const control::JobEvent& event, bool) {
  metrics_.view().event(event);
}

void ControlObserver::onNodeChanged(const control::NodeState& node) { publisher_.node(node); }

void ControlObserver::onEvent(const control::JobEvent& event, bool spokenHere) {
  if (spokenHere) publisher_.event(event);
}

// The control plane's events reach the store before the report, so the events of the job
// (group rank 0 publishes the round's end and the restart) show the cause first. A writer that
// cannot reach the store costs the bound.
void ControlObserver::onReporting() { publisher_.flush(std::chrono::milliseconds(500)); }

}  // namespace dlrun::agents
