// The node's checks before it joins a round (health_check.h): fit, it joins; unfit, it sits the
// round out (a spare takes its place, or the round forms without it), says why once, and is
// checked again until it passes. A node no other can stand in for (--nnodes=1) ends instead.
// Sitting out is its state for the observers (kSittingOut: the job's page, `dlrun top`, the
// metric dlrun_node_sitting_out) until it passes.
#include "agents/agent_impl.h"

namespace dlrun::agents::detail {

bool AgentImpl::awaitHealthy() {
  if (!options_.health) return true;
  HealthOptions health = *options_.health;
  health.dirs = {logRoot_};
  if (options_.checkpointDir) health.dirs.emplace_back(*options_.checkpointDir);
  std::string said;                          // the problem last said: a new one is said again
  bool saidQuarantined = false;              // the quarantine, said once: its text counts down
  std::optional<Clock::time_point> failing;  // since when its checks fail
  for (;;) {
    // A node no other can stand in for is never put out.
    HealthProblem problem = health.alone ? std::nullopt : quarantine_.reason(Clock::now());
    const bool quarantined = problem.has_value();
    if (!problem) problem = checkHealth(health);
    failing = problem && !quarantined ? failing.value_or(Clock::now())
                                      : std::optional<Clock::time_point>();
    if (!problem) {
      if (!said.empty())
        asio::post(io_, [this] {
          log::info("this node passes its health checks again: joining the next round");
          publishEvent("health_check_passed", -1, "joining the next round");
          if (state_ == State::Joining) publishNode("joining");
        });
      return true;
    }
    if (health.alone || (failing && Clock::now() - *failing >= health.giveUp)) {
      const std::string why = health.alone ? "this node failed its health check: "
                                           : "this node failed its health checks for " +
                                                 std::to_string(health.giveUp.count() / 1000) +
                                                 " s (the rendezvous's join_timeout): ";
      asio::post(io_, [this, message = why + *problem] { onRendezvousError(1, message); });
      return false;
    }
    if (quarantined ? !saidQuarantined : *problem != said) {
      said = *problem;
      saidQuarantined = quarantined;
      control::SittingOut out{.cause = quarantined ? control::kQuarantine : control::kHealthCheck,
                              .reason = *problem};
      asio::post(io_, [this, out = std::move(out)] {
        log::info("this node sits out the next round: " + out.reason);
        sittingOut_ = out;
        publishEvent("health_check_failed", -1, out.reason);
        if (state_ == State::Joining) publishNode(control::kSittingOut);
      });
    }
    if (!pauseRoundThread(health.recheck)) return false;
  }
}

bool AgentImpl::pauseRoundThread(Clock::duration pause) {
  std::unique_lock lock(pauseMutex_);
  return !pauseWake_.wait_for(lock, pause, [this] { return pausesInterrupted_; });
}

void AgentImpl::interruptPauses() {
  {
    std::lock_guard lock(pauseMutex_);
    pausesInterrupted_ = true;
  }
  pauseWake_.notify_all();
}

}  // namespace dlrun::agents::detail
