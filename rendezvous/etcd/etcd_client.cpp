#include "rendezvous/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>

#include "common/clock.h"
#include "common/error.h"
#include "common/text.h"
#include "etcd/rpc.grpc.pb.h"
#include "grpc_runtime.h"
#include "rendezvous/etcd/etcd_call.h"
#include "rendezvous/etcd/etcd_client_internal.h"
#include "rendezvous/etcd/etcd_compare.h"
#include "rendezvous/etcd/etcd_watch.h"

namespace dlrun::rendezvous::etcd {
namespace detail {
namespace {

namespace pb = etcdserverpb;

// Short reconnect backoffs: gRPC's default starts at 1 s and grows to 120 s, longer than a
// rendezvous waits for a member that came back.
grpc::ChannelArguments channelArguments() {
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // HTTP/2 pings find a member that went silent (a dead host sends no reset), also under a
  // stream that carries nothing for a while. Not below etcd's --grpc-keepalive-min-time (5 s),
  // which answers more frequent pings by closing the connection.
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10'000);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5'000);
  arguments.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  return arguments;
}

}  // namespace
}  // namespace detail

namespace pb = etcdserverpb;

namespace detail {
namespace {

std::shared_ptr<grpc::ChannelCredentials> channelCredentials(const EtcdSecurity& security) {
  if (!security.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = security.rootCerts;  // empty: gRPC's default (the system's) roots
  ssl.pem_cert_chain = security.certChain;
  ssl.pem_private_key = security.privateKey;
  return proto::tlsCredentials(ssl);
}

// Why a channel that keeps failing to connect fails, as gRPC's last error says it: a cheap read
// that does not wait for the channel carries that error in its status at once.
std::string connectFailure(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = pb::KV::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(grpcDeadline(Clock::now() + std::chrono::seconds(1)));
  pb::RangeRequest request;
  request.set_key("/");
  pb::RangeResponse reply;
  const auto status = stub->Range(&context, request, &reply);
  return status.ok() ? std::string() : statusText(status);
}

// A failure that no retry cures: the endpoint's certificate is not trusted, ours is refused.
bool tlsFailure(const std::string& why) {
  // gRPC's words (not a host name's letters): "Ssl handshake failed: SSL_ERROR_SSL: ...".
  for (const char* sign : {"andshake failed", "SSL_ERROR", "certificate"}) {
    if (why.find(sign) != std::string::npos) return true;
  }
  return false;
}

}  // namespace
}  // namespace detail

EtcdClient::EtcdClient(EtcdClientOptions options)
    : impl_(std::make_unique<detail::EtcdClientImpl>(std::move(options))) {
  if (impl_->options.endpoints.empty()) throw ConfigError("etcd: no endpoint given");
  proto::prepareGrpc();
  impl_->connection();
}

EtcdClient::~EtcdClient() = default;

const EtcdClientOptions& EtcdClient::options() const { return impl_->options; }

std::string EtcdClient::endpoint() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->inUse ? impl_->inUse->name : std::string();
}

std::map<std::string, int64_t> EtcdClient::requestsSent() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->requestsSent;
}

