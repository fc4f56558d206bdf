#include "store/memory_store_server.h"

#include <algorithm>
#include <stdexcept>

#include "common/error.h"

namespace dlrun {

Clock::time_point MemoryStoreServer::now() {
  std::lock_guard lock(mutex_);
  return nowLocked();
}

Clock::time_point MemoryStoreServer::nowLocked() const {
  return time_ == Time::Real ? Clock::now() : virtualNow_;
}

void MemoryStoreServer::addParticipants(int threads) {
  std::lock_guard lock(mutex_);
  participants_ += threads;
}

void MemoryStoreServer::removeParticipant() {
  std::lock_guard lock(mutex_);
  --participants_;
  advance();  // the threads left may all be waiting already
}

void MemoryStoreServer::Wait::send(std::string_view bytes) {
  replies.append(bytes);
  if (stalled) server.unstall(*this);
}

void MemoryStoreServer::handle(Peer& peer, const wire::Request& request) {
  const auto now = nowLocked();
  engine_.expireLeases(now);
  // The request may have answered waits (or, on real time, moved a lease deadline a waiter
  // sleeps towards), a refused one too: it renewed the peer's leases.
  struct Notify {
    std::condition_variable& changed;
    ~Notify() { changed.notify_all(); }
  } notify{changed_};
  // dlrund drops a connection that sent a refused request; in process the caller gets the
  // engine's RequestError (an Error) and the store is unchanged either way.
  engine_.handle(peer, request, now);
}

void MemoryStoreServer::block(std::unique_lock<std::mutex>& lock, Wait& wait) {
  waits_.push_back(&wait);
  struct Forget {  // whatever way block() is left
    MemoryStoreServer& server;
    Wait& wait;
    ~Forget() {
      if (wait.stalled) server.unstall(wait);
      std::erase(server.waits_, &wait);
    }
  } forget{*this, wait};

  if (time_ == Time::Virtual) {
    if (!wait.replies.empty() || wait.aborted || wait.deadline <= virtualNow_) return;
    wait.stalled = true;
    ++stalled_;
    if (stalled_ > participants_)
      throw std::logic_error(
          "a thread waits on a virtual-time MemoryStoreServer without taking part "
          "(addParticipants): nothing would ever move its time on");
    advance();
    changed_.wait(lock, [&] { return !wait.stalled; });
    return;
  }
  // Real time: nobody else fires leases, so a waiter wakes at the earliest lease deadline and
  // fires it itself; handle() fires them for every request too.
  while (wait.replies.empty() && !wait.aborted) {
    const auto now = Clock::now();
    const size_t leases = engine_.leaseCount();
    engine_.expireLeases(now);
    if (engine_.leaseCount() != leases) changed_.notify_all();  // tripwires answer others
    if (!wait.replies.empty() || now >= wait.deadline) return;
    auto wake = wait.deadline;
    if (auto lease = engine_.nextLeaseDeadline()) wake = std::min(wake, *lease);
    if (wake == Clock::time_point::max()) {
      changed_.wait(lock);  // a deadline at the end of time: no absolute time to convert
    } else {
      changed_.wait_until(lock, wake);
    }
  }
}

void MemoryStoreServer::unstall(Wait& wait) {
  wait.stalled = false;
  --stalled_;
}

void MemoryStoreServer::advance() {
  if (time_ != Time::Virtual) return;
  // Each step either answers or times out a stalled wait, or fires a lease, so this ends.
  while (participants_ > 0 && stalled_ == participants_) {
    auto next = Clock::time_point::max();
    for (const Wait* wait : waits_)
      if (wait->stalled) next = std::min(next, wait->deadline);
    if (auto lease = engine_.nextLeaseDeadline()) next = std::min(next, *lease);
    virtualNow_ = std::max(virtualNow_, next);
    // Leases first: a lease lapsing at the very moment a wait times out answers the wait.
    engine_.expireLeases(virtualNow_);
    for (Wait* wait : waits_)
      if (wait->stalled && wait->deadline <= virtualNow_) unstall(*wait);
    changed_.notify_all();
  }
}

void MemoryStoreServer::aborted(const MemoryStore* client) {
  for (Wait* wait : waits_) {
    if (wait->client != client) continue;
    wait->aborted = true;
    if (wait->stalled) unstall(*wait);
  }
  changed_.notify_all();
}

}  // namespace dlrun
