// What the elastic rendezvous needs of a store beyond Store: a record that lives only as long
// as its holder does, waits that give up without an error, reads that do not wait, and a way to
// break a blocked call. The rendezvous is written against this interface, so a store other than
// dlrund slots in without touching the round protocol.
//
// Implementations: TcpStore (dlrund's LEASE op over TCP), MemoryStore (the same engine in
// process, on real or virtual time, so the rounds can be tested deterministically), and
// EtcdStore (rendezvous/etcd/: an etcd lease kept alive on one stream; tripwires written by the
// job's watchers when they see a leased key deleted).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "store/store.h"

namespace dlrun {

class LeasingStore : public Store {
 public:
  // Sets key=value and ties it to this connection: every request on the connection renews the
  // lease for `ttl`; when the connection closes (abort(), destruction, a killed process) or
  // `ttl` passes without a request, the store deletes the key and sets each tripwire key that
  // does not exist yet. deleteKey(key) releases it without that. Throws Error for ttl <= 0.
  virtual void lease(const std::string& key, const std::string& value,
                     std::chrono::milliseconds ttl,
                     const std::vector<std::pair<std::string, std::string>>& tripwires) = 0;

  // add(counter, 1), then, when the result n is at most `limit`, lease(keyOf(n), value, ttl,
  // tripwires); returns n. One request where the store can (etcd: the add's transaction
  // writes the lease's keys in the branch of each value it tries); here, two.
  virtual int64_t addThenLease(const std::string& counter, int64_t limit,
                               const std::function<std::string(int64_t)>& keyOf,
                               const std::string& value, std::chrono::milliseconds ttl,
                               const std::vector<std::pair<std::string, std::string>>& tripwires) {
    const int64_t n = add(counter, 1);
    if (n <= limit) lease(keyOf(n), value, ttl, tripwires);
    return n;
  }

  // Waits until every key exists: true, or false once `timeout` passed on now()'s clock (the
  // connection stays usable and the wait is forgotten by the store). Throws only when the
  // store fails or the connection was aborted.
  virtual bool waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;

  // A hint: lease() with this `ttl` comes soon. A store that grants leases by a request of
  // their own (etcd) sends it now, so that it goes on alongside the requests before lease();
  // nothing else changes. Here, it does nothing.
  virtual void prepareLease(std::chrono::milliseconds ttl) {}

  // A hint: this connection's waits will come to `keys` (replacing an earlier hint). A store
  // whose waits each cost a watch and a read (etcd) follows them from its next wait on, so a
  // later wait for them needs neither. Nothing else changes; here, it does nothing.
  virtual void expect(const std::vector<std::string>& keys) {}

  // The values as they are now, without waiting; a missing key reads as empty.
  virtual std::vector<std::string> peek(const std::vector<std::string>& keys) = 0;

  // compareSet(key, "", value), then peek(keys): compareSet's answer, then the values. One
  // request where the store can (etcd: one transaction); here, two.
  virtual std::vector<std::string> createThenPeek(const std::string& key, const std::string& value,
                                                  const std::vector<std::string>& keys) {
    std::vector<std::string> out{compareSet(key, "", value)};
    for (auto& found : peek(keys)) out.push_back(std::move(found));
    return out;
  }

  // Deletes every key (releasing leased ones, as deleteKey does); missing keys are no error.
  // One request a key here; a store that can delete many at once does.
  virtual void deleteKeys(const std::vector<std::string>& keys) {
    for (const auto& key : keys) deleteKey(key);
  }

  // Safe from any thread, even while another is blocked in a call here: drops the connection
  // (firing its leases) so that call throws NetworkError at once.
  virtual void abort() = 0;

  // Whether this connection and its leases outlive a call that failed on the network, so the
  // same object is used again once the store answers: etcd's leases are the server's, renewed
  // by a keep-alive that goes on trying. A dlrund lease is its connection's and dies with it
  // (false, the default): the caller opens a new connection.
  virtual bool outlivesFailures() const { return false; }

  // The time this store's leases and waits run on: Clock::now() for a real store, the virtual
  // time of a simulated one. Callers measure their own deadlines on it too, so that a test on
  // virtual time drives every timeout of the protocol.
  virtual Clock::time_point now() { return Clock::now(); }

  // Store::wait in terms of waitFor(), with one message for every implementation.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 protected:
  // Throws Error unless a lease on `key` has a positive TTL.
  static void requirePositiveTtl(const std::string& key, std::chrono::milliseconds ttl);
};

}  // namespace dlrun