namespace detail {

void EtcdClientImpl::countRequest(const char* kind) {
  std::lock_guard lock(mutex);
  ++requestsSent[kind];
}

std::shared_ptr<Connection> EtcdClientImpl::connection(
    std::optional<std::chrono::milliseconds> within) {
  std::string avoid;  // `failed`, read once: the pick runs unlocked
  {
    std::lock_guard lock(mutex);
    if (inUse) return inUse;
    avoid = failed;
  }
  // Every endpoint dials at once; the first that connects wins (the list's order breaks ties).
  // Waits are cut into short slices per channel, so a slow endpoint never holds up the others.
  // The endpoint that failed last still connects when it is cut off from its cluster (it then
  // refuses `hasleader` streams): it is taken only when no other is ready for a while.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  const auto credentials = channelCredentials(options.security);
  for (const auto& endpoint : options.endpoints) {
    channels.push_back(grpc::CreateCustomChannel(endpoint.text(), credentials, channelArguments()));
  }
  // Under TLS a channel in TRANSIENT_FAILURE is asked why, once: a handshake failure is a
  // misconfiguration (wrong CA, refused certificate) that waiting would only hide. It ends the
  // pick at once when every endpoint failed so; one member's bad certificate alone must not
  // stop the client from using the others.
  std::vector<bool> asked(channels.size(), false);
  std::string tlsFailure;  // the first handshake failure, named with its endpoint
  size_t tlsFailures = 0;
  const auto start = Clock::now();
  const auto budget = std::min(options.connectTimeout, within.value_or(options.connectTimeout));
  const auto deadline = start + budget;
  constexpr auto kSlice = std::chrono::milliseconds(20);
  constexpr auto kAvoidFor = std::chrono::milliseconds(500);
  // The states the last look saw: a wait returns at once when a channel has moved on since (a
  // state read again for the wait would miss a channel that became READY in between, and wait
  // out a whole slice for a change from READY).
  std::vector<grpc_connectivity_state> seen(channels.size(), GRPC_CHANNEL_IDLE);
  while (true) {
    const bool avoiding = options.endpoints.size() > 1 && Clock::now() - start < kAvoidFor;
    for (size_t i = 0; i < channels.size(); ++i) {
      const std::string name = options.endpoints[i].text();
      if (avoiding && name == avoid) {
        seen[i] = channels[i]->GetState(true);
        continue;
      }
      const auto state = seen[i] = channels[i]->GetState(true);
      // Ties go to the list's order: within the first slice, an endpoint still connecting
      // ahead of this one is waited for.
      const bool aheadPending =
          Clock::now() - start < kSlice &&
          std::any_of(seen.begin(), seen.begin() + i, [](grpc_connectivity_state s) {
            return s == GRPC_CHANNEL_IDLE || s == GRPC_CHANNEL_CONNECTING;
          });
      if (state == GRPC_CHANNEL_READY && !aheadPending) {
        auto picked = std::make_shared<Connection>();
        picked->name = name;
        picked->channel = channels[i];
        picked->kv = pb::KV::NewStub(channels[i]);
        picked->lease = pb::Lease::NewStub(channels[i]);
        if (!options.security.user.empty()) picked->token = authenticate(*picked);
        std::lock_guard lock(mutex);
        if (!inUse) inUse = picked;  // else another caller's pick came first
        return inUse;
      }
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && options.security.tls && !asked[i]) {
        asked[i] = true;
        const auto why = connectFailure(channels[i]);
        if (detail::tlsFailure(why)) {
          if (tlsFailure.empty()) tlsFailure = "etcd " + name + ": TLS handshake failed: " + why;
          if (++tlsFailures == channels.size()) throw NetworkError(tlsFailure);
        }
      }
    }
    if (Clock::now() >= deadline) break;
    // Until one channel moves on (the list's first ones waited for first).
    for (size_t i = 0; i < channels.size(); ++i) {
      const auto until = std::min(deadline, Clock::now() + kSlice);
      if (channels[i]->WaitForStateChange(seen[i], grpcDeadline(until))) break;
    }
  }
  if (!tlsFailure.empty()) throw NetworkError(tlsFailure);
  // The last error of one that failed says more than the list alone (a refused certificate may
  // look like a closed connection, not a handshake failure).
  std::string cause;
  for (size_t i = 0; i < channels.size() && cause.empty(); ++i) {
    if (channels[i]->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE)
      cause = "; " + options.endpoints[i].text() + ": " + connectFailure(channels[i]);
  }
  throw NetworkError("etcd: no endpoint answered within " + seconds(budget) + ": " +
                     describe(options.endpoints) + cause);
}

