// Stopping the workers: the stop signal to each process group, SIGKILL after --stop-timeout,
// then the end that the stop or the round decides; finishing the agent.
#include <signal.h>

#include <utility>

#include "agents/agent_impl.h"
#include "common/log.h"

namespace dlrun::agents::detail {

void AgentImpl::signalWorkers(int sig) {
  for (const auto& w : workers_) w->signal(sig);
}

void AgentImpl::signalToStop(int sig) {
  if (sig > 0 && sig < 64) stopSignalsSent_ |= uint64_t{1} << sig;
  signalWorkers(sig);
}

// A stop while stopping (a signal after a worker's failure, the control plane's stop) signals
// again but keeps the first stop's deadline: no stop buys the workers a new grace period.
void AgentImpl::stop(int sig) {
  const bool stopping = std::exchange(state_, State::Stopping) == State::Stopping;
  if (storeHost_) storeHost_.reset();
  if (hang_) hang_->unwatch();
  signalToStop(sig);
  if (liveWorkers() == 0) return onStopped();
  if (stopping) return;
  stopTimer_.expires_after(options_.stopTimeout);
  stopTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    for (const auto& w : workers_) {
      if (w->alive())
        log::info("rank " + std::to_string(w->rank()) + " did not stop within " +
                  std::to_string(options_.stopTimeout.count()) + " ms; sending SIGKILL");
    }
    signalToStop(SIGKILL);
  });
}

void AgentImpl::onStopped() {
  stopTimer_.cancel();
  if (launchFailed_) return finish(exitCode_);
  if (stopSignal_) {
    const bool stopped = stopEnd_ && stopEnd_->kind == rendezvous::RoundEnd::Kind::Stopped;
    if (stopped) log::info(stopEnd_->report);
    return finish(stopped ? stopEnd_->exitCode : 128 + *stopSignal_);
  }
  // Kept workers that the next round could not keep: its workers start now, unless it has
  // ended meanwhile.
  if (auto next = std::exchange(pendingWorld_, std::nullopt); next && !roundEnd_) {
    killLeftovers();
    return startAttempt(*next);
  }
  state_ = State::Done;  // no workers; the round's end decides what follows
  if (roundEnd_) endOfRound();
}

// Whatever the workers left behind in their process groups goes with them, so no job leaves
// orphans, whether it failed or succeeded.
void AgentImpl::killLeftovers() {
  for (const auto& w : workers_) w->killGroup();
  for (const auto& w : retired_) w->killGroup();  // the children of those restarted alone
}

// The last round's workers, all reaped: a new round starts without them.
void AgentImpl::forgetWorkers() {
  workers_.clear();
  retired_.clear();
  byPid_.clear();
  live_ = liveEnding_ = 0;
}

void AgentImpl::finish(int code) {
  if (consoleDedup_) consoleDedup_->flush();
  killLeftovers();
  state_ = State::Finished;
  exitCode_ = code;
  publishNode("exited");
  // Group rank 0's failure summary's headline, where it gathered one (agent_summary.cpp).
  publishJobEvent("job_ended", -1,
                  "every agent exits with " + std::to_string(code) +
                      (summaryLine_.empty() ? "" : ": " + summaryLine_));
  stopTimer_.cancel();
  signals_.cancel();
  launcherLink_.close();
  io_.stop();
}

}  // namespace dlrun::agents::detail
