// EtcdKeepAlive: one lease of an EtcdClient (etcd_client.h) renewed over a LeaseKeepAlive
// stream, on a thread of its own. Its code: etcd_keep_alive.cpp.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/clock.h"

namespace grpc {
class Channel;
}

namespace dlrun::rendezvous::etcd {

class EtcdClient;

// Keeps one lease alive over a LeaseKeepAlive stream. It owns a thread: renewals must go on
// while the lease's owner is blocked elsewhere (a wait, a watch); the thread drives the stream
// through a completion queue, so a member that stops answering costs one renewal's deadline, and
// sleeps between renewals on a condition variable, so stop() ends it at once.
//
// Fail-over: when the stream fails (UNAVAILABLE, its end, a renewal unanswered within its
// deadline) the thread opens a new one on another endpoint of the client and goes on renewing
// the same lease. It gives up only when etcd says the lease is gone (TTL <= 0), or when nothing
// was acknowledged for the lease's TTL plus kElectionGrace, or for the client's outageTimeout
// where longer (a new leader, and a cluster started again with its data, extend every lease by
// its TTL, so a renewal that lands after an election or an outage still finds it): alive()
// turns false and failure() says why, and the keys lapse.
class EtcdKeepAlive {
 public:
  // An election on etcd's default settings takes 1 to 2 s; renewals stall meanwhile.
  static constexpr std::chrono::milliseconds kElectionGrace{3'000};
  // The longest a pick of an endpoint keeps the thread from seeing stop().
  static constexpr std::chrono::milliseconds kPickSlice{250};

  EtcdKeepAlive(EtcdClient& client, int64_t lease, std::chrono::milliseconds interval);
  ~EtcdKeepAlive();  // stop()
  EtcdKeepAlive(const EtcdKeepAlive&) = delete;
  EtcdKeepAlive& operator=(const EtcdKeepAlive&) = delete;

  // Ends the renewals (the lease itself lives on until its TTL passes); idempotent. At once,
  // except while the thread picks a new endpoint with none answering: up to connectTimeout.
  void stop();
  bool alive() const { return alive_; }
  std::string failure() const;
  int64_t lease() const { return lease_; }
  // Renewals etcd acknowledged.
  int64_t renewals() const { return renewals_; }
  // The endpoint the stream uses now ("" between two).
  std::string endpoint() const;

 private:
  struct Stream;
  void run();
  // One stream on one endpoint until it fails (returns why) or the renewals end (returns "").
  std::string renewOn(const std::string& endpoint, const std::shared_ptr<grpc::Channel>& channel,
                      const std::string& token, Clock::time_point& lastAck,
                      std::chrono::milliseconds& ttl);
  void fail(std::string why);
  bool pause(std::chrono::milliseconds duration);  // false when stopping

  EtcdClient& client_;
  const int64_t lease_;
  const std::chrono::milliseconds interval_;
  std::atomic<bool> alive_{true};
  std::atomic<int64_t> renewals_{0};
  mutable std::mutex mutex_;  // stopping_, failure_, endpoint_, stream_
  std::condition_variable wake_;
  bool stopping_ = false;
  std::string failure_;
  std::string endpoint_;
  Stream* stream_ = nullptr;  // the thread's current stream, for stop() to cancel
  std::mutex joinMutex_;
  std::thread thread_;
};

}  // namespace dlrun::rendezvous::etcd
