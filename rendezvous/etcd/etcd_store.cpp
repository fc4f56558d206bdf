#include "rendezvous/etcd/etcd_store.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "common/clock.h"
#include "common/error.h"
#include "etcd/rpc.pb.h"
#include "rendezvous/etcd/etcd_compare.h"

namespace dlrun::rendezvous::etcd {
namespace detail {
namespace {

namespace pb = etcdserverpb;
using Tripwires = std::vector<std::pair<std::string, std::string>>;

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

// nullopt for a record some other program wrote: it is not fired.
std::optional<Tripwires> decodeTripwires(std::string_view text) {
  Tripwires out;
  std::vector<std::string> fields;
  while (!text.empty()) {
    size_t length = 0;
    const auto colon = text.find(':');
    if (colon == std::string_view::npos) return std::nullopt;
    const auto [end, error] = std::from_chars(text.data(), text.data() + colon, length);
    if (error != std::errc() || end != text.data() + colon || text.size() - colon - 1 < length)
      return std::nullopt;
    fields.emplace_back(text.substr(colon + 1, length));
    text.remove_prefix(colon + 1 + length);
  }
  if (fields.size() % 2 != 0) return std::nullopt;
  for (size_t i = 0; i < fields.size(); i += 2) out.emplace_back(fields[i], fields[i + 1]);
  return out;
}

// Names this store's add() mark: unique among the stores of every job on the cluster. The
// random part is drawn once a process (a random_device costs a system call or two each time,
// and an agent opens several stores), a counter tells the process's stores apart.
std::string uniqueId() {
  static const std::string process = [] {
    std::random_device random;
    std::ostringstream out;
    out << std::hex << random() << random() << '-' << ::getpid();
    return out.str();
  }();
  static std::atomic<uint64_t> stores{0};
  return process + '-' + std::to_string(stores++);
}

Clock::time_point deadlineAfter(std::chrono::milliseconds timeout) {
  const auto now = Clock::now();
  const auto room = std::chrono::duration_cast<std::chrono::milliseconds>(
      Clock::time_point::max() - now);
  return timeout >= room ? Clock::time_point::max() : now + timeout;
}

}  // namespace
}  // namespace detail

namespace pb = etcdserverpb;

EtcdStore::EtcdStore(EtcdStoreOptions options, std::shared_ptr<EtcdClient> client)
    : options_(std::move(options)),
      dataPrefix_(options_.prefix + "kv/"),
      recordPrefix_(options_.prefix + "tripwires/"),
      markKey_(options_.prefix + "marks/" + detail::uniqueId()),
      client_(client ? std::move(client) : std::make_shared<EtcdClient>(options_.client)) {}

EtcdStore::~EtcdStore() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
  }
  revokeLeases();
}

void EtcdStore::requireOpen() const {
  std::lock_guard lock(mutex_);
  if (aborted_) throw NetworkError("etcd " + client_->options().endpoints.front().text() +
                                   ": the store connection was aborted");
}

