#include "rendezvous/local_rendezvous.h"

#include "common/error.h"
#include "common/host_port.h"
#include "store/address.h"

namespace dlrun::rendezvous {

JoinResult LocalRendezvous::next() {
  std::vector<std::string> endpoints;
  for (uint16_t port : reserveFreePorts(options_.hostAddr, options_.localWorldSize))
    endpoints.push_back(joinHostPort(options_.hostAddr, port));
  const NodeJob job{options_.runId, options_.localWorldSize, options_.restarts, options_.store};
  std::lock_guard lock(mutex_);
  end_.reset();
  World world =
      makeWorld(job, round_++, {.worldSize = options_.localWorldSize, .failures = failures_},
                std::move(endpoints));
  world.workerRoles = options_.roles;
  return world;
}

RoundEnd LocalRendezvous::awaitEnd() {
  std::unique_lock lock(mutex_);
  ended_.wait(lock, [&] { return end_ || interrupted_; });
  if (!end_) throw Error("the rendezvous was interrupted");
  return *end_;
}

void LocalRendezvous::reportFailure(RoundEnd failure) {
  std::lock_guard lock(mutex_);
  failure.countFailure(failures_, options_.restarts);
  failures_ = failure.failures;
  end_ = std::move(failure);
  ended_.notify_all();
}

void LocalRendezvous::reportSuccess() {
  std::lock_guard lock(mutex_);
  end_ = RoundEnd{.kind = RoundEnd::Kind::Finished};
  ended_.notify_all();
}

RoundEnd LocalRendezvous::reportStop(int signal) { return jobStopped(signal, options_.nodeName); }

void LocalRendezvous::shareWithRound(RoundTopic topic, const std::string& text) {
  std::lock_guard lock(mutex_);
  shared_[topic] = text;
}

std::vector<std::string> LocalRendezvous::gatherFromRound(RoundTopic topic,
                                                          std::chrono::milliseconds) {
  std::lock_guard lock(mutex_);
  return {shared_[topic]};
}

void LocalRendezvous::interrupt() {
  std::lock_guard lock(mutex_);
  interrupted_ = true;
  ended_.notify_all();
}

}  // namespace dlrun::rendezvous
