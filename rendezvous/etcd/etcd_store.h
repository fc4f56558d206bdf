// The LeasingStore of leasing_store.h on etcd, so that ElasticRendezvous runs its rounds on an
// etcd cluster through ElasticOptions::connect. Keys live under `prefix` + "kv/", less `root`
// (the job's own key root, which `prefix` already names: one prefix, not two); values are etcd
// values. One EtcdStore is one "connection": its leases live and die together.
//
// Leases: the first lease() grants one etcd lease (TTL rounded up to whole seconds, at least
// etcd's minimum of 2 s) and keeps it alive on one LeaseKeepAlive stream (EtcdKeepAlive's
// thread). A killed process stops renewing, so its keys lapse after the TTL; abort() and the
// destructor revoke the lease, so its keys go at once, as a closing dlrund connection does.
//
// Tripwires, emulated: etcd only deletes a leased key. lease() writes, in the same transaction,
// a record of the key's tripwires under `prefix` + "tripwires/" (not leased). Every EtcdStore
// that waits (with fireLapses, the default) watches the whole prefix; when it sees a leased key
// deleted while its record still stands, it writes the tripwires in one transaction guarded by
// the record's revision, each one only if its key is absent (create_revision == 0), and deletes
// the record: the first writer wins, as in dlrund, and the others' transactions change
// nothing. deleteKey() deletes the record and the key together, so a release never fires. The
// store that aborts fires its own tripwires too, so no watcher is needed for that case, and a
// store that starts to wait fires the records whose key is already gone (read with the waited
// keys once its first watch began). Limits of the emulation: a lapse fires only once some
// store of the job waits (the rendezvous always has one waiting), and a key leased again by its
// holder before anyone fired loses the old firing.
//
// Writes survive a fail-over: one that fails on the way (its member died, an election) is made
// again, on the next endpoint the client picks, for up to the client's connectTimeout. Each is
// safe to repeat: set, multiSet, deletes and lease writes are idempotent; compareSet reads
// again and decides (a swap that applied reads back as its own value); add writes a mark in
// its transaction that says whether it applied (one key per store, under `prefix` + "marks/",
// deleted with the store); append looks for its own text first.
//
// Waits: waitFor() opens a watch of the waited keys' range (unless the open one has it), reads
// the keys, then follows the watch until each was read or put. The watch has two ranges on one
// stream: the puts of the range that holds the waited keys (from the watch's start, with a read
// after it), and with fireLapses the deletions under the whole prefix (for the tripwires). A
// store thus hears of what it waits for and of deletions, not of every write of the job: with N
// agents waiting, a round costs etcd O(N) events, not O(N^2). A wait for another range opens the
// watch again, its deletions from where the last one left them, so none is missed between waits; it
// also follows the keys expect() named (expect() opens it at once; their read rides on the next
// lease's transaction), whose waits and, once seen, peeks then cost nothing. A
// deleted key whose record was not deleted in the same transaction (a release deletes both) is
// looked up: its record still standing says the lease lapsed.
//
// Threads: every method is thread-safe; waits on one store run one at a time (one watch per
// store), and abort() may come from any thread, cutting a blocked wait at once.
//
// Code: etcd_store.cpp (the store's life, the key-value operations), etcd_store_leases.cpp
// (leases, tripwire records and their firing), etcd_store_watch.cpp (waits and the watch), and
// etcd_store_internal.h for what they share: the store's inside, EtcdStoreImpl.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/etcd/etcd_client.h"
#include "store/leasing_store.h"

