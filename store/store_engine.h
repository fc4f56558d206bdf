// The store's data and the meaning of every TCPStore op, free of I/O: the server feeds it
// parsed requests and it answers through each peer's send(). Waiters are woken when their keys
// appear, never by polling. Time comes from the caller, so lease expiry is as testable as the
// rest. Not thread-safe: dlrund's server drives it from its one io_context, MemoryStoreServer
// under its mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "store/wire.h"

namespace dlrun {

// A request the engine refuses (an ADD to a key that holds no integer, an op this engine does
// not serve), with why. The store is left unchanged; the caller answers its client: dlrund by
// dropping the connection, the in-process store by passing the exception on.
class RequestError : public Error {
 public:
  using Error::Error;
};

// A connected client as the engine sees it. Replies, immediate and deferred, go through send()
// in the order the engine produces them.
class Peer {
 public:
  virtual ~Peer() = default;
  virtual void send(std::string_view bytes) = 0;

 private:
  friend class StoreEngine;
  // What the engine keeps of each peer lives with the peer, not in maps keyed by it: a reply
  // or a wait reaches it without a hash lookup, at 100,000 peers a cache miss or two each.
  std::vector<uint64_t> waiters_;    // its waits, by id
  uint64_t groupWaits_ = 0;          // GROUP_WAITs it sent: from the first on, replies are framed
  std::vector<std::string> leases_;  // keys it holds leases on
};

class StoreEngine {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  StoreEngine() = default;
  StoreEngine(const StoreEngine&) = delete;
  StoreEngine& operator=(const StoreEngine&) = delete;

  // Applies one request from `peer`, received at `now`; any request renews the peer's leases.
  // Throws RequestError for a refused request.
  void handle(Peer& peer, const wire::Request& request, TimePoint now);

  // Forgets every wait of a peer that went away and fires its leases. Must be called before
  // the peer is destroyed.
  void disconnect(Peer& peer);

  // Fires every lease whose deadline is at or before `now`.
  void expireLeases(TimePoint now);
  // The earliest lease deadline, for the caller's one timer; nullopt without leases.
  std::optional<TimePoint> nextLeaseDeadline() const;

  size_t keyCount() const { return data_.size(); }
  size_t waiterCount() const { return waiters_.size(); }
  size_t leaseCount() const { return leases_.size(); }

 private:
  struct Waiter {
    Peer* peer;
    std::vector<std::string> missing;  // keys not yet written since the wait began
    size_t remaining;
    // A GROUP_WAIT's: its number on the peer's connection; its reply says whether a push woke it
    std::optional<uint64_t> group;
    bool pushed = false;  // a QUEUE_PUSH's wake-one brought one of its keys
  };

  struct Lease {
    Peer* owner;
    std::chrono::milliseconds ttl;
    TimePoint deadline;
    std::vector<std::pair<std::string, std::string>> tripwires;
  };

  void wait(Peer& peer, const wire::Request& request);
  // Until each key is written; `group`: a GROUP_WAIT's number.
  void addWaiter(Peer& peer, std::vector<std::string> keys,
                 std::optional<uint64_t> group = std::nullopt);
  void cancelWaits(Peer& peer);
  void cancelGroupWait(Peer& peer, uint64_t tag);  // GROUP_CANCEL
  // Every reply goes through these: framed for a peer that has sent a GROUP_WAIT (wire.h).
  void reply(Peer& peer, std::string_view bytes);
  void replyByte(Peer& peer, uint8_t value);
  void replyGroup(Peer& peer, uint64_t tag, wire::WaitReply value);
  // Every write to a key wakes every waiter on it: WAITs, which wait only on keys missing when
  // they began, and BARRIER arrivals, which wait on their counter.
  void keyWritten(const std::string& key);
  void wakeOne(const std::string& key);  // wakes the longest waiter on the key
  // One of its keys exists (`pushed`: a QUEUE_PUSH brought it); reply when all do.
  void keyArrivedFor(uint64_t waiterId, bool pushed = false);
  void forgetWaiter(uint64_t id);
  bool present(std::string_view key) const;  // a value, or a queue with items
  void compareSet(Peer& peer, const wire::Request& request);
  // The integer at `key` (0 when missing) plus delta; RequestError, naming `op`, when the value
  // is no integer or the sum overflows.
  int64_t sum(wire::Op op, std::string_view key, int64_t delta) const;
  void add(Peer& peer, const wire::Request& request);
  void barrier(Peer& peer, const wire::Request& request);
  void queuePop(Peer& peer, const wire::Request& request);
  void setValue(std::string_view key, std::string_view value);  // and wakes the key's waiters
  void lease(Peer& peer, const wire::Request& request, TimePoint now);
  void renewLeases(Peer& peer, TimePoint now);
  std::optional<Lease> dropLease(std::string_view key);  // ends it without firing
  void fireLease(std::string_view key);

  // Transparent hashing: lookups take the request's string_views without copying them.
  struct KeyHash {
    using is_transparent = void;
    size_t operator()(std::string_view key) const { return std::hash<std::string_view>{}(key); }
  };
  template <typename Value>
  using KeyMap = std::unordered_map<std::string, Value, KeyHash, std::equal_to<>>;

  KeyMap<std::string> data_;
  KeyMap<std::deque<std::string>> queues_;
  uint64_t nextWaiterId_ = 0;
  std::unordered_map<uint64_t, Waiter> waiters_;
  KeyMap<std::vector<uint64_t>> waitersByKey_;
  KeyMap<Lease> leases_;
  std::set<std::pair<TimePoint, std::string>> leaseDeadlines_;
};

}  // namespace dlrun
