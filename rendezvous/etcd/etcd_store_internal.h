// What the files of EtcdStore share (etcd_store.cpp, etcd_store_leases.cpp,
// etcd_store_watch.cpp): the store's inside, EtcdStoreImpl, and the tripwire records' helpers;
// rendezvous/etcd only, not an interface.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_store.h"

namespace etcdserverpb {
class RangeResponse;
class TxnRequest;
class TxnResponse;
}  // namespace etcdserverpb

namespace dlrun::rendezvous::etcd {
namespace detail {

using Tripwires = std::vector<std::pair<std::string, std::string>>;

// A tripwire record's tripwires (its format: etcd_store_leases.cpp); nullopt for a record some
// other program wrote: it is not fired.
std::optional<Tripwires> decodeTripwires(std::string_view text);

// The first key of a range read: key, value and modRevision, or nothing when it found none.
std::optional<KeyValue> firstKey(const etcdserverpb::RangeResponse& range);

// EtcdStore's inside: its keys, leases and watch. EtcdStore hands it every call (etcd_store.cpp)
// but the argument checks and the waits of get() and multiGet(), which LeasingStore's protected
// and inherited functions make there.
class EtcdStoreImpl {
 public:
  static constexpr size_t kMaxTxnOps = EtcdStore::kMaxTxnOps;
  static constexpr std::chrono::milliseconds kReleaseTimeout = EtcdStore::kReleaseTimeout;

  EtcdStoreImpl(EtcdStoreOptions options, std::shared_ptr<EtcdClient> client);
  ~EtcdStoreImpl();  // revokes this store's leases, firing their tripwires
  EtcdStoreImpl(const EtcdStoreImpl&) = delete;
  EtcdStoreImpl& operator=(const EtcdStoreImpl&) = delete;

  // EtcdStore's calls (etcd_store.h says what each does).
  void set(const std::string& key, const std::string& value);
  int64_t add(const std::string& key, int64_t delta);
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired);
  bool deleteKey(const std::string& key);
  void deleteKeys(const std::vector<std::string>& keys);
  bool check(const std::vector<std::string>& keys);
  int64_t numKeys();
  void append(const std::string& key, const std::string& value);
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  void lease(const std::string& key, const std::string& value, std::chrono::milliseconds ttl,
             const std::vector<std::pair<std::string, std::string>>& tripwires);
  int64_t addThenLease(const std::string& counter, int64_t limit,
                       const std::function<std::string(int64_t)>& keyOf, const std::string& value,
                       std::chrono::milliseconds ttl,
                       const std::vector<std::pair<std::string, std::string>>& tripwires);
  void prepareLease(std::chrono::milliseconds ttl);
  bool waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  void expect(const std::vector<std::string>& keys);
  std::vector<std::string> peek(const std::vector<std::string>& keys);
  // Nothing when the one transaction cannot do it: LeasingStore's two calls then do.
  std::optional<std::vector<std::string>> createThenPeek(const std::string& key,
                                                         const std::string& value,
                                                         const std::vector<std::string>& keys);
  void abort();
  bool outlivesFailures() const;

  // Each key's value, or nothing when missing; no wait (get() waits first).
  std::vector<std::optional<std::string>> read(const std::vector<std::string>& keys);
  const EtcdStoreOptions& options() const { return options_; }
  EtcdClient& client() { return *client_; }
  std::string dataKey(const std::string& key) const { return dataPrefix_ + local(key); }

 private:
  struct Record {  // a leased key's tripwires, as stored, and the record's revision
    std::vector<std::pair<std::string, std::string>> tripwires;
    int64_t revision = 0;
  };

  // A store key less `root`: what follows dataPrefix_ and recordPrefix_ in its etcd keys.
  std::string local(const std::string& key) const {
    return key.starts_with(options_.root) ? key.substr(options_.root.size()) : key;
  }
  // The record of the key whose local name is `name`.
  std::string recordKey(const std::string& name) const { return recordPrefix_ + name; }
  // Each etcd key's key, value and modRevision, or nothing when missing, in as few transactions
  // as kMaxTxnOps allows.
  std::vector<std::optional<KeyValue>> readKeys(const std::vector<std::string>& etcdKeys);
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

// EtcdStoreImpl::retrying (above), here for every file of the store to use.
template <typename Write>
auto EtcdStoreImpl::retrying(Write&& write) {
  const auto start = Clock::now();
  while (true) {
    requireOpen();  // an abort() ends the retries, named as such
    try {
      return write();
    } catch (const NetworkError&) {
      if (Clock::now() - start >= options_.client.connectTimeout) throw;
    } catch (const TimeoutError&) {
      if (Clock::now() - start >= options_.client.connectTimeout) throw;
    }
    // Members without a leader refuse at once while an election runs: pace the next try.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace detail
}  // namespace dlrun::rendezvous::etcd
