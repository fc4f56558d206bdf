#include "rendezvous/etcd/etcd_expiry.h"

#include <algorithm>
#include <set>

#include "etcd/rpc.pb.h"
#include "rendezvous/etcd/etcd_compare.h"

namespace dlrun::rendezvous::etcd {

namespace pb = etcdserverpb;

int64_t expireKeys(EtcdClient& client, const std::string& prefix, std::chrono::seconds ttl,
                   const std::vector<std::pair<std::string, std::string>>& marks) {
  const int64_t lease = client.leaseGrant(ttl);
  std::set<std::string> marked;
  pb::TxnRequest first;
  for (const auto& [key, value] : marks) {
    auto* put = first.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
    put->set_lease(lease);
    marked.insert(key);
  }
  if (!marks.empty()) client.txn(first);
  std::vector<std::string> keys;
  const auto found =
      client.range(prefix, EtcdClient::prefixEnd(prefix), 0, EtcdClient::Values::Omitted);
  for (const auto& kv : found.kvs)
    if (!marked.contains(kv.key)) keys.push_back(kv.key);
  for (size_t start = 0; start < keys.size(); start += kExpireBatch) {
    pb::TxnRequest request;
    for (size_t i = start; i < std::min(keys.size(), start + kExpireBatch); ++i) {
      // A put with ignore_value fails on a missing key, and with it the whole transaction: only
      // while the key is there (the failure branch of "missing").
      auto* nested = request.add_success()->mutable_request_txn();
      *nested->add_compare() = detail::missing(keys[i]);
      auto* put = nested->add_failure()->mutable_request_put();
      put->set_key(keys[i]);
      put->set_ignore_value(true);
      put->set_lease(lease);
    }
    client.txn(request);
  }
  return lease;
}

}  // namespace dlrun::rendezvous::etcd