std::string EtcdClientImpl::authenticate(const Connection& connection) {
  auto stub = pb::Auth::NewStub(connection.channel);
  grpc::ClientContext context;
  context.set_deadline(grpcDeadline(Clock::now() + options.timeout));
  pb::AuthenticateRequest request;
  request.set_name(options.security.user);
  request.set_password(options.security.password);
  pb::AuthenticateResponse reply;
  const auto status = stub->Authenticate(&context, request, &reply);
  if (status.ok()) return reply.token();
  const std::string what =
      "etcd " + connection.name + ": authentication as '" + options.security.user + "' failed";
  if (permanent(status.error_code()) || status.error_code() == grpc::StatusCode::UNKNOWN) {
    throw Error(what + ": " + statusText(status));
  }
  throwStatus(status, what);
}

void EtcdClientImpl::authorize(const Connection& connection, grpc::ClientContext& context) {
  auto token = connection.currentToken();
  if (!token.empty()) context.AddMetadata("token", token);
}

void EtcdClientImpl::reauthenticate(const std::shared_ptr<Connection>& connection) {
  auto token = authenticate(*connection);
  std::lock_guard lock(connection->tokenMutex);
  connection->token = std::move(token);
}

void EtcdClientImpl::dropConnection(const std::shared_ptr<Connection>& dropped) {
  std::lock_guard lock(mutex);
  failed = dropped->name;
  if (inUse == dropped) inUse.reset();
}

void EtcdClientImpl::dropEndpoint(const std::string& dropped) {
  std::lock_guard lock(mutex);
  failed = dropped;
  if (inUse && inUse->name == dropped) inUse.reset();
}

}  // namespace detail

using CallKind = detail::EtcdClientImpl::CallKind;

namespace {

// A counter's value; throws Error when it is not an integer.
int64_t counterValue(const EtcdClient& client, const KeyValue& kv) {
  const auto value = parseInteger<int64_t>(kv.value);
  if (!value)
    throw Error("etcd " + client.endpoint() + ": add " + detail::quoted(kv.key) +
                ": the value is not an integer");
  return *value;
}

// An add of 0 reads: it writes only to create a missing key ("0"), so agents that all read a
// counter at once neither conflict with each other (a swap loop would, O(K^2) tries for K) nor
// wake every watcher with a write that changes nothing. A plain read first: a transaction that
// may write is proposed to the cluster (a log entry, an fsync) even when it writes nothing.
int64_t readCounter(EtcdClient& client, const std::string& key) {
  if (const auto found = client.get(key)) return counterValue(client, *found);
  const auto result = client.putIfAbsent(key, "0");
  // Deleted between the compare and the read: as missing.
  return result.current ? counterValue(client, *result.current) : 0;
}

// A put guarded by `compare`, one transaction.
SwapResult swap(EtcdClient& client, const std::string& key, const pb::Compare& compare,
                const std::string& desired, int64_t lease) {
  pb::TxnRequest request;
  *request.add_compare() = compare;
  auto* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(desired);
  put->set_lease(lease);
  // The failure branch reads the key, so a lost race costs no second round trip.
  request.add_failure()->mutable_request_range()->set_key(key);
  const auto response = client.txn(request);
  SwapResult result;
  result.swapped = response.succeeded();
  result.revision = response.header().revision();
  if (result.swapped) {
    result.current =
        KeyValue{.key = key, .value = desired, .modRevision = result.revision, .lease = lease};
  } else if (response.responses_size() > 0 &&
             response.responses(0).response_range().kvs_size() > 0) {
    result.current = detail::fromProto(response.responses(0).response_range().kvs(0));
  }
  return result;
}

}  // namespace

RangeResult EtcdClient::range(const std::string& key, const std::string& rangeEnd, int64_t revision,
                              Values values) {
  pb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(rangeEnd);
  request.set_revision(revision);
  request.set_keys_only(values == Values::Omitted);
  const auto response =
      impl_->unary("range", key, CallKind::Read,
                   detail::stubCall(&detail::Connection::kv, &pb::KV::Stub::Range, request));
  RangeResult result;
  result.revision = response.header().revision();
  for (const auto& kv : response.kvs()) result.kvs.push_back(detail::fromProto(kv));
  return result;
}

