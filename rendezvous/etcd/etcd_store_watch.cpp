// EtcdStore (etcd_store.h): waits, expect() and the one watch a store follows (the waited keys'
// puts, the expected keys, the deletions that fire tripwires).
#include "rendezvous/etcd/etcd_store.h"

#include <algorithm>
#include <optional>
#include <set>

#include "common/clock.h"
#include "common/error.h"
#include "etcd/rpc.pb.h"
#include "rendezvous/etcd/etcd_store_internal.h"
#include "rendezvous/etcd/etcd_watch.h"

namespace dlrun::rendezvous::etcd {
namespace detail {
namespace {

Clock::time_point deadlineAfter(std::chrono::milliseconds timeout) {
  const auto now = Clock::now();
  const auto room =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + timeout;
}

}  // namespace
}  // namespace detail

namespace pb = etcdserverpb;
using detail::EtcdStoreImpl;

std::optional<EtcdStoreImpl::Owed> EtcdStoreImpl::takeOwed(
    std::unique_lock<std::timed_mutex>& watching) {
  if (options_.fireLapses && watching.try_lock() && owed_ && owed_->keys.size() + 4 <= kMaxTxnOps)
    return std::exchange(owed_, std::nullopt);
  return std::nullopt;
}

void EtcdStoreImpl::addWatchRead(pb::TxnRequest& request, const Owed& read) const {
  // A record whose key is gone outlived a lease that lapsed while no store watched: fire it now.
  // Keys-only reads of the records and of the data say which (every agent of a job reads them
  // as it starts to wait: names, not the records' texts, which only an orphan's firing needs).
  // Both, and the keys asked for, in one transaction: one round trip, one revision.
  const std::vector<const std::string*> scanned =
      read.scan ? std::vector{&recordPrefix_, &dataPrefix_} : std::vector<const std::string*>{};
  for (const std::string* prefix : scanned) {
    auto* range = request.add_success()->mutable_request_range();
    range->set_key(*prefix);
    range->set_range_end(EtcdClient::prefixEnd(*prefix));
    range->set_keys_only(true);
  }
  for (const auto& key : read.keys) request.add_success()->mutable_request_range()->set_key(key);
}

std::vector<std::optional<KeyValue>> EtcdStoreImpl::takeWatchRead(const pb::TxnResponse& response,
                                                                  int offset, const Owed& read) {
  if (read.scan) fireOrphans(response, offset);
  const int first = offset + (read.scan ? 2 : 0);
  std::vector<std::optional<KeyValue>> found;
  for (size_t i = 0; i < read.keys.size(); ++i)
    found.push_back(
        detail::firstKey(response.responses(first + static_cast<int>(i)).response_range()));
  return found;
}

std::vector<std::string> EtcdStoreImpl::watchFrom(
    const std::optional<std::pair<std::string, std::string>>& waited) {
  // The lapse range goes on where the last watch left it, so no deletion is missed across
  // waits; the first starts now, and the caller's read after it scans the records
  // (fireLapsed) for what lapsed before. The waited range starts now, and the caller reads
  // after it: a range that starts in the past is a lagging watcher to etcd, which hands it
  // every event, even the newest, only in its catch-up loop (every 100 ms).
  std::vector<WatchRange> ranges;
  std::vector<std::string> expected;
  if (options_.fireLapses) {
    ranges.push_back({.key = options_.prefix,
                      .rangeEnd = EtcdClient::prefixEnd(options_.prefix),
                      .only = WatchRange::Only::Deletes,
                      .startRevision = watch_ ? watch_->lastRevision(0) + 1 : 0});
    std::lock_guard lock(mutex_);
    expected = expected_;
  }
  if (waited) {
    ranges.push_back(
        {.key = waited->first, .rangeEnd = waited->second, .only = WatchRange::Only::Puts});
  }
  for (const auto& key : expected) {
    if (!waited || key < waited->first || key >= waited->second)
      ranges.push_back({.key = key, .only = WatchRange::Only::Puts});
  }
  {
    std::lock_guard lock(mutex_);
    liveWatch_ = nullptr;
  }
  watch_.reset();
  followed_.clear();
  seen_.clear();
  owed_.reset();
  watch_ = client_->watch(std::move(ranges));
  waited_ = waited.value_or(std::pair<std::string, std::string>{});
  followed_.insert(expected.begin(), expected.end());
  std::lock_guard lock(mutex_);
  liveWatch_ = watch_.get();
  if (aborted_) watch_->cancel();
  return expected;
}

void EtcdStoreImpl::noteSeen(const std::vector<std::string>& etcdKeys,
                             const std::vector<std::optional<KeyValue>>& found) {
  for (size_t i = 0; i < etcdKeys.size(); ++i) {
    if (!found[i] || !followed_.contains(etcdKeys[i])) continue;
    auto& seen = seen_[etcdKeys[i]];
    if (found[i]->modRevision >= seen.revision) seen = Seen{found[i]->value, found[i]->modRevision};
  }
}

void EtcdStoreImpl::settle() {
  if (!owed_) return;
  const Owed owed = std::move(*owed_);
  owed_.reset();
  noteSeen(owed.keys, owed.scan ? fireLapsed(owed.keys) : readKeys(owed.keys));
}

void EtcdStoreImpl::follow(const std::vector<WatchEvent>& events) {
  // Events of one range come in revision order, of different ranges in none: the newest wins.
  for (const auto& e : events) {
    if (!followed_.contains(e.kv.key)) continue;
    const auto it = seen_.find(e.kv.key);
    if (it != seen_.end() && e.kv.modRevision <= it->second.revision) continue;
    if (e.type == WatchEvent::Type::Put) {
      seen_[e.kv.key] = Seen{e.kv.value, e.kv.modRevision};
    } else if (it != seen_.end()) {
      seen_.erase(it);
    }
  }
  // A deleted key whose record was not deleted in the same revision (a release deletes both in
  // one transaction) may be a lapsed lease: its record, read now, says so; one read for all.
  std::vector<std::string> lapsed;
  for (size_t i = 0; i < events.size();) {
    size_t j = i;
    std::set<std::string> released;
    for (; j < events.size() && events[j].kv.modRevision == events[i].kv.modRevision; ++j) {
      const auto& kv = events[j].kv;
      if (events[j].type == WatchEvent::Type::Delete && kv.key.starts_with(recordPrefix_))
        released.insert(kv.key.substr(recordPrefix_.size()));
    }
    for (size_t e = i; e < j; ++e) {
      const auto& kv = events[e].kv;
      if (events[e].type != WatchEvent::Type::Delete || !kv.key.starts_with(dataPrefix_)) continue;
      std::string key = kv.key.substr(dataPrefix_.size());
      if (!released.contains(key)) lapsed.push_back(std::move(key));
    }
    i = j;
  }
  if (lapsed.empty()) return;
  std::vector<std::string> keys;
  for (const auto& key : lapsed) keys.push_back(recordKey(key));
  const auto records = readKeys(keys);
  for (size_t i = 0; i < lapsed.size(); ++i) {
    if (!records[i]) continue;  // no lease, or released since
    if (auto tripwires = detail::decodeTripwires(records[i]->value))
      fire(lapsed[i], Record{std::move(*tripwires), records[i]->modRevision});
  }
}

void EtcdStoreImpl::expect(const std::vector<std::string>& keys) {
  std::vector<std::string> etcdKeys;
  for (const auto& key : keys) etcdKeys.push_back(dataKey(key));
  {
    std::lock_guard lock(mutex_);
    expected_ = etcdKeys;
  }
  if (!options_.fireLapses) return;
  // A wait holding the watch: the next watch takes them.
  std::unique_lock watching(watchMutex_, std::try_to_lock);
  if (!watching.owns_lock()) return;
  requireOpen();
  if (watch_ && std::all_of(etcdKeys.begin(), etcdKeys.end(),
                            [&](const auto& k) { return followed_.contains(k); }))
    return;
  settle();  // a scan the old watch owed is made before its deletions stop being followed
  const bool scan = !watch_;
  watchFrom(std::nullopt);
  owed_ = Owed{scan, std::move(etcdKeys)};
}

bool EtcdStoreImpl::waitFor(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  requireOpen();
  const auto deadline = detail::deadlineAfter(timeout);
  std::unique_lock lock(watchMutex_, std::defer_lock);
  if (deadline == Clock::time_point::max()) {
    lock.lock();
  } else if (!lock.try_lock_until(deadline)) {
    return check(keys);  // another wait held the watch all along
  }
  try {
    std::set<std::string> waited;
    for (const auto& key : keys) waited.insert(dataKey(key));
    // One range holds every waited key: the keys of a round share theirs.
    const std::pair<std::string, std::string> range{*waited.begin(),
                                                    *waited.rbegin() + std::string(1, '\0')};
    std::vector<std::string> missing(waited.begin(), waited.end());
    // Keeps the keys still missing after a read of them (found[i]: missing[i]).
    const auto keepMissing = [&](const std::vector<std::optional<KeyValue>>& found) {
      std::vector<std::string> still;
      for (size_t i = 0; i < missing.size(); ++i)
        if (!found[i]) still.push_back(std::move(missing[i]));
      missing = std::move(still);
    };
    settle();
    const bool followed = watch_ && std::all_of(missing.begin(), missing.end(), [&](const auto& k) {
                            return followed_.contains(k);
                          });
    if (followed) {
      // Expected keys: the watch has followed each since a read of it.
      std::erase_if(missing, [&](const std::string& k) { return seen_.contains(k); });
    } else if (!watch_ || waited_ != range) {
      // The watch first, then one read: what came before the watch began (and, before the
      // first, what lapsed). A wait mostly begins before its keys are written (a round's
      // close, its end), so a read before the watch would mostly find nothing.
      const bool firstLapseWatch = !watch_ && options_.fireLapses;
      std::vector<std::string> read = missing;
      for (auto& key : watchFrom(range)) read.push_back(std::move(key));
      const auto found = firstLapseWatch ? fireLapsed(read) : readKeys(read);
      noteSeen(read, found);
      keepMissing(found);
    } else {
      keepMissing(readKeys(missing));
    }
    // From here the watch sees every put of the range (a fail-over resumes it where it left
    // off): a waited key's put is its existence, so the wait ends without another read.
    while (!missing.empty()) {
      const auto now = Clock::now();
      if (now >= deadline) return false;
      const auto events =
          watch_->next(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
      follow(events);
      for (const auto& e : events)
        if (e.type == WatchEvent::Type::Put) std::erase(missing, e.kv.key);
    }
    return true;
  } catch (const Error&) {
    requireOpen();  // an abort() is named as such
    throw;
  }
}

}  // namespace dlrun::rendezvous::etcd
