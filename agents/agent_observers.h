// The agent's two observers (agent_observer.h): --metrics-port's AgentMetrics and the control
// plane's ControlPublisher, each told the agent's moments in its own terms.
#pragma once

#include <functional>
#include <memory>
#include <set>

#include "agents/agent_metrics.h"
#include "agents/agent_observer.h"
#include "agents/control_publisher.h"
#include "agents/rank_rates.h"

namespace dlrun::agents {

// AgentView is told every moment; the server and the sampler run on the agent's io_context.
class MetricsObserver : public AgentObserver {
 public:
  // Binds at once; throws ConfigError when the port cannot be had (AgentMetrics).
  MetricsObserver(boost::asio::io_context& io, MetricsOptions options, std::string nodeName)
      : metrics_(io, std::move(options), std::move(nodeName)) {}

  void onRoundStarted(const rendezvous::World& world, int workers, Clock::time_point now) override;
  void onRoundEnded(const rendezvous::RoundEnd& end, Clock::time_point now) override;
  void onRestarting(const rendezvous::RoundEnd& end) override;
  void onWorkerExited(int shellCode) override;
  void onProgress(const ProgressSample& sample) override;
  void onNodeChanged(const control::NodeState& node) override;
  void onStragglers(const std::map<int, control::Straggler>& named) override;
  void onEvent(const control::JobEvent& event, bool spokenHere) override;

 private:
  AgentMetrics metrics_;
};

// The node's state, its ranks' pace and the events this node speaks for go to the control
// plane.
class ControlObserver : public AgentObserver {
 public:
  ControlObserver(ControlOptions options, std::function<void(const ControlCommand&)> onCommand,
                  ControlPublisher::StragglersSeen onStragglers)
      : publisher_(std::move(options), std::move(onCommand), std::move(onStragglers)) {}

  void onRoundStarted(const rendezvous::World& world, int workers, Clock::time_point now) override;
  void onAttemptFiles(const AttemptFiles& files) override { publisher_.attemptFiles(files); }
  void onProgress(const ProgressSample& sample) override;
  void onNodeChanged(const control::NodeState& node) override;
  void onEvent(const control::JobEvent& event, bool spokenHere) override;
  void onReporting() override;

 private:
  // A record unchanged but for the time since the ranks' last steps is rewritten this often.
  static constexpr double kRefresh = 5;

  ControlPublisher publisher_;
  RankRates rates_;
  std::optional<control::NodeProgress> sent_;  // the last record handed to the publisher
  std::set<int> exited_;                       // ranks whose workers are gone, this round
};

}  // namespace dlrun::agents