std::optional<KeyValue> EtcdClient::get(const std::string& key) {
  auto result = range(key);
  if (result.kvs.empty()) return std::nullopt;
  return std::move(result.kvs.front());
}

int64_t EtcdClient::count(const std::string& key, const std::string& rangeEnd) {
  pb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(rangeEnd);
  request.set_count_only(true);
  const auto response =
      impl_->unary("count", key, CallKind::Read,
                   detail::stubCall(&detail::Connection::kv, &pb::KV::Stub::Range, request));
  return response.count();
}

int64_t EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  pb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  const auto response =
      impl_->unary("put", key, CallKind::Write,
                   detail::stubCall(&detail::Connection::kv, &pb::KV::Stub::Put, request));
  return response.header().revision();
}

int64_t EtcdClient::deleteRange(const std::string& key, const std::string& rangeEnd) {
  pb::DeleteRangeRequest request;
  request.set_key(key);
  request.set_range_end(rangeEnd);
  const auto response =
      impl_->unary("delete", key, CallKind::Write,
                   detail::stubCall(&detail::Connection::kv, &pb::KV::Stub::DeleteRange, request));
  return response.deleted();
}

pb::TxnResponse EtcdClient::txn(const pb::TxnRequest& request,
                                std::optional<std::chrono::milliseconds> timeout) {
  // Messages name the first key compared, also in a transaction whose first operation is one.
  const pb::TxnRequest* named = &request;
  while (named->compare_size() == 0 && named->success_size() > 0 &&
         named->success(0).has_request_txn())
    named = &named->success(0).request_txn();
  const std::string key = named->compare_size() > 0 ? named->compare(0).key() : std::string();
  // A transaction of reads only changes nothing, so it is retried as a read is.
  bool readOnly = true;
  for (const auto& op : request.success()) readOnly = readOnly && op.has_request_range();
  for (const auto& op : request.failure()) readOnly = readOnly && op.has_request_range();
  const auto kind = readOnly ? CallKind::Read : CallKind::Write;
  return impl_->unary("txn", key, kind,
                      detail::stubCall(&detail::Connection::kv, &pb::KV::Stub::Txn, request),
                      timeout);
}

SwapResult EtcdClient::putIfAbsent(const std::string& key, const std::string& value,
                                   int64_t lease) {
  const auto compare = detail::missing(key);
  return swap(*this, key, compare, value, lease);
}

SwapResult EtcdClient::putIfValue(const std::string& key, const std::string& expected,
                                  const std::string& desired, int64_t lease) {
  auto compare = detail::compare(key, pb::Compare::VALUE);
  compare.set_value(expected);
  return swap(*this, key, compare, desired, lease);
}

SwapResult EtcdClient::putIfRevision(const std::string& key, int64_t modRevision,
                                     const std::string& desired, int64_t lease) {
  auto compare = detail::compare(key, pb::Compare::MOD);
  compare.set_mod_revision(modRevision);
  return swap(*this, key, compare, desired, lease);
}

int64_t EtcdClient::add(const std::string& key, int64_t delta, const std::optional<AddMark>& mark) {
  if (delta == 0 && !mark) return readCounter(*this, key);
  return add(key, delta, mark, {}).value;
}

