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
// etcd_store_internal.h for what they share.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "rendezvous/etcd/etcd_client.h"
#include "store/leasing_store.h"

namespace dlrun::rendezvous::etcd {

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
  DLRUN_STORE_KEY_OPS_OVERRIDE;
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

  EtcdClient& client() { return *client_; }
  // The etcd key that holds store key `key`.
  std::string etcdKey(const std::string& key) const { return dataKey(key); }

 private:
  struct Record {  // a leased key's tripwires, as stored, and the record's revision
    std::vector<std::pair<std::string, std::string>> tripwires;
    int64_t revision = 0;
  };

  // A store key less `root`: what follows dataPrefix_ and recordPrefix_ in its etcd keys.
  std::string local(const std::string& key) const {
    return key.starts_with(options_.root) ? key.substr(options_.root.size()) : key;
  }
  std::string dataKey(const std::string& key) const { return dataPrefix_ + local(key); }
  // The record of the key whose local name is `name`.
  std::string recordKey(const std::string& name) const { return recordPrefix_ + name; }
  // Each etcd key's key, value and modRevision, or nothing when missing, in as few transactions
  // as kMaxTxnOps allows.
  std::vector<std::optional<KeyValue>> readKeys(const std::vector<std::string>& etcdKeys);
  std::vector<std::optional<std::string>> read(const std::vector<std::string>& keys);
  // With watchMutex_ held: fires the records whose key is gone, and reads `etcdKeys` (as
  // readKeys) in the same transaction.
  std::vector<std::optional<KeyValue>> fireLapsed(const std::vector<std::string>& etcdKeys);
  // The read a watch opened by expect() owes: its keys, and whether it scans for lapses.
  struct Owed {
    bool scan = false;
    std::vector<std::string> keys;
  };
  // The read after a watch began, appended to `request`: with `read.scan`, fireLapsed's names
  // of the tripwire records and of the keys; then `read.keys`. takeWatchRead takes its answers
  // from `response` at `offset` (with `scan`, orphans fired by fireOrphans) and returns the
  // keys'.
  void addWatchRead(etcdserverpb::TxnRequest& request, const Owed& read) const;
  std::vector<std::optional<KeyValue>> takeWatchRead(const etcdserverpb::TxnResponse& response,
                                                     int offset, const Owed& read);
  void fireOrphans(const etcdserverpb::TxnResponse& response, int offset);
  // With watchMutex_ held: a watch of the puts in `waited` (none: expect()'s) from now, of
  // deletions, and of the expected keys; returns those (the caller reads them after it).
  std::vector<std::string> watchFrom(
      const std::optional<std::pair<std::string, std::string>>& waited);
  // With watchMutex_ held: the read a watch opened by expect() still owes, made now.
  void settle();
  // With watchMutex_ held: what the read after the watch began found of expected keys.
  void noteSeen(const std::vector<std::string>& etcdKeys,
                const std::vector<std::optional<KeyValue>>& found);
  // Applies one batch of watch events: deleted leased keys fired, expected keys' puts seen.
  void follow(const std::vector<WatchEvent>& events);
  // Writes the tripwires of the key whose local name is `name` unless another store did (or the
  // record changed) first.
  void fire(const std::string& name, const Record& record,
            std::optional<std::chrono::milliseconds> timeout = {});
  void requireOpen() const;
  // compareSet's one try, on the etcd key `k`.
  std::string swapOnce(const std::string& k, const std::string& expected,
                       const std::string& desired);
  // Runs `write` until it succeeds, the fail-over budget is spent, or the store is aborted.
  template <typename Write>
  auto retrying(Write&& write);
  void revokeLeases();
  // This store's lease of `seconds`: the one it holds while alive, else a grant (taking the
  // one prepareLease sent) with its keep-alive.
  int64_t leaseId(int64_t seconds);
  // A lease's writes, appended to `request`'s success branch: the tripwire record, then the key.
  void addLeaseWrites(etcdserverpb::TxnRequest& request, const std::string& key,
                      const std::string& value, int64_t lease, const std::string& tripwires) const;

  const EtcdStoreOptions options_;
  const std::string dataPrefix_;
  const std::string recordPrefix_;
  const std::string markKey_;  // add()'s mark
  std::atomic<uint64_t> adds_{0};
  const std::shared_ptr<EtcdClient> client_;  // outlives the keep-alives below

  std::mutex grantMutex_;     // one lease grant at a time, outside mutex_ (a round trip)
  mutable std::mutex mutex_;  // leases_, owned_, aborted_, liveWatch_: never held over a call
  struct Granted {
    int64_t id = 0;
    std::unique_ptr<EtcdKeepAlive> keepAlive;
  };
  std::map<int64_t, Granted> leases_;  // by TTL in seconds
  // Grants sent ahead (prepareLease), by TTL in seconds: under mutex_, so that abort() can
  // cancel one that lease() waits for.
  struct Sent {
    std::unique_ptr<PendingLeaseGrant> grant;
    Clock::time_point at;
  };
  std::map<int64_t, Sent> pending_;
  std::map<std::string, Record> owned_;  // this store's leased keys, fired on abort()
  bool aborted_ = false;

  // One wait at a time: watch_ and waited_. Timed, so a wait queued behind another still
  // gives up on time.
  std::timed_mutex watchMutex_;
  std::unique_ptr<EtcdWatch> watch_;
  std::pair<std::string, std::string> waited_;  // the range of watch_ that takes puts
  std::vector<std::string> expected_;           // etcd keys (expect()), under mutex_
  std::set<std::string> followed_;              // the expected keys watch_ follows
  struct Seen {
    std::string value;
    int64_t revision = 0;
  };
  std::map<std::string, Seen> seen_;  // those of them read or put since watch_ began
  std::optional<Owed> owed_;
  // owed_, taken for a write to carry, when `watching` (watchMutex_, unlocked) could be taken
  // at once and the read fits in one transaction with the write; `watching` stays held.
  std::optional<Owed> takeOwed(std::unique_lock<std::timed_mutex>& watching);
  EtcdWatch* liveWatch_ = nullptr;  // watch_ while a wait may block on it (under mutex_)
};

}  // namespace dlrun::rendezvous::etcd