template <typename Write>
auto EtcdStore::retrying(Write&& write) {
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

void EtcdStore::abort() {
  {
    std::lock_guard lock(mutex_);
    if (aborted_) return;
    aborted_ = true;
    if (liveWatch_) liveWatch_->cancel();  // a blocked wait throws at once
    for (auto& [seconds, sent] : pending_) sent.grant->cancel();  // and a lease() awaiting one
  }
  revokeLeases();
}

// Revoking deletes the keys at once; then this store fires their tripwires itself, so no
// watcher is needed. Best effort: an unreachable etcd lets the leases lapse instead.
void EtcdStore::revokeLeases() {
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

// The first key of a range read: key, value and modRevision, or nothing when it found none.
std::optional<KeyValue> firstKey(const pb::RangeResponse& range) {
  if (range.kvs_size() == 0) return std::nullopt;
  const auto& kv = range.kvs(0);
  return KeyValue{.key = kv.key(), .value = kv.value(), .modRevision = kv.mod_revision()};
}

}  // namespace

std::vector<std::optional<KeyValue>> EtcdStore::readKeys(
    const std::vector<std::string>& etcdKeys) {
  requireOpen();
  std::vector<std::optional<KeyValue>> out;
  out.reserve(etcdKeys.size());
  for (size_t start = 0; start < etcdKeys.size(); start += kMaxTxnOps) {
    const size_t end = std::min(etcdKeys.size(), start + kMaxTxnOps);
    pb::TxnRequest request;  // no compare: `success` runs, all reads at one revision
    for (size_t i = start; i < end; ++i)
      request.add_success()->mutable_request_range()->set_key(etcdKeys[i]);
    const auto response = client_->txn(request);
    for (const auto& op : response.responses()) out.push_back(firstKey(op.response_range()));
  }
  return out;
}

std::vector<std::optional<std::string>> EtcdStore::read(const std::vector<std::string>& keys) {
  std::vector<std::string> etcdKeys;
  etcdKeys.reserve(keys.size());
  for (const auto& key : keys) etcdKeys.push_back(dataKey(key));
  std::vector<std::optional<std::string>> out;
  out.reserve(keys.size());
  for (auto& kv : readKeys(etcdKeys))
    out.emplace_back(kv ? std::optional(std::move(kv->value)) : std::nullopt);
  return out;
}

void EtcdStore::set(const std::string& key, const std::string& value) {
  retrying([&] { return client_->put(dataKey(key), value); });
}

std::string EtcdStore::get(const std::string& key) {
  wait({key}, options_.timeout);
  return read({key}).front().value_or("");  // deleted in between: empty, as dlrund's GET
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  // A read (see EtcdClient::add): safe to repeat, so it needs no mark.
  if (delta == 0) return retrying([&] { return client_->add(dataKey(key), 0); });
  const EtcdClient::AddMark mark{markKey_, std::to_string(++adds_)};
  bool sent = false;
  return retrying([&] {
    if (sent) {
      if (auto applied = client_->addApplied(mark)) return *applied;
    }
    sent = true;
    return client_->add(dataKey(key), delta, mark);
  });
}

std::string EtcdStore::compareSet(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  return retrying([&] { return swapOnce(dataKey(key), expected, desired); });
}

std::string EtcdStore::swapOnce(const std::string& k, const std::string& expected,
                                const std::string& desired) {
  if (!expected.empty()) {
    auto result = client_->putIfValue(k, expected, desired);
    if (result.swapped) return desired;
    return result.current ? result.current->value : expected;
  }
  // An empty `expected` matches a missing key and an empty value: etcd compares one of them
  // per transaction, so try missing first, then the empty value at the revision read.
  auto result = client_->putIfAbsent(k, desired);
  while (!result.swapped) {
    if (!result.current) {
      result = client_->putIfAbsent(k, desired);  // deleted meanwhile
    } else if (result.current->value.empty()) {
      result = client_->putIfRevision(k, result.current->modRevision, desired);
    } else {
      return result.current->value;
    }
  }
  return desired;
}

bool EtcdStore::deleteKey(const std::string& key) {
  // The record goes in the same transaction (and first), so watchers see a release, not a
  // lapse, and fire nothing.
  pb::TxnRequest request;
  request.add_success()->mutable_request_delete_range()->set_key(recordKey(local(key)));
  request.add_success()->mutable_request_delete_range()->set_key(dataKey(key));
  const auto response = retrying([&] { return client_->txn(request); });
  {
    std::lock_guard lock(mutex_);
    owned_.erase(key);
  }
  return response.responses_size() == 2 &&
         response.responses(1).response_delete_range().deleted() > 0;
}

void EtcdStore::deleteKeys(const std::vector<std::string>& keys) {
  // Two deletes a key (its record, as deleteKey); etcd refuses a transaction that names a key
  // twice.
  const std::set<std::string> unique(keys.begin(), keys.end());
  std::vector<std::string> ordered(unique.begin(), unique.end());
  for (size_t start = 0; start < ordered.size(); start += kMaxTxnOps / 2) {
    pb::TxnRequest request;
    for (size_t i = start; i < std::min(ordered.size(), start + kMaxTxnOps / 2); ++i) {
      request.add_success()->mutable_request_delete_range()->set_key(recordKey(local(ordered[i])));
      request.add_success()->mutable_request_delete_range()->set_key(dataKey(ordered[i]));
    }
    retrying([&] { return client_->txn(request); });
  }
  std::lock_guard lock(mutex_);
  for (const auto& key : ordered) owned_.erase(key);
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  const auto values = read(keys);
  return std::all_of(values.begin(), values.end(), [](const auto& v) { return v.has_value(); });
}

int64_t EtcdStore::numKeys() {
  requireOpen();
  return client_->count(dataPrefix_, EtcdClient::prefixEnd(dataPrefix_));
}

void EtcdStore::append(const std::string& key, const std::string& value) {
  const std::string k = dataKey(key);
  std::optional<std::string> sent;  // the whole value a try wrote, if one may have applied
  retrying([&] {
    SwapResult result;
    if (sent) {
      // A try that applied left the key starting with what it wrote (others append after).
      auto current = client_->get(k);
      if (current && current->value.starts_with(*sent)) return true;
      sent = (current ? current->value : std::string()) + value;
      result = client_->putIfRevision(k, current ? current->modRevision : 0, *sent);
    } else {
      sent = value;
      result = client_->putIfRevision(k, 0, value);  // missing, most likely for a new key
    }
    while (!result.swapped) {
      const int64_t revision = result.current ? result.current->modRevision : 0;
      sent = (result.current ? result.current->value : std::string()) + value;
      result = client_->putIfRevision(k, revision, *sent);
    }
    return true;
  });
}

std::vector<std::string> EtcdStore::multiGet(const std::vector<std::string>& keys) {
  wait(keys, options_.timeout);
  return peek(keys);
}

void EtcdStore::multiSet(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  requireSameLength(keys, values);
  requireOpen();
  // etcd refuses a transaction that writes a key twice: the last value of a key wins, as it
  // would writing them one by one.
  std::map<std::string, size_t> last;
  for (size_t i = 0; i < keys.size(); ++i) last[keys[i]] = i;
  std::vector<size_t> order;
  for (size_t i = 0; i < keys.size(); ++i)
    if (last[keys[i]] == i) order.push_back(i);
  for (size_t start = 0; start < order.size(); start += kMaxTxnOps) {
    pb::TxnRequest request;
    for (size_t j = start; j < std::min(order.size(), start + kMaxTxnOps); ++j) {
      auto* put = request.add_success()->mutable_request_put();
      put->set_key(dataKey(keys[order[j]]));
      put->set_value(values[order[j]]);
    }
    retrying([&] { return client_->txn(request); });
  }
}

std::vector<std::string> EtcdStore::peek(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  if (options_.fireLapses) {
    // Expected keys the watch saw: what it saw (see expect()). Not while a wait holds the watch.
    std::unique_lock watching(watchMutex_, std::try_to_lock);
    if (watching.owns_lock() && watch_ &&
        std::all_of(keys.begin(), keys.end(),
                    [&](const auto& key) { return followed_.contains(dataKey(key)); })) {
      requireOpen();
      settle();
      for (const auto& key : keys) {
        const auto it = seen_.find(dataKey(key));
        if (it == seen_.end()) break;
        out.push_back(it->second.value);
      }
      if (out.size() == keys.size()) return out;
      out.clear();
    }
  }
  for (auto& value : read(keys)) out.push_back(value.value_or(""));
  return out;
}

std::vector<std::string> EtcdStore::createThenPeek(const std::string& key,
                                                   const std::string& value,
                                                   const std::vector<std::string>& keys) {
  if (keys.size() + 1 > kMaxTxnOps) return LeasingStore::createThenPeek(key, value, keys);
  requireOpen();
  // Either branch reads the keys, after the put or the read of `key`, at one revision. Safe to
  // repeat after a fail-over: a create that applied reads back as this value.
  pb::TxnRequest request;
  *request.add_compare() = detail::missing(dataKey(key));
  auto* put = request.add_success()->mutable_request_put();
  put->set_key(dataKey(key));
  put->set_value(value);
  request.add_failure()->mutable_request_range()->set_key(dataKey(key));
  for (const auto& k : keys) {
    request.add_success()->mutable_request_range()->set_key(dataKey(k));
    request.add_failure()->mutable_request_range()->set_key(dataKey(k));
  }
  const auto response = retrying([&] { return client_->txn(request); });
  std::vector<std::string> out;
  if (response.succeeded()) {
    out.push_back(value);
  } else {
    const auto current = firstKey(response.responses(0).response_range());
    if (!current || current->value.empty())
      return LeasingStore::createThenPeek(key, value, keys);
    out.push_back(current->value);
  }
  for (int i = 1; i < response.responses_size(); ++i) {
    const auto found = firstKey(response.responses(i).response_range());
    out.push_back(found ? found->value : std::string());
  }
  return out;
}

namespace {

// etcd counts whole seconds and refuses less than its minimum (2 s by default).
int64_t leaseSeconds(std::chrono::milliseconds ttl) {
  return std::max<int64_t>(2, (ttl.count() + 999) / 1000);
}

}  // namespace

void EtcdStore::prepareLease(std::chrono::milliseconds ttl) {
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

int64_t EtcdStore::leaseId(int64_t seconds) {
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
  granted.keepAlive =
      client_->keepAlive(granted.id, std::chrono::milliseconds(seconds * 1000 / 3));
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

void EtcdStore::addLeaseWrites(pb::TxnRequest& request, const std::string& key,
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

std::optional<EtcdStore::Owed> EtcdStore::takeOwed(std::unique_lock<std::timed_mutex>& watching) {
  if (options_.fireLapses && watching.try_lock() && owed_ &&
      owed_->keys.size() + 4 <= kMaxTxnOps)
    return std::exchange(owed_, std::nullopt);
  return std::nullopt;
}

void EtcdStore::lease(const std::string& key, const std::string& value,
                      std::chrono::milliseconds ttl,
                      const std::vector<std::pair<std::string, std::string>>& tripwires) {
  requirePositiveTtl(key, ttl);
  requireOpen();
  const int64_t id = leaseId(leaseSeconds(ttl));
  detail::Tripwires unique = detail::uniqueTripwires(tripwires);
  pb::TxnRequest request;
  addLeaseWrites(request, key, value, id, detail::encodeTripwires(unique));
  // The read a watch opened by expect() owes rides along: one round trip less on the way into
  // a round (the watch began before this transaction, so what it misses, the read has).
  std::unique_lock watching(watchMutex_, std::defer_lock);
  std::optional<Owed> owed = takeOwed(watching);
  if (owed) addWatchRead(request, owed->scan, owed->keys);
  pb::TxnResponse response;
  try {
    response = retrying([&] { return client_->txn(request); });
  } catch (...) {
    if (owed) owed_ = std::move(owed);  // still owed
    throw;
  }
  if (owed) noteSeen(owed->keys, takeWatchRead(response, 2, owed->scan, owed->keys.size()));
  std::lock_guard lock(mutex_);
  owned_[key] = Record{std::move(unique), response.header().revision()};
}

int64_t EtcdStore::addThenLease(const std::string& counter, int64_t limit,
                                const std::function<std::string(int64_t)>& keyOf,
                                const std::string& value, std::chrono::milliseconds ttl,
                                const std::vector<std::pair<std::string, std::string>>& tripwires) {
  requirePositiveTtl(counter, ttl);
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
    extras.riding = [&](pb::TxnRequest& riding) {
      addWatchRead(riding, owed->scan, owed->keys);
    };
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
    noteSeen(owed->keys, takeWatchRead(*added.ridden, 1, owed->scan, owed->keys.size()));
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

void EtcdStore::fire(const std::string& name, const Record& record,
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

std::vector<std::optional<KeyValue>> EtcdStore::fireLapsed(
    const std::vector<std::string>& etcdKeys) {
  if (etcdKeys.size() + 2 > kMaxTxnOps) {  // too many for one transaction
    fireLapsed({});
    return readKeys(etcdKeys);
  }
  pb::TxnRequest request;
  addWatchRead(request, true, etcdKeys);
  return takeWatchRead(client_->txn(request), 0, true, etcdKeys.size());
}

void EtcdStore::addWatchRead(pb::TxnRequest& request, bool scan,
                             const std::vector<std::string>& etcdKeys) const {
  // A record whose key is gone outlived a lease that lapsed while no store watched: fire it now.
  // Keys-only reads of the records and of the data say which (every agent of a job reads them
  // as it starts to wait: names, not the records' texts, which only an orphan's firing needs).
  // Both, and the keys asked for, in one transaction: one round trip, one revision.
  const std::vector<const std::string*> scanned =
      scan ? std::vector{&recordPrefix_, &dataPrefix_} : std::vector<const std::string*>{};
  for (const std::string* prefix : scanned) {
    auto* range = request.add_success()->mutable_request_range();
    range->set_key(*prefix);
    range->set_range_end(EtcdClient::prefixEnd(*prefix));
    range->set_keys_only(true);
  }
  for (const auto& key : etcdKeys) request.add_success()->mutable_request_range()->set_key(key);
}

std::vector<std::optional<KeyValue>> EtcdStore::takeWatchRead(const pb::TxnResponse& response,
                                                              int offset, bool scan,
                                                              size_t keys) {
  if (scan) fireOrphans(response, offset);
  const int first = offset + (scan ? 2 : 0);
  std::vector<std::optional<KeyValue>> found;
  for (size_t i = 0; i < keys; ++i)
    found.push_back(firstKey(response.responses(first + static_cast<int>(i)).response_range()));
  return found;
}

void EtcdStore::fireOrphans(const pb::TxnResponse& response, int offset) {
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

std::vector<std::string> EtcdStore::watchFrom(
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

void EtcdStore::noteSeen(const std::vector<std::string>& etcdKeys,
                        const std::vector<std::optional<KeyValue>>& found) {
  for (size_t i = 0; i < etcdKeys.size(); ++i) {
    if (!found[i] || !followed_.contains(etcdKeys[i])) continue;
    auto& seen = seen_[etcdKeys[i]];
    if (found[i]->modRevision >= seen.revision) seen = Seen{found[i]->value, found[i]->modRevision};
  }
}

void EtcdStore::settle() {
  if (!owed_) return;
  const Owed owed = std::move(*owed_);
  owed_.reset();
  noteSeen(owed.keys, owed.scan ? fireLapsed(owed.keys) : readKeys(owed.keys));
}

void EtcdStore::follow(const std::vector<WatchEvent>& events) {
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

void EtcdStore::expect(const std::vector<std::string>& keys) {
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

bool EtcdStore::waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
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
      const auto events = watch_->next(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
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
