// EtcdStore (etcd_store.h), its core: the store's life (construction, abort()) and the key-value
// operations. Leases and tripwires: etcd_store_leases.cpp; waits and the watch:
// etcd_store_watch.cpp.
#include "rendezvous/etcd/etcd_store.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include <unistd.h>

#include "common/error.h"
#include "etcd/rpc.pb.h"
#include "rendezvous/etcd/etcd_compare.h"
#include "rendezvous/etcd/etcd_keep_alive.h"
#include "rendezvous/etcd/etcd_store_internal.h"
#include "rendezvous/etcd/etcd_watch.h"

namespace dlrun::rendezvous::etcd {

namespace pb = etcdserverpb;
using detail::EtcdStoreImpl;

namespace detail {
namespace {

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

}  // namespace

std::optional<KeyValue> firstKey(const pb::RangeResponse& range) {
  if (range.kvs_size() == 0) return std::nullopt;
  const auto& kv = range.kvs(0);
  return KeyValue{.key = kv.key(), .value = kv.value(), .modRevision = kv.mod_revision()};
}

}  // namespace detail

EtcdStoreImpl::EtcdStoreImpl(EtcdStoreOptions options, std::shared_ptr<EtcdClient> client)
    : options_(std::move(options)),
      dataPrefix_(options_.prefix + "kv/"),
      recordPrefix_(options_.prefix + "tripwires/"),
      markKey_(options_.prefix + "marks/" + detail::uniqueId()),
      client_(client ? std::move(client) : std::make_shared<EtcdClient>(options_.client)) {}

EtcdStoreImpl::~EtcdStoreImpl() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
  }
  revokeLeases();
}

void EtcdStoreImpl::requireOpen() const {
  std::lock_guard lock(mutex_);
  if (aborted_)
    throw NetworkError("etcd " + client_->options().endpoints.front().text() +
                       ": the store connection was aborted");
}

void EtcdStoreImpl::abort() {
  {
    std::lock_guard lock(mutex_);
    if (aborted_) return;
    aborted_ = true;
    if (liveWatch_) liveWatch_->cancel();                         // a blocked wait throws at once
    for (auto& [seconds, sent] : pending_) sent.grant->cancel();  // and a lease() awaiting one
  }
  revokeLeases();
}

bool EtcdStoreImpl::outlivesFailures() const {
  std::lock_guard lock(mutex_);
  return !aborted_;
}

std::vector<std::optional<KeyValue>> EtcdStoreImpl::readKeys(
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
    for (const auto& op : response.responses())
      out.push_back(detail::firstKey(op.response_range()));
  }
  return out;
}

std::vector<std::optional<std::string>> EtcdStoreImpl::read(const std::vector<std::string>& keys) {
  std::vector<std::string> etcdKeys;
  etcdKeys.reserve(keys.size());
  for (const auto& key : keys) etcdKeys.push_back(dataKey(key));
  std::vector<std::optional<std::string>> out;
  out.reserve(keys.size());
  for (auto& kv : readKeys(etcdKeys))
    out.emplace_back(kv ? std::optional(std::move(kv->value)) : std::nullopt);
  return out;
}

void EtcdStoreImpl::set(const std::string& key, const std::string& value) {
  retrying([&] { return client_->put(dataKey(key), value); });
}

