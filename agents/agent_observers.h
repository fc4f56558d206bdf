// The agent's two observers (agent_observer.h): --metrics-port's AgentMetrics and the control
// plane's ControlPublisher, each told the agent's moments in its own terms.
#pragma once

#include <functional>
#include <memory>

#include "agents/agent_metrics.h"
#include "agents/agent_observer.h"
#include "agents/control_publisher.h"

namespace dlrun::agents {

// AgentView is told every moment; the server and the sampler run on the agent's io_context.
class MetricsObserver : public AgentObserver {
 public:
  // Binds at once; throws ConfigError when the port cannot be had (AgentMetrics).
  MetricsObserver(boost::asio::io_context& io, MetricsOptions options, std::string nodeName)
      : metrics_(io, std::move(options), std::move(nodeName)) {}

  void onRoundPreparing(const std::filesystem::path& attemptDir, int workers,
                        const ProgressBoard* shared, RoundSpec& spec) override;
  void onRoundStarted(const rendezvous::World& world, int workers, Clock::time_point now) override;
  void onRoundEnded(const rendezvous::RoundEnd& end, Clock::time_point now) override;
  void onRestarting(const rendezvous::RoundEnd& end) override;
  void onWorkerExited(int shellCode) override;
  void onNodeChanged(const control::NodeState& node) override;
  void onEvent(const control::JobEvent& event, bool spokenHere) override;

 private:
  AgentMetrics metrics_;
};

// The node's state and the events this node speaks for go to the control plane.
class ControlObserver : public AgentObserver {
 public:
  ControlObserver(ControlOptions options, std::function<void(const ControlCommand&)> onCommand)
      : publisher_(std::move(options), std::move(onCommand)) {}

  void onNodeChanged(const control::NodeState& node) override;
  void onEvent(const control::JobEvent& event, bool spokenHere) override;
  void onReporting() override;

 private:
  ControlPublisher publisher_;
};

}  // namespace dlrun::agents
