// A finished job's keys expire: etcd outlives its jobs, and a job's keys, kept, would refuse its
// rendezvous id for ever (ElasticOptions::endedJobKeys). Each agent leaving an ended job, after
// its last write, puts every key of the job on a new lease of the job's TTL (--rdzv-conf
// job_ttl); the last to leave re-leases them all, so the keys go a TTL after the job's end.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "rendezvous/etcd/etcd_client.h"

namespace dlrun::rendezvous::etcd {

// Grants a lease of `ttl`, writes `marks` (etcd key, value) with it, then moves every other key
// under `prefix` onto it, values kept (a put with ignore_value), in transactions of
// kExpireBatch keys; a key deleted meanwhile is skipped, not written again. Returns the lease.
// Not retried: a write that failed may have applied (the caller reports it, and the next agent
// to leave does it again).
int64_t expireKeys(EtcdClient& client, const std::string& prefix, std::chrono::seconds ttl,
                   const std::vector<std::pair<std::string, std::string>>& marks);

// Keys a transaction of expireKeys moves: each costs a nested transaction of one compare and one
// put, and etcd counts the outer operations against the nested ones' limit (kMaxTxnOps).
inline constexpr size_t kExpireBatch = EtcdClient::kMaxTxnOps / 2;

}  // namespace dlrun::rendezvous::etcd