EtcdClient::AddResult EtcdClient::add(const std::string& key, int64_t delta,
                                      const std::optional<AddMark>& mark, const AddExtras& extras) {
  // A swap on the value read would cost K adders that come at once (a round's joins, its
  // successes) K^2/2 tries, each a write etcd proposes to its cluster. One transaction instead
  // tries a window of values: the one known (its mod revision: the key missing, the first time),
  // then, nested in each failure branch, that value plus delta, plus 2 delta..., as other
  // adders of the same delta leave it. The last failure branch reads the key for the next try.
  std::optional<KeyValue> current;
  std::shared_ptr<const pb::TxnResponse> ridden;
  for (bool first = true;; first = false) {
    const int64_t base = current ? counterValue(*this, *current) : 0;
    // The first try carries the riders, after the window in a transaction without a compare
    // (its success branch always runs).
    pb::TxnRequest riders;
    const bool riding = first && extras.riding;
    if (riding) extras.riding(riders);
    // Levels as long as the next fits in etcd's count (the branches' writes make each cost more).
    auto budget = static_cast<int>(kMaxTxnOps) - (riding ? riders.success_size() + 1 : 0);
    pb::TxnRequest window;
    pb::TxnRequest* level = &window;
    for (int i = 0;; ++i) {
      // The first exact (the mod revision), whatever the value's spelling.
      auto& guard = *level->add_compare() =
          detail::compare(key, i == 0 ? pb::Compare::MOD : pb::Compare::VALUE);
      if (i == 0) {
        guard.set_mod_revision(current ? current->modRevision : 0);
      } else {
        guard.set_value(std::to_string(base + i * delta));
      }
      const int64_t value = base + (i + 1) * delta;
      const std::string next = std::to_string(value);
      auto* put = level->add_success()->mutable_request_put();
      put->set_key(key);
      put->set_value(next);
      if (mark) {
        auto* marked = level->add_success()->mutable_request_put();
        marked->set_key(mark->key);
        marked->set_value(mark->token + ":" + next);
      }
      if (extras.branch) extras.branch(value, *level);
      const int cost = level->success_size();
      budget -= cost;
      if (i + 1 < kAddWindow && budget >= cost) {
        level = level->add_failure()->mutable_request_txn();
      } else {
        level->add_failure()->mutable_request_range()->set_key(key);
        break;
      }
    }
    pb::TxnRequest outer;
    if (riding) {
      *outer.add_success()->mutable_request_txn() = std::move(window);
      for (auto& op : *riders.mutable_success()) *outer.add_success() = std::move(op);
    }
    auto response = std::make_shared<const pb::TxnResponse>(txn(riding ? outer : window));
    if (riding) ridden = response;
    const pb::TxnResponse* answer =
        riding ? &response->responses(0).response_txn() : response.get();
    for (int i = 0; i < kAddWindow; ++i) {
      if (answer->succeeded())
        return {base + (i + 1) * delta, response->header().revision(), ridden};
      if (answer->responses_size() == 0) break;
      const auto& op = answer->responses(0);
      if (op.has_response_txn()) {
        answer = &op.response_txn();
        continue;
      }
      current.reset();
      if (op.response_range().kvs_size() > 0)
        current = detail::fromProto(op.response_range().kvs(0));
      break;
    }
  }
}

std::optional<int64_t> EtcdClient::addApplied(const AddMark& mark) {
  const auto found = get(mark.key);
  const std::string prefix = mark.token + ":";
  if (!found || !found->value.starts_with(prefix)) return std::nullopt;
  return parseInteger<int64_t>(std::string_view(found->value).substr(prefix.size()));
}

std::unique_ptr<EtcdWatch> EtcdClient::watch(const std::string& key, const std::string& rangeEnd,
                                             int64_t startRevision) {
  return std::make_unique<EtcdWatch>(*this, key, rangeEnd, startRevision);
}

std::unique_ptr<EtcdWatch> EtcdClient::watchPrefix(const std::string& prefix,
                                                   int64_t startRevision) {
  return watch(prefix, prefixEnd(prefix), startRevision);
}

std::unique_ptr<EtcdWatch> EtcdClient::watch(std::vector<WatchRange> ranges) {
  return std::make_unique<EtcdWatch>(*this, std::move(ranges));
}

std::string EtcdClient::prefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace dlrun::rendezvous::etcd