int64_t EtcdStoreImpl::add(const std::string& key, int64_t delta) {
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

std::string EtcdStoreImpl::compareSet(const std::string& key, const std::string& expected,
                                      const std::string& desired) {
  return retrying([&] { return swapOnce(dataKey(key), expected, desired); });
}

std::string EtcdStoreImpl::swapOnce(const std::string& k, const std::string& expected,
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

bool EtcdStoreImpl::deleteKey(const std::string& key) {
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

void EtcdStoreImpl::deleteKeys(const std::vector<std::string>& keys) {
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

bool EtcdStoreImpl::check(const std::vector<std::string>& keys) {
  const auto values = read(keys);
  return std::all_of(values.begin(), values.end(), [](const auto& v) { return v.has_value(); });
}

int64_t EtcdStoreImpl::numKeys() {
  requireOpen();
  return client_->count(dataPrefix_, EtcdClient::prefixEnd(dataPrefix_));
}

void EtcdStoreImpl::append(const std::string& key, const std::string& value) {
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

void EtcdStoreImpl::multiSet(const std::vector<std::string>& keys,
                             const std::vector<std::string>& values) {
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

std::vector<std::string> EtcdStoreImpl::peek(const std::vector<std::string>& keys) {
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

std::optional<std::vector<std::string>> EtcdStoreImpl::createThenPeek(
    const std::string& key, const std::string& value, const std::vector<std::string>& keys) {
  if (keys.size() + 1 > kMaxTxnOps) return std::nullopt;
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
    const auto current = detail::firstKey(response.responses(0).response_range());
    if (!current || current->value.empty()) return std::nullopt;
    out.push_back(current->value);
  }
  for (int i = 1; i < response.responses_size(); ++i) {
    const auto found = detail::firstKey(response.responses(i).response_range());
    out.push_back(found ? found->value : std::string());
  }
  return out;
}

// EtcdStore hands its calls to its inside, but the argument checks and the waits of get() and
// multiGet(): LeasingStore's, which only the derived class reaches.
EtcdStore::EtcdStore(EtcdStoreOptions options, std::shared_ptr<EtcdClient> client)
    : impl_(std::make_unique<EtcdStoreImpl>(std::move(options), std::move(client))) {}

EtcdStore::~EtcdStore() = default;

EtcdClient& EtcdStore::client() { return impl_->client(); }
std::string EtcdStore::etcdKey(const std::string& key) const { return impl_->dataKey(key); }

void EtcdStore::set(const std::string& key, const std::string& value) { impl_->set(key, value); }

std::string EtcdStore::get(const std::string& key) {
  wait({key}, impl_->options().timeout);
  return impl_->read({key}).front().value_or("");  // deleted in between: empty, as dlrund's GET
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) { return impl_->add(key, delta); }

std::string EtcdStore::compareSet(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
  return impl_->compareSet(key, expected, desired);
}

bool EtcdStore::deleteKey(const std::string& key) { return impl_->deleteKey(key); }
void EtcdStore::deleteKeys(const std::vector<std::string>& keys) { impl_->deleteKeys(keys); }
bool EtcdStore::check(const std::vector<std::string>& keys) { return impl_->check(keys); }
int64_t EtcdStore::numKeys() { return impl_->numKeys(); }

void EtcdStore::append(const std::string& key, const std::string& value) {
  impl_->append(key, value);
}

std::vector<std::string> EtcdStore::multiGet(const std::vector<std::string>& keys) {
  wait(keys, impl_->options().timeout);
  return peek(keys);
}

void EtcdStore::multiSet(const std::vector<std::string>& keys,
                         const std::vector<std::string>& values) {
  requireSameLength(keys, values);
  impl_->multiSet(keys, values);
}

void EtcdStore::lease(const std::string& key, const std::string& value,
                      std::chrono::milliseconds ttl,
                      const std::vector<std::pair<std::string, std::string>>& tripwires) {
  requirePositiveTtl(key, ttl);
  impl_->lease(key, value, ttl, tripwires);
}

int64_t EtcdStore::addThenLease(const std::string& counter, int64_t limit,
                                const std::function<std::string(int64_t)>& keyOf,
                                const std::string& value, std::chrono::milliseconds ttl,
                                const std::vector<std::pair<std::string, std::string>>& tripwires) {
  requirePositiveTtl(counter, ttl);
  return impl_->addThenLease(counter, limit, keyOf, value, ttl, tripwires);
}

void EtcdStore::prepareLease(std::chrono::milliseconds ttl) { impl_->prepareLease(ttl); }

bool EtcdStore::waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  return impl_->waitFor(keys, timeout);
}

void EtcdStore::expect(const std::vector<std::string>& keys) { impl_->expect(keys); }

std::vector<std::string> EtcdStore::peek(const std::vector<std::string>& keys) {
  return impl_->peek(keys);
}

std::vector<std::string> EtcdStore::createThenPeek(const std::string& key, const std::string& value,
                                                   const std::vector<std::string>& keys) {
  if (auto out = impl_->createThenPeek(key, value, keys)) return std::move(*out);
  return LeasingStore::createThenPeek(key, value, keys);
}

void EtcdStore::abort() { impl_->abort(); }
bool EtcdStore::outlivesFailures() const { return impl_->outlivesFailures(); }

}  // namespace dlrun::rendezvous::etcd
