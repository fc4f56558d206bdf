// A blocking client of etcd's v3 API over gRPC (the subset in proto/etcd): reads with their
// revision, writes, compare-and-swap transactions, an add built on them, leases with a
// keep-alive stream, and watches that deliver a key range's events in revision order.
//
// Endpoints: the client dials every endpoint of the list at once, keeps the first that connects
// (up to connectTimeout) and stays on it; a call that finds it UNAVAILABLE (or past its
// deadline) drops it, and the next call picks again, preferring the others. Reads (range, get,
// count, a txn of reads only) are retried on the next endpoint (after UNAVAILABLE for up to
// connectTimeout: an election answers "leader changed" for a while). Writes (put, delete, txn
// and the swaps, lease grant and revoke) are NEVER retried: one may have applied before the
// failure, so the NetworkError reaches the caller, which re-reads and decides again (EtcdStore
// does, for up to connectTimeout). Every error is one line naming the endpoint.
//
// Security (options.security): with TLS every channel is an SSL channel (the given CA, else the
// system's; a client certificate when given). A TLS handshake that fails (an unknown CA, a
// refused certificate) is a NetworkError naming the endpoint and gRPC's cause, at once when
// every endpoint failed so (else when no other connected within connectTimeout). With a user, the
// client authenticates (Auth.Authenticate) when it picks an endpoint and sends the token as the
// metadata `token` with every call and stream; a unary call that etcd answers "invalid auth token"
// (expired) authenticates again and is repeated once. Refused credentials are an Error naming the
// endpoint and the user.
//
// Fail-over of the streams: EtcdWatch (etcd_watch.h) and EtcdKeepAlive (etcd_keep_alive.h)
// move to another endpoint by themselves when theirs fails (UNAVAILABLE, the stream's end, a
// member without a leader refusing `hasleader`), within about a second: the watch resumes from
// lastRevision() + 1 (no event lost, none twice), the keep-alive renews the same lease (it lives
// in the cluster, not in a member). Both keep a reference to their EtcdClient, which must
// outlive them.
//
// Threads: every method is thread-safe (gRPC stubs are). EtcdKeepAlive runs one thread of its
// own (why: see there); EtcdWatch runs none, its owner's thread drives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/etcd/endpoints.h"

namespace etcdserverpb {
class TxnRequest;
class TxnResponse;
}  // namespace etcdserverpb

