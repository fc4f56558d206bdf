// EtcdStore (etcd_store.h): its leases (granted ahead, kept alive, revoked) and the emulated
// tripwires (their records, written with the leased key, and their firing).
#include "rendezvous/etcd/etcd_store.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "common/clock.h"
#include "common/error.h"
#include "common/text.h"
#include "etcd/rpc.pb.h"
#include "rendezvous/etcd/etcd_compare.h"
#include "rendezvous/etcd/etcd_keep_alive.h"
#include "rendezvous/etcd/etcd_store_internal.h"

namespace dlrun::rendezvous::etcd {
namespace detail {
namespace {

// A tripwire record: "<length>:<bytes>" for each key, then its value. Binary-safe and read
// only by EtcdStore.
std::string encodeTripwires(const Tripwires& tripwires) {
  std::string out;
  for (const auto& [key, value] : tripwires) {
    for (const std::string* text : {&key, &value}) {
      out += std::to_string(text->size());
      out += ':';
      out += *text;
    }
  }
  return out;
}

// Tripwires on one key once (etcd refuses a transaction that writes a key twice); the first
// one stands, as when they are set one after another only where absent.
Tripwires uniqueTripwires(const Tripwires& tripwires) {
  Tripwires unique;
  std::set<std::string> seen;
  for (const auto& tripwire : tripwires)
    if (seen.insert(tripwire.first).second) unique.push_back(tripwire);
  return unique;
}

}  // namespace

// nullopt for a record some other program wrote: it is not fired.
std::optional<Tripwires> decodeTripwires(std::string_view text) {
  Tripwires out;
  std::vector<std::string> fields;
  while (!text.empty()) {
    const auto colon = text.find(':');
    if (colon == std::string_view::npos) return std::nullopt;
    const auto length = parseInteger<size_t>(text.substr(0, colon));
    if (!length || text.size() - colon - 1 < *length) return std::nullopt;
    fields.emplace_back(text.substr(colon + 1, *length));
    text.remove_prefix(colon + 1 + *length);
  }
  if (fields.size() % 2 != 0) return std::nullopt;
  for (size_t i = 0; i < fields.size(); i += 2) out.emplace_back(fields[i], fields[i + 1]);
  return out;
}

}  // namespace detail

namespace pb = etcdserverpb;
using detail::EtcdStoreImpl;

// Revoking deletes the keys at once; then this store fires their tripwires itself, so no
// watcher is needed. Best effort: an unreachable etcd lets the leases lapse instead.
void EtcdStoreImpl::revokeLeases() {
  std::map<int64_t, Granted> leases;
  std::map<std::string, Record> owned;
  {
    std::lock_guard lock(mutex_);
    leases.swap(leases_);
    owned.swap(owned_);
  }
  bool reachable = true;
  for (auto& [ttl, granted] : leases) {
    granted.keepAlive->stop();
    if (!reachable) continue;
    try {
      client_->leaseRevoke(granted.id, kReleaseTimeout);
    } catch (const NetworkError&) {
      reachable = false;  // etcd is gone for now: each further call would wait out its deadline
    } catch (const TimeoutError&) {
      reachable = false;
    } catch (const Error&) {
    }
  }
  for (const auto& [key, record] : owned) {
    if (!reachable) break;
    try {
      fire(local(key), record, kReleaseTimeout);
    } catch (const Error&) {
    }
  }
  if (reachable && adds_.exchange(0) > 0) {  // once: abort() and the destructor both come here
    try {
      pb::TxnRequest request;
      request.add_success()->mutable_request_delete_range()->set_key(markKey_);
      client_->txn(request, kReleaseTimeout);
    } catch (const Error&) {
    }
  }
}

namespace {

// etcd counts whole seconds and refuses less than its minimum (2 s by default).
int64_t leaseSeconds(std::chrono::milliseconds ttl) {
  return std::max<int64_t>(2, (ttl.count() + 999) / 1000);
}

}  // namespace

void EtcdStoreImpl::prepareLease(std::chrono::milliseconds ttl) {
  if (ttl.count() <= 0) return;  // lease() says why
  const int64_t seconds = leaseSeconds(ttl);
  std::lock_guard granting(grantMutex_);
  {
    std::lock_guard lock(mutex_);
    if (aborted_ || leases_.contains(seconds) || pending_.contains(seconds)) return;
  }
  // Sent without mutex_ (picking an endpoint may take a while); an abort() meanwhile drops it.
  Sent sent;
  try {
    sent = Sent{client_->startLeaseGrant(std::chrono::seconds(seconds)), Clock::now()};
  } catch (const Error&) {
    return;  // no endpoint now: lease() grants (or fails) with the client's retries and messages
  }
  std::lock_guard lock(mutex_);
  if (!aborted_) pending_.emplace(seconds, std::move(sent));
}

int64_t EtcdStoreImpl::leaseId(int64_t seconds) {
  std::lock_guard granting(grantMutex_);
  {
    std::lock_guard lock(mutex_);
    auto it = leases_.find(seconds);
    if (it != leases_.end() && it->second.keepAlive->alive()) return it->second.id;
    // Lapsed or lost: its keys are gone, as on a dropped connection.
    if (it != leases_.end()) leases_.erase(it);
  }
  Granted granted;
  // A grant sent ahead is taken while fresh (a failed one is made again); it stays in pending_
  // while its answer is awaited, so that abort() can cancel it. A stale one is cancelled and
  // left to lapse.
  PendingLeaseGrant* sent = nullptr;
  std::unique_ptr<PendingLeaseGrant> stale;  // cancelled as it goes, after the lock
  {
    std::lock_guard lock(mutex_);
    if (auto it = pending_.find(seconds); it != pending_.end()) {
      if (Clock::now() - it->second.at < std::chrono::milliseconds(seconds * 100)) {
        sent = it->second.grant.get();
      } else {
        stale = std::move(it->second.grant);
        pending_.erase(it);
      }
    }
  }
  stale.reset();
  if (sent) {
    const auto taken = sent->take();
    std::lock_guard lock(mutex_);
    pending_.erase(seconds);
    granted.id = taken.value_or(0);
  }
  requireOpen();
  if (granted.id == 0) granted.id = client_->leaseGrant(std::chrono::seconds(seconds));
  // A third of the TTL: two renewals may go missing before the lease lapses.
  granted.keepAlive = client_->keepAlive(granted.id, std::chrono::milliseconds(seconds * 1000 / 3));
  const int64_t id = granted.id;
  std::unique_lock lock(mutex_);
  if (aborted_) {  // abort() came during the grant: this lease is not kept either
    lock.unlock();
    granted.keepAlive->stop();
    try {
      client_->leaseRevoke(granted.id, kReleaseTimeout);
    } catch (const Error&) {
    }
    requireOpen();  // throws: aborted
  }
  leases_.emplace(seconds, std::move(granted));
  return id;
}

void EtcdStoreImpl::addLeaseWrites(pb::TxnRequest& request, const std::string& key,
                                   const std::string& value, int64_t lease,
                                   const std::string& tripwires) const {
  auto* record = request.add_success()->mutable_request_put();
  record->set_key(recordKey(local(key)));
  record->set_value(tripwires);
  auto* put = request.add_success()->mutable_request_put();
  put->set_key(dataKey(key));
  put->set_value(value);
  put->set_lease(lease);
}

void EtcdStoreImpl::lease(const std::string& key, const std::string& value,
                          std::chrono::milliseconds ttl,
                          const std::vector<std::pair<std::string, std::string>>& tripwires) {
  requireOpen();
  const int64_t id = leaseId(leaseSeconds(ttl));
  detail::Tripwires unique = detail::uniqueTripwires(tripwires);
  pb::TxnRequest request;
  addLeaseWrites(request, key, value, id, detail::encodeTripwires(unique));
  // The read a watch opened by expect() owes rides along: one round trip less on the way into
  // a round (the watch began before this transaction, so what it misses, the read has).
  std::unique_lock watching(watchMutex_, std::defer_lock);
  std::optional<Owed> owed = takeOwed(watching);
  if (owed) addWatchRead(request, *owed);
  pb::TxnResponse response;
  try {
    response = retrying([&] { return client_->txn(request); });
  } catch (...) {
    if (owed) owed_ = std::move(owed);  // still owed
    throw;
  }
  if (owed) noteSeen(owed->keys, takeWatchRead(response, 2, *owed));
  std::lock_guard lock(mutex_);
  owned_[key] = Record{std::move(unique), response.header().revision()};
}

int64_t EtcdStoreImpl::addThenLease(
    const std::string& counter, int64_t limit, const std::function<std::string(int64_t)>& keyOf,
    const std::string& value, std::chrono::milliseconds ttl,
    const std::vector<std::pair<std::string, std::string>>& tripwires) {
  requireOpen();
  const int64_t id = leaseId(leaseSeconds(ttl));
  detail::Tripwires unique = detail::uniqueTripwires(tripwires);
  const std::string record = detail::encodeTripwires(unique);
  // The add's transaction writes the lease's keys in the branch of each value it tries (etcd
  // has no write whose key is computed), and carries the read a watch opened by expect() owes,
  // as lease() does: a join and its record cost one round trip and one log entry.
  std::unique_lock watching(watchMutex_, std::defer_lock);
  std::optional<Owed> owed = takeOwed(watching);
  EtcdClient::AddExtras extras{.branch = [&](int64_t n, pb::TxnRequest& branch) {
    if (n <= limit) addLeaseWrites(branch, keyOf(n), value, id, record);
  }};
  if (owed) {
    extras.riding = [&](pb::TxnRequest& riding) { addWatchRead(riding, *owed); };
  }
  // Marked, as add(): a try that failed half-way may have applied, and a retry reads so.
  const EtcdClient::AddMark mark{markKey_, std::to_string(++adds_)};
  bool sent = false;
  EtcdClient::AddResult added;
  try {
    added = retrying([&] {
      if (sent) {
        if (auto applied = client_->addApplied(mark)) return EtcdClient::AddResult{*applied};
      }
      sent = true;
      return client_->add(dataKey(counter), 1, mark, extras);
    });
  } catch (...) {
    if (owed) owed_ = std::move(owed);
    throw;
  }
  if (owed && added.ridden) {
    noteSeen(owed->keys, takeWatchRead(*added.ridden, 1, *owed));
  } else if (owed) {
    owed_ = std::move(owed);  // the try that read failed; the one that applied did not read
  }
  if (added.value > limit) return added.value;
  if (added.revision == 0) {
    // Applied by a try whose answer was lost, at a revision unknown here: leased again (the
    // same writes), which says it. lease() takes the watch's lock itself.
    if (watching.owns_lock()) watching.unlock();
    lease(keyOf(added.value), value, ttl, tripwires);
    return added.value;
  }
  std::lock_guard lock(mutex_);
  owned_[keyOf(added.value)] = Record{std::move(unique), added.revision};
  return added.value;
}

void EtcdStoreImpl::fire(const std::string& name, const Record& record,
                         std::optional<std::chrono::milliseconds> timeout) {
  // Only while the record is the one seen: a release, another store's firing or a new lease
  // changed it, and then this transaction changes nothing.
  pb::TxnRequest request;
  auto guard = detail::compare(recordKey(name), pb::Compare::MOD);
  guard.set_mod_revision(record.revision);
  *request.add_compare() = guard;
  request.add_success()->mutable_request_delete_range()->set_key(recordKey(name));
  for (const auto& [tripKey, tripValue] : record.tripwires) {
    auto* nested = request.add_success()->mutable_request_txn();
    *nested->add_compare() = detail::missing(dataKey(tripKey));
    auto* put = nested->add_success()->mutable_request_put();
    put->set_key(dataKey(tripKey));
    put->set_value(tripValue);
  }
  client_->txn(request, timeout);
}

std::vector<std::optional<KeyValue>> EtcdStoreImpl::fireLapsed(
    const std::vector<std::string>& etcdKeys) {
  if (etcdKeys.size() + 2 > kMaxTxnOps) {  // too many for one transaction
    fireLapsed({});
    return readKeys(etcdKeys);
  }
  pb::TxnRequest request;
  const Owed read{.scan = true, .keys = etcdKeys};
  addWatchRead(request, read);
  return takeWatchRead(client_->txn(request), 0, read);
}

void EtcdStoreImpl::fireOrphans(const pb::TxnResponse& response, int offset) {
  std::set<std::string> present;
  for (const auto& kv : response.responses(offset + 1).response_range().kvs())
    present.insert(kv.key());
  std::vector<std::string> orphans;
  std::vector<int64_t> seen;  // their revisions at the scan
  for (const auto& kv : response.responses(offset).response_range().kvs()) {
    if (present.contains(dataPrefix_ + kv.key().substr(recordPrefix_.size()))) continue;
    orphans.push_back(kv.key());
    seen.push_back(kv.mod_revision());
  }
  if (!orphans.empty()) {
    const auto records = readKeys(orphans);
    for (size_t i = 0; i < orphans.size(); ++i) {
      // Released, fired or leased again since the scan: not an orphan now.
      if (!records[i] || records[i]->modRevision != seen[i]) continue;
      if (auto tripwires = detail::decodeTripwires(records[i]->value))
        fire(orphans[i].substr(recordPrefix_.size()),
             Record{std::move(*tripwires), records[i]->modRevision});
    }
  }
}

}  // namespace dlrun::rendezvous::etcd