namespace dlrun::rendezvous::etcd {

namespace detail {
class EtcdStoreImpl;
}

struct EtcdStoreOptions {
  EtcdClientOptions client;
  // Every key of this store lives under it; the stores of one job share it.
  std::string prefix = "dlrun/store/";
  // A key that starts with it is stored without it (the rendezvous's "dlrun/ID/", when
  // `prefix` is etcd_prefix + ID + "/"); others are stored whole.
  std::string root;
  // How long get() and multiGet() wait for keys.
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  // Whether this store's waits also watch for lapsed leases and fire their tripwires (see
  // above). The rendezvous's stores do; one that only waits for keys others write (the control
  // plane's commands) need not hear of every deletion of the job, nor pay a read for each.
  bool fireLapses = true;
};

class EtcdStore : public LeasingStore {
 public:
  // Larger multiSet() and peek() calls are cut into pieces of this many operations.
  static constexpr size_t kMaxTxnOps = EtcdClient::kMaxTxnOps;
  // The deadline of each call abort() and the destructor make (revoke, fire): they must not
  // hold up an agent that is stopping when etcd does not answer; the leases then lapse.
  static constexpr std::chrono::milliseconds kReleaseTimeout{1'000};

  // Connects at once (EtcdClient's errors), or shares `client`: the stores of one process then
  // share one channel to etcd, not a connection each (options.client is then not used to
  // connect). Leases, waits and abort() stay this store's own.
  explicit EtcdStore(EtcdStoreOptions options, std::shared_ptr<EtcdClient> client = nullptr);
  ~EtcdStore() override;  // revokes this store's leases, firing their tripwires
  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  // compareSet() has PyTorch's semantics, as dlrund's: a missing key is created only when
  // `expected` is empty; it returns the value stored afterwards (`expected` when the key is
  // missing and not created).
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t numKeys() override;
  void append(const std::string& key, const std::string& value) override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;
  void deleteKeys(const std::vector<std::string>& keys) override;  // transactions of many

  void lease(const std::string& key, const std::string& value, std::chrono::milliseconds ttl,
             const std::vector<std::pair<std::string, std::string>>& tripwires) override;
  // One transaction: the add's, whose branch for each value it tries also writes that value's
  // lease (and which carries the read expect() owes, as lease() does).
  int64_t addThenLease(const std::string& counter, int64_t limit,
                       const std::function<std::string(int64_t)>& keyOf, const std::string& value,
                       std::chrono::milliseconds ttl,
                       const std::vector<std::pair<std::string, std::string>>& tripwires) override;
  // Sends the grant of `ttl`'s lease now, unless this store holds one or one is on its way;
  // lease() takes its answer (or grants again, if it failed, or if it was sent more than a
  // tenth of the TTL before: the keep-alive's first renewal, an interval after lease(), must
  // come well within the TTL, which runs from the grant).
  void prepareLease(std::chrono::milliseconds ttl) override;
  bool waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  // With fireLapses: opens a watch of `keys` now (a range each, and the deletions), unless the
  // open one follows them, and reads them once after it began: with this store's next lease()
  // (in its transaction), else at the next wait or peek. Waits for them then cost no request,
  // nor do peeks of them once each was seen: such a wait ends once the key was there at the
  // read or put since, such a peek answers what the watch saw. For keys written once and then
  // left alone while they matter (a round's close, end, assignments, roster), as the
  // rendezvous's are. Throws as a wait would when the watch cannot open.
  void expect(const std::vector<std::string>& keys) override;
  std::vector<std::string> peek(const std::vector<std::string>& keys) override;
  // One transaction, when it fits in kMaxTxnOps and `key` is missing or set (a key that
  // exists with an empty value, which compareSet matches too, takes the two calls).
  std::vector<std::string> createThenPeek(const std::string& key, const std::string& value,
                                          const std::vector<std::string>& keys) override;
  // Every later call throws NetworkError; a blocked wait throws at once.
  void abort() override;
  // Until abort(): calls that failed while etcd was away are made again once it answers, and
  // the leases' keep-alives go on trying (EtcdClientOptions::outageTimeout).
  bool outlivesFailures() const override;

  EtcdClient& client();
  // The etcd key that holds store key `key`.
  std::string etcdKey(const std::string& key) const;

 private:
  std::unique_ptr<detail::EtcdStoreImpl> impl_;  // etcd_store_internal.h
};

}  // namespace dlrun::rendezvous::etcd
