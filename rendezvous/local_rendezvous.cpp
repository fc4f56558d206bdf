#include "rendezvous/local_rendezvous.h"

#include "common/error.h"
#include "rendezvous/store/address.h"
#include "rendezvous/store/tcp_stream.h"

namespace dlrun::rendezvous {

JoinResult LocalRendezvous::next() {
  World world;
  world.runId = options_.runId;
  world.localWorldSize = options_.localWorldSize;
  world.worldSize = options_.localWorldSize;
  world.maxRestarts = options_.maxRestarts;
  world.masterAddr = options_.storeAddr;
  world.masterPort = options_.storePort;
  for (uint16_t port : reserveFreePorts(options_.hostAddr, options_.localWorldSize))
    world.workerEndpoints.push_back(joinHostPort(options_.hostAddr, port));
  std::lock_guard lock(mutex_);
  world.round = round_++;
  world.failures = failures_;
  end_.reset();
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
  failure.countFailure(failures_, options_.maxRestarts);
  failures_ = failure.failures;
  end_ = std::move(failure);
  ended_.notify_all();
}

void LocalRendezvous::reportSuccess() {
  std::lock_guard lock(mutex_);
  end_ = RoundEnd{.kind = RoundEnd::Kind::Finished};
  ended_.notify_all();
}

RoundEnd LocalRendezvous::reportStop(int signal) {
  return jobStopped(signal, options_.nodeName);
}

void LocalRendezvous::interrupt() {
  std::lock_guard lock(mutex_);
  interrupted_ = true;
  ended_.notify_all();
}

}  // namespace dlrun::rendezvous