namespace dlrun::rendezvous::etcd {

struct EtcdClientOptions {
  std::vector<Endpoint> endpoints;
  // The deadline of every unary call.
  std::chrono::milliseconds timeout{10'000};
  // How long picking an endpoint may take before NetworkError names them all.
  std::chrono::milliseconds connectTimeout{5'000};
  // How long a lease's keep-alive (etcd_keep_alive.h) goes on trying while no endpoint
  // acknowledges a renewal, when longer than the lease's TTL plus an election's grace: a
  // cluster that comes back with its data extends every lease by its TTL, so the renewals that
  // go on through its outage keep the lease (a store outage is not a node loss).
  std::chrono::milliseconds outageTimeout{0};
  // TLS and user/password authentication (none by default).
  EtcdSecurity security;
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t createRevision = 0;
  int64_t modRevision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // the store's revision the read saw: watch from revision + 1
};

// What a compare-and-swap did. When it swapped, `current` is the written value at `revision`
// (key, value and modRevision filled); when not, it is what the key holds (empty: missing), read
// in the same transaction.
struct SwapResult {
  bool swapped = false;
  std::optional<KeyValue> current;
  int64_t revision = 0;
};

struct WatchEvent {
  enum class Type { Put, Delete };
  Type type = Type::Put;
  KeyValue kv;  // a Delete has the key and modRevision = the deletion's revision
};

// One key range of a watch: [key, rangeEnd) (rangeEnd empty: the key alone), with etcd's
// filters, from startRevision (0: from now).
struct WatchRange {
  enum class Only { All, Puts, Deletes };
  std::string key;
  std::string rangeEnd;
  Only only = Only::All;
  int64_t startRevision = 0;
};

class EtcdKeepAlive;
class EtcdWatch;
namespace detail {
struct EtcdClientImpl;
}

// A lease grant sent ahead (EtcdClient::startLeaseGrant): its answer is read while the
// caller's next requests wait for theirs, so they need not wait for it. Destroying it cancels
// a grant still under way; a lease granted and never taken lapses after its TTL, holding no key.
class PendingLeaseGrant {
 public:
  ~PendingLeaseGrant();
  // Waits for the answer: the lease's id, or nothing when the call failed or was cancelled
  // (then grant again with leaseGrant(), whose retries and messages apply). One thread at a time.
  std::optional<int64_t> take();
  // Safe from any thread: a take() waiting returns soon after.
  void cancel();

 private:
  friend class EtcdClient;
  struct Call;  // the call's context, messages, answer and completion queue
  std::unique_ptr<Call> call_;
};

class EtcdClient {
 public:
  // Picks an endpoint at once; throws ConfigError for an empty list, NetworkError when none
  // connects within connectTimeout.
  explicit EtcdClient(EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // Whether a range's values are read, or left out (empty).
  enum class Values { Read, Omitted };
  // [key, rangeEnd), or the key alone when rangeEnd is empty; at `revision` when > 0.
  RangeResult range(const std::string& key, const std::string& rangeEnd = {}, int64_t revision = 0,
                    Values values = Values::Read);
  RangeResult rangePrefix(const std::string& prefix) { return range(prefix, prefixEnd(prefix)); }
  std::optional<KeyValue> get(const std::string& key);
  // How many keys [key, rangeEnd) holds, without reading them.
  int64_t count(const std::string& key, const std::string& rangeEnd);
  // Returns the revision of the write. lease 0: none.
  int64_t put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Returns how many keys were deleted.
  int64_t deleteRange(const std::string& key, const std::string& rangeEnd = {});
  bool deleteKey(const std::string& key) { return deleteRange(key) > 0; }

  // Compare-and-swap, one Txn each: put when the key is missing (create_revision == 0), when
  // its value equals `expected` (a missing key never does), or when its mod_revision equals
  // `modRevision` (0: missing).
  SwapResult putIfAbsent(const std::string& key, const std::string& value, int64_t lease = 0);
  SwapResult putIfValue(const std::string& key, const std::string& expected,
                        const std::string& desired, int64_t lease = 0);
  SwapResult putIfRevision(const std::string& key, int64_t modRevision, const std::string& desired,
                           int64_t lease = 0);
  // Adds to a decimal integer value (missing counts as 0) by a swap on the value, as many tries
  // as conflicts take; returns the result. Throws Error when the value is not an integer.
  // Adding 0 without a mark only reads (it creates a missing key as "0", as TCPStore does).
  // With a mark, the transaction that adds also writes mark.key = mark.token + ":" + result,
  // so a caller whose call failed half-way can read whether it applied (addApplied).
  struct AddMark {
    std::string key;
    std::string token;
  };
  int64_t add(const std::string& key, int64_t delta, const std::optional<AddMark>& mark = {});
  // What an add's transaction may carry besides (EtcdStore::addThenLease): `branch(v, branch)`
  // adds operations to the branch that applies value v, after its put (writes whose keys
  // depend on v); `riding` adds operations to the first try, run after the add whatever it
  // found (reads, answered in that try's response from index 1 on).
  struct AddExtras {
    std::function<void(int64_t value, etcdserverpb::TxnRequest& branch)> branch;
    std::function<void(etcdserverpb::TxnRequest& riding)> riding;
  };
  struct AddResult {
    int64_t value = 0;
    int64_t revision = 0;  // the revision of the transaction that applied it
    std::shared_ptr<const etcdserverpb::TxnResponse> ridden;  // the first try's, with `riding`
  };
  AddResult add(const std::string& key, int64_t delta, const std::optional<AddMark>& mark,
                const AddExtras& extras);
  // The values one add() transaction tries (see add): 32 adders at once (a round of 32 nodes
  // joining, their successes) take one try each, where a try that misses costs etcd a proposal.
  static constexpr int kAddWindow = 32;
  // etcd refuses a transaction of more than 128 operations by default (--max-txn-ops), counted
  // along its nesting: each level uses the most of its compares, successes and failures.
  static constexpr size_t kMaxTxnOps = 128;
  // The result of the marked add() whose mark this is, if that add applied.
  std::optional<int64_t> addApplied(const AddMark& mark);
  // Any transaction (the raw messages), for what the helpers above do not cover. `timeout`
  // replaces the client's deadline for this call. One of reads only is retried as a read.
  etcdserverpb::TxnResponse txn(const etcdserverpb::TxnRequest& request,
                                std::optional<std::chrono::milliseconds> timeout = {});

  // Grants a lease of `ttl` (etcd's minimum with default election settings is 2 s); returns its
  // id. Keys put with it are deleted when it lapses or is revoked.
  int64_t leaseGrant(std::chrono::seconds ttl);
  // The same grant, sent now and answered later (see PendingLeaseGrant); one try, on the
  // endpoint in use.
  std::unique_ptr<PendingLeaseGrant> startLeaseGrant(std::chrono::seconds ttl);
  void leaseRevoke(int64_t lease, std::optional<std::chrono::milliseconds> timeout = {});
  // Renews `lease` every `interval` until the returned object is stopped or destroyed.
  std::unique_ptr<EtcdKeepAlive> keepAlive(int64_t lease, std::chrono::milliseconds interval);

  // Watches [key, rangeEnd) (the key alone when empty) from `startRevision` (0: from now);
  // returns once etcd confirmed the watch, so every later change is seen.
  std::unique_ptr<EtcdWatch> watch(const std::string& key, const std::string& rangeEnd,
                                   int64_t startRevision);
  std::unique_ptr<EtcdWatch> watchPrefix(const std::string& prefix, int64_t startRevision);
  // Several ranges on one stream (see EtcdWatch).
  std::unique_ptr<EtcdWatch> watch(std::vector<WatchRange> ranges);

  // The endpoint in use ("" before one is picked again after a failure).
  std::string endpoint() const;
  const EtcdClientOptions& options() const;

  // The requests sent so far, by kind ("txn", "range", "watch"...; each try of a unary call, each
  // watch stream opened; not the grant sent ahead nor keep-alives): what a protocol costs etcd,
  // per agent, where etcd's own counts are the whole cluster's.
  std::map<std::string, int64_t> requestsSent() const;

  // The range_end covering every key that starts with `prefix`: its last byte below 0xff
  // incremented, later bytes dropped; "\0" (everything) when there is none.
  static std::string prefixEnd(const std::string& prefix);

 private:
  friend class EtcdKeepAlive;  // they pick a new endpoint when their stream's fails
  friend class EtcdWatch;
  // The options, the endpoint in use and the calls' counts (etcd_client_internal.h).
  std::unique_ptr<detail::EtcdClientImpl> impl_;
};

}  // namespace dlrun::rendezvous::etcd
