// The in-process store server: the StoreEngine that gives dlrund its meaning, under a mutex,
// with MemoryStore clients as its peers. Nothing is parsed or sent over a socket, but every op
// is the engine's, so the in-memory store and dlrund cannot drift apart.
//
// Time is real (Clock) or virtual. Virtual time is a discrete-event simulation for tests: the
// test declares the threads that take part; while any of them runs, time stands still; when
// every one of them is blocked in a store wait that nothing has answered, time jumps to the
// earliest deadline pending (a wait's timeout or a lease's), leases due by then fire and waits
// due by then time out. So a test runs minutes of a protocol in microseconds, without sleeps,
// and what happens when depends only on the protocol. A node that stops making requests
// without disconnecting (a silent node) is a client no participating thread drives: its
// leases lapse as the others' waits move time on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "store/store_engine.h"

namespace dlrun {

class MemoryStore;

class MemoryStoreServer {
 public:
  enum class Time { Real, Virtual };

  // Virtual time starts at Clock::time_point{}.
  explicit MemoryStoreServer(Time time = Time::Real) : time_(time) {}
  MemoryStoreServer(const MemoryStoreServer&) = delete;
  MemoryStoreServer& operator=(const MemoryStoreServer&) = delete;

  Clock::time_point now();

  // Virtual time: `threads` more threads take part. Call it from the thread that starts them,
  // before they start, so that time cannot run on before they are counted. Every thread that
  // may block in a store wait must take part: a wait with nobody counted throws
  // std::logic_error instead of hanging.
  void addParticipants(int threads);
  // Virtual time: a participating thread is done (call it from that thread, as it ends).
  void removeParticipant();

 private:
  friend class MemoryStore;

  // One wait in progress, registered with the engine as a peer of its own: threads sharing a
  // client may wait at once, and no deferred reply lands among the client's immediate ones.
  struct Wait : Peer {
    Wait(MemoryStoreServer& server, const MemoryStore* client, Clock::time_point deadline)
        : server(server), client(client), deadline(deadline) {}
    void send(std::string_view bytes) override;

    MemoryStoreServer& server;
    const MemoryStore* client;
    const Clock::time_point deadline;
    std::string replies;
    bool stalled = false;  // counted in stalled_: blocked, unanswered, not timed out
    bool aborted = false;  // its client was aborted meanwhile
  };

  Clock::time_point nowLocked() const;
  // Applies one request; throws Error with the engine's refusal. Leases due fire first, so
  // no request sees a key whose lease has lapsed. Call with mutex_ held.
  void handle(Peer& peer, const wire::Request& request);
  // Blocks until `wait` has a reply, its deadline passes or its client is aborted.
  // Throws std::logic_error when virtual time would wait on a thread that takes no part.
  void block(std::unique_lock<std::mutex>& lock, Wait& wait);
  void unstall(Wait& wait);
  // Virtual time: while every participant is stalled, moves time to the next deadline.
  void advance();
  // Wakes the waits of a client that was aborted.
  void aborted(const MemoryStore* client);

  const Time time_;
  std::mutex mutex_;
  std::condition_variable changed_;
  StoreEngine engine_;
  Clock::time_point virtualNow_{};
  int participants_ = 0;
  int stalled_ = 0;
  std::vector<Wait*> waits_;  // every wait in block(), stalled or not
};

}  // namespace dlrun
