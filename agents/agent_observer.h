// What the agent tells those who watch it (agent.h): the moments of its rounds and workers, its
// node's state and the job's events. The agent keeps a list and tells each one, in order; what
// an observer does with them is its own business. Every call comes on the agent's io_context.
//
// Two observe it (agent_observers.h): --metrics-port's AgentMetrics and the control plane's
// ControlPublisher, which stay independent of the agent.
#pragma once

#include "agents/log_server.h"
#include "agents/progress_sampler.h"
#include "common/clock.h"
#include "control/state/control_state.h"
#include "control/state/stragglers.h"
#include "rendezvous/round_end.h"
#include "rendezvous/world.h"

namespace dlrun::agents {

class AgentObserver {
 public:
  virtual ~AgentObserver() = default;

  // Every worker of the round started.
  virtual void onRoundStarted(const rendezvous::World& /*world*/, int /*workers*/,
                              Clock::time_point /*now*/) {}
  // The round's workers are about to start, their output files (if any) in `files.dir`.
  virtual void onAttemptFiles(const AttemptFiles& /*files*/) {}
  virtual void onRoundEnded(const rendezvous::RoundEnd& /*end*/, Clock::time_point /*now*/) {}
  // A new round follows this end.
  virtual void onRestarting(const rendezvous::RoundEnd& /*end*/) {}
  virtual void onWorkerExited(int /*shellCode*/) {}
  // One look at the round's progress board, twice a second (progress_sampler.h).
  virtual void onProgress(const ProgressSample& /*sample*/) {}
  virtual void onNodeChanged(const control::NodeState& /*node*/) {}
  // The ranks named slow now (group rank 0's straggler watch), each time that changes.
  virtual void onStragglers(const std::map<int, control::Straggler>& /*named*/) {}
  // `spokenHere`: this node speaks for the event to the job (false: an event of the job as a
  // whole, which group rank 0 speaks for, that this node saw too).
  virtual void onEvent(const control::JobEvent& /*event*/, bool /*spokenHere*/) {}
  // A report that ends the round is about to go to the rendezvous: what was told before it
  // should be out first (blocks, within a bound).
  virtual void onReporting() {}
};

}  // namespace dlrun::agents
