#include "rendezvous/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <charconv>

#include "common/clock.h"
#include "common/error.h"
#include "etcd/rpc.grpc.pb.h"
#include "grpc_runtime.h"

namespace dlrun::rendezvous::etcd {
namespace detail {
namespace {

namespace pb = etcdserverpb;
using namespace std::chrono_literals;

// gRPC takes deadlines on the system clock; every deadline here is a duration from now, so a
// wall-clock step between the two reads below is the only exposure.
std::chrono::system_clock::time_point grpcDeadline(Clock::time_point deadline) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline -
                                                                         Clock::now());
}

std::string seconds(std::chrono::milliseconds duration) {
  const auto ms = duration.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

const char* codeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "ERROR";
  }
}

// One line: gRPC's messages may carry newlines (a resolver's report, a proxy's page).
std::string oneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::string statusText(const grpc::Status& status) {
  std::string text = codeName(status.error_code());
  if (!status.error_message().empty()) text += ": " + oneLine(status.error_message());
  return text;
}

// Throws the error of the dlrun tree that fits a failed call: a deadline is a TimeoutError, an
// unreachable or leaderless endpoint a NetworkError, anything else (a refusal by etcd) an Error.
[[noreturn]] void throwStatus(const grpc::Status& status, const std::string& message) {
  const std::string text = message + ": " + statusText(status);
  switch (status.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED: throw TimeoutError(text);
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED: throw NetworkError(text);
    default: throw Error(text);
  }
}

KeyValue fromProto(const mvccpb::KeyValue& kv) {
  return {.key = kv.key(),
          .value = kv.value(),
          .createRevision = kv.create_revision(),
          .modRevision = kv.mod_revision(),
          .version = kv.version(),
          .lease = kv.lease()};
}

std::string quoted(const std::string& key) { return "'" + oneLine(key) + "'"; }

// Why etcd cancelled a watch, as one line; a compaction names the revisions involved.
std::string cancelReason(const etcdserverpb::WatchResponse& response, int64_t lastRevision) {
  std::string why = response.cancel_reason().empty() ? "cancelled by etcd"
                                                     : oneLine(response.cancel_reason());
  if (response.compact_revision() > 0)
    why += " (history compacted up to revision " + std::to_string(response.compact_revision()) +
           "; the watch resumes from " + std::to_string(lastRevision + 1) + ")";
  return why;
}

// Codes that say the request itself is refused: another endpoint would refuse it too.
bool permanent(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE: return true;
    default: return false;
  }
}

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

struct EtcdClient::Connection {
  std::string name;  // the endpoint, as messages name it
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  mutable std::mutex tokenMutex;
  std::string token;  // etcd's auth token on this endpoint; empty without a user
  std::string currentToken() const {
    std::lock_guard lock(tokenMutex);
    return token;
  }
};

namespace detail {
namespace {

std::shared_ptr<grpc::ChannelCredentials> channelCredentials(const EtcdSecurity& security) {
  if (!security.tls) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = security.rootCerts;  // empty: gRPC's default (the system's) roots
  ssl.pem_cert_chain = security.certChain;
  ssl.pem_private_key = security.privateKey;
  return grpc::SslCredentials(ssl);
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

EtcdClient::EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw ConfigError("etcd: no endpoint given");
  proto::prepareGrpc();
  connection();
}

EtcdClient::~EtcdClient() = default;

std::string EtcdClient::endpoint() const {
  std::lock_guard lock(mutex_);
  return connection_ ? connection_->name : std::string();
}

std::shared_ptr<EtcdClient::Connection> EtcdClient::connection(
    std::optional<std::chrono::milliseconds> within) {
  std::string failed;  // failed_, read once: the pick runs unlocked
  {
    std::lock_guard lock(mutex_);
    if (connection_) return connection_;
    failed = failed_;
  }
  // Every endpoint dials at once; the first that connects wins (the list's order breaks ties).
  // Waits are cut into short slices per channel, so a slow endpoint never holds up the others.
  // The endpoint that failed last still connects when it is cut off from its cluster (it then
  // refuses `hasleader` streams): it is taken only when no other is ready for a while.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  const auto credentials = detail::channelCredentials(options_.security);
  for (const auto& endpoint : options_.endpoints) {
    channels.push_back(
        grpc::CreateCustomChannel(endpoint.text(), credentials, detail::channelArguments()));
  }
  // Under TLS a channel in TRANSIENT_FAILURE is asked why, once: a handshake failure is a
  // misconfiguration (wrong CA, refused certificate) that waiting would only hide. It ends the
  // pick at once when every endpoint failed so; one member's bad certificate alone must not
  // stop the client from using the others.
  std::vector<bool> asked(channels.size(), false);
  std::string tlsFailure;  // the first handshake failure, named with its endpoint
  size_t tlsFailures = 0;
  const auto start = Clock::now();
  const auto budget = std::min(options_.connectTimeout, within.value_or(options_.connectTimeout));
  const auto deadline = start + budget;
  constexpr auto kSlice = std::chrono::milliseconds(20);
  constexpr auto kAvoidFor = std::chrono::milliseconds(500);
  // The states the last look saw: a wait returns at once when a channel has moved on since (a
  // state read again for the wait would miss a channel that became READY in between, and wait
  // out a whole slice for a change from READY).
  std::vector<grpc_connectivity_state> seen(channels.size(), GRPC_CHANNEL_IDLE);
  while (true) {
    const bool avoiding = options_.endpoints.size() > 1 && Clock::now() - start < kAvoidFor;
    for (size_t i = 0; i < channels.size(); ++i) {
      const std::string name = options_.endpoints[i].text();
      if (avoiding && name == failed) {
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
        if (!options_.security.user.empty()) picked->token = authenticate(*picked);
        std::lock_guard lock(mutex_);
        if (!connection_) connection_ = picked;  // else another caller's pick came first
        return connection_;
      }
      if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && options_.security.tls && !asked[i]) {
        asked[i] = true;
        const auto why = detail::connectFailure(channels[i]);
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
      if (channels[i]->WaitForStateChange(seen[i], detail::grpcDeadline(until))) break;
    }
  }
  if (!tlsFailure.empty()) throw NetworkError(tlsFailure);
  // The last error of one that failed says more than the list alone (a refused certificate may
  // look like a closed connection, not a handshake failure).
  std::string cause;
  for (size_t i = 0; i < channels.size() && cause.empty(); ++i) {
    if (channels[i]->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE)
      cause = "; " + options_.endpoints[i].text() + ": " + detail::connectFailure(channels[i]);
  }
  throw NetworkError("etcd: no endpoint answered within " + detail::seconds(budget) + ": " +
                     describe(options_.endpoints) + cause);
}

std::string EtcdClient::authenticate(const Connection& connection) {
  auto stub = pb::Auth::NewStub(connection.channel);
  grpc::ClientContext context;
  context.set_deadline(detail::grpcDeadline(Clock::now() + options_.timeout));
  pb::AuthenticateRequest request;
  request.set_name(options_.security.user);
  request.set_password(options_.security.password);
  pb::AuthenticateResponse reply;
  const auto status = stub->Authenticate(&context, request, &reply);
  if (status.ok()) return reply.token();
  const std::string what = "etcd " + connection.name + ": authentication as '" +
                           options_.security.user + "' failed";
  if (detail::permanent(status.error_code()) ||
      status.error_code() == grpc::StatusCode::UNKNOWN) {
    throw Error(what + ": " + detail::statusText(status));
  }
  detail::throwStatus(status, what);
}

void EtcdClient::authorize(const Connection& connection, grpc::ClientContext& context) {
  auto token = connection.currentToken();
  if (!token.empty()) context.AddMetadata("token", token);
}

void EtcdClient::reauthenticate(const std::shared_ptr<Connection>& connection) {
  auto token = authenticate(*connection);
  std::lock_guard lock(connection->tokenMutex);
  connection->token = std::move(token);
}

void EtcdClient::dropConnection(const std::shared_ptr<Connection>& failed) {
  std::lock_guard lock(mutex_);
  failed_ = failed->name;
  if (connection_ == failed) connection_.reset();
}

void EtcdClient::dropEndpoint(const std::string& failed) {
  std::lock_guard lock(mutex_);
  failed_ = failed;
  if (connection_ && connection_->name == failed) connection_.reset();
}

// One unary call with the client's deadline. A failure that says the endpoint is gone (or too
// slow) drops it, so the next call picks again; `retry` (reads only) makes that next call here:
// once after a deadline, and after UNAVAILABLE again on the next endpoint for as long as
// connectTimeout (during an election members answer "leader changed", UNAVAILABLE).
template <typename Call>
auto EtcdClient::unary(const char* what, const std::string& key, bool retry, Call&& call,
                       std::optional<std::chrono::milliseconds> timeout) {
  const auto start = Clock::now();
  bool reauthenticated = false;
  for (int attempt = 0;; ++attempt) {
    // A call with a deadline of its own (a release on the way out) keeps it while picking too.
    auto picked = connection(timeout);
    // A connection whose channel is no longer ready (its member died since the last call: the
    // channel went idle or failing) would fail the call unsent; picking again here lets a
    // write, which is never retried, reach a live member instead of failing. (With one
    // endpoint there is nothing else to pick: the call fails at once, as before.)
    if (options_.endpoints.size() > 1 && picked->channel->GetState(true) != GRPC_CHANNEL_READY) {
      dropConnection(picked);
      picked = connection(timeout);
    }
    grpc::ClientContext context;
    context.set_deadline(detail::grpcDeadline(Clock::now() + timeout.value_or(options_.timeout)));
    authorize(*picked, context);
    auto [status, response] = call(*picked, context);
    if (status.ok()) return response;
    const auto code = status.error_code();
    // A simple token expires after etcd's --auth-token-ttl without use: a new one, then again.
    if (!reauthenticated && !options_.security.user.empty() &&
        status.error_message().find("invalid auth token") != std::string::npos) {
      reauthenticated = true;
      reauthenticate(picked);
      continue;
    }
    const bool endpointFailed = code == grpc::StatusCode::UNAVAILABLE ||
                                code == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (endpointFailed) dropConnection(picked);
    if (endpointFailed && retry &&
        (attempt == 0 || (code == grpc::StatusCode::UNAVAILABLE &&
                          Clock::now() - start < options_.connectTimeout))) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // no spin
      continue;
    }
    detail::throwStatus(status, "etcd " + picked->name + ": " + what +
                                    (key.empty() ? "" : " " + detail::quoted(key)) + " failed");
  }
}

RangeResult EtcdClient::range(const std::string& key, const std::string& rangeEnd,
                              int64_t revision, bool keysOnly) {
  pb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(rangeEnd);
  request.set_revision(revision);
  request.set_keys_only(keysOnly);
  const auto response = unary("range", key, true, [&](Connection& c, grpc::ClientContext& ctx) {
    pb::RangeResponse reply;
    auto status = c.kv->Range(&ctx, request, &reply);
    return std::pair{status, std::move(reply)};
  });
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
  const auto response = unary("count", key, true, [&](Connection& c, grpc::ClientContext& ctx) {
    pb::RangeResponse reply;
    auto status = c.kv->Range(&ctx, request, &reply);
    return std::pair{status, std::move(reply)};
  });
  return response.count();
}

int64_t EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  pb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  const auto response = unary("put", key, false, [&](Connection& c, grpc::ClientContext& ctx) {
    pb::PutResponse reply;
    auto status = c.kv->Put(&ctx, request, &reply);
    return std::pair{status, std::move(reply)};
  });
  return response.header().revision();
}

int64_t EtcdClient::deleteRange(const std::string& key, const std::string& rangeEnd) {
  pb::DeleteRangeRequest request;
  request.set_key(key);
  request.set_range_end(rangeEnd);
  const auto response = unary("delete", key, false, [&](Connection& c, grpc::ClientContext& ctx) {
    pb::DeleteRangeResponse reply;
    auto status = c.kv->DeleteRange(&ctx, request, &reply);
    return std::pair{status, std::move(reply)};
  });
  return response.deleted();
}

pb::TxnResponse EtcdClient::txn(const pb::TxnRequest& request,
                                std::optional<std::chrono::milliseconds> timeout) {
  const std::string key = request.compare_size() > 0 ? request.compare(0).key() : std::string();
  // A transaction of reads only changes nothing, so it is retried as a read is.
  bool readOnly = true;
  for (const auto& op : request.success()) readOnly = readOnly && op.has_request_range();
  for (const auto& op : request.failure()) readOnly = readOnly && op.has_request_range();
  return unary("txn", key, readOnly, [&](Connection& c, grpc::ClientContext& ctx) {
    pb::TxnResponse reply;
    auto status = c.kv->Txn(&ctx, request, &reply);
    return std::pair{status, std::move(reply)};
  }, timeout);
}

// `compare` is a pb::Compare (void* keeps the protobuf types out of the header).
SwapResult EtcdClient::swap(const std::string& key, const void* compare,
                            const std::string& desired, int64_t lease) {
  pb::TxnRequest request;
  *request.add_compare() = *static_cast<const pb::Compare*>(compare);
  auto* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(desired);
  put->set_lease(lease);
  // The failure branch reads the key, so a lost race costs no second round trip.
  request.add_failure()->mutable_request_range()->set_key(key);
  const auto response = txn(request);
  SwapResult result;
  result.swapped = response.succeeded();
  result.revision = response.header().revision();
  if (result.swapped) {
    result.current = KeyValue{.key = key, .value = desired, .modRevision = result.revision,
                              .lease = lease};
  } else if (response.responses_size() > 0 &&
             response.responses(0).response_range().kvs_size() > 0) {
    result.current = detail::fromProto(response.responses(0).response_range().kvs(0));
  }
  return result;
}

SwapResult EtcdClient::putIfAbsent(const std::string& key, const std::string& value,
                                   int64_t lease) {
  pb::Compare compare;
  compare.set_key(key);
  compare.set_target(pb::Compare::CREATE);
  compare.set_result(pb::Compare::EQUAL);
  compare.set_create_revision(0);
  return swap(key, &compare, value, lease);
}

SwapResult EtcdClient::putIfValue(const std::string& key, const std::string& expected,
                                  const std::string& desired, int64_t lease) {
  pb::Compare compare;
  compare.set_key(key);
  compare.set_target(pb::Compare::VALUE);
  compare.set_result(pb::Compare::EQUAL);
  compare.set_value(expected);
  return swap(key, &compare, desired, lease);
}

SwapResult EtcdClient::putIfRevision(const std::string& key, int64_t modRevision,
                                     const std::string& desired, int64_t lease) {
  pb::Compare compare;
  compare.set_key(key);
  compare.set_target(pb::Compare::MOD);
  compare.set_result(pb::Compare::EQUAL);
  compare.set_mod_revision(modRevision);
  return swap(key, &compare, desired, lease);
}

namespace detail {
namespace {
std::optional<int64_t> toInteger(std::string_view text) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size())
    return std::nullopt;
  return value;
}
}  // namespace
}  // namespace detail

int64_t EtcdClient::add(const std::string& key, int64_t delta,
                        const std::optional<AddMark>& mark) {
  if (delta == 0 && !mark) return readCounter(key);
  // A swap on the value read would cost K adders that come at once (a round's joins, its
  // successes) K^2/2 tries, each a write etcd proposes to its cluster. One transaction instead
  // tries a window of values: the one known (its mod revision: the key missing, the first time),
  // then, nested in each failure branch, that value plus delta, plus 2 delta..., as other
  // adders of the same delta leave it. The last failure branch reads the key for the next try.
  std::optional<KeyValue> current;
  while (true) {
    const int64_t base = current ? counterValue(*current) : 0;
    pb::TxnRequest request;
    pb::TxnRequest* level = &request;
    for (int i = 0; i < kAddWindow; ++i) {
      auto* guard = level->add_compare();
      guard->set_key(key);
      if (i == 0) {
        guard->set_target(pb::Compare::MOD);  // exact, whatever the value's spelling
        guard->set_mod_revision(current ? current->modRevision : 0);
      } else {
        guard->set_target(pb::Compare::VALUE);
        guard->set_value(std::to_string(base + i * delta));
      }
      guard->set_result(pb::Compare::EQUAL);
      const std::string next = std::to_string(base + (i + 1) * delta);
      auto* put = level->add_success()->mutable_request_put();
      put->set_key(key);
      put->set_value(next);
      if (mark) {
        auto* marked = level->add_success()->mutable_request_put();
        marked->set_key(mark->key);
        marked->set_value(mark->token + ":" + next);
      }
      if (i + 1 < kAddWindow) {
        level = level->add_failure()->mutable_request_txn();
      } else {
        level->add_failure()->mutable_request_range()->set_key(key);
      }
    }
    const auto response = txn(request);
    const pb::TxnResponse* answer = &response;
    for (int i = 0; i < kAddWindow; ++i) {
      if (answer->succeeded()) return base + (i + 1) * delta;
      if (answer->responses_size() == 0) break;
      const auto& op = answer->responses(0);
      if (op.has_response_txn()) {
        answer = &op.response_txn();
        continue;
      }
      current.reset();
      if (op.response_range().kvs_size() > 0) current = detail::fromProto(op.response_range().kvs(0));
      break;
    }
  }
}

// An add of 0 reads: it writes only to create a missing key ("0"), so agents that all read a
// counter at once neither conflict with each other (a swap loop would, O(K^2) tries for K) nor
// wake every watcher with a write that changes nothing. A plain read first: a transaction that
// may write is proposed to the cluster (a log entry, an fsync) even when it writes nothing.
int64_t EtcdClient::readCounter(const std::string& key) {
  if (const auto found = get(key)) return counterValue(*found);
  const auto result = putIfAbsent(key, "0");
  // Deleted between the compare and the read: as missing.
  return result.current ? counterValue(*result.current) : 0;
}

int64_t EtcdClient::counterValue(const KeyValue& kv) const {
  const auto value = detail::toInteger(kv.value);
  if (!value)
    throw Error("etcd " + endpoint() + ": add " + detail::quoted(kv.key) +
                ": the value is not an integer");
  return *value;
}

std::optional<int64_t> EtcdClient::addApplied(const AddMark& mark) {
  const auto found = get(mark.key);
  const std::string prefix = mark.token + ":";
  if (!found || !found->value.starts_with(prefix)) return std::nullopt;
  return detail::toInteger(std::string_view(found->value).substr(prefix.size()));
}

int64_t EtcdClient::leaseGrant(std::chrono::seconds ttl) {
  pb::LeaseGrantRequest request;
  request.set_ttl(ttl.count());
  const auto response = unary("lease grant", {}, false,
                              [&](Connection& c, grpc::ClientContext& ctx) {
                                pb::LeaseGrantResponse reply;
                                auto status = c.lease->LeaseGrant(&ctx, request, &reply);
                                return std::pair{status, std::move(reply)};
                              });
  if (!response.error().empty()) {
    throw Error("etcd " + endpoint() + ": lease grant failed: " + detail::oneLine(response.error()));
  }
  return response.id();
}

// An async call on a completion queue of its own, which take() polls: the callback API would
// start gRPC's "nexting" threads in every agent, two more threads waking every 100 ms.
struct PendingLeaseGrant::Call {
  grpc::CompletionQueue queue;  // first: the call goes before it
  grpc::ClientContext context;
  pb::LeaseGrantRequest request;
  pb::LeaseGrantResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::LeaseGrantResponse>> reader;
  bool finished = false;  // its completion taken from the queue
};

PendingLeaseGrant::~PendingLeaseGrant() {
  if (!call_) return;
  cancel();
  take();  // at once after the cancel: a queue is drained before it goes
  call_->queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (call_->queue.Next(&tag, &ok)) {
  }
}

std::optional<int64_t> PendingLeaseGrant::take() {
  if (!call_->finished) {
    void* tag = nullptr;
    bool ok = false;
    call_->queue.Next(&tag, &ok);  // the call's deadline bounds it
    call_->finished = true;
  }
  if (!call_->status.ok() || !call_->response.error().empty()) return std::nullopt;
  return call_->response.id();
}

void PendingLeaseGrant::cancel() { call_->context.TryCancel(); }

std::unique_ptr<PendingLeaseGrant> EtcdClient::startLeaseGrant(std::chrono::seconds ttl) {
  const auto picked = connection();
  auto pending = std::make_unique<PendingLeaseGrant>();
  auto& call = *(pending->call_ = std::make_unique<PendingLeaseGrant::Call>());
  call.request.set_ttl(ttl.count());
  call.context.set_deadline(detail::grpcDeadline(Clock::now() + options_.timeout));
  authorize(*picked, call.context);
  call.reader = picked->lease->PrepareAsyncLeaseGrant(&call.context, call.request, &call.queue);
  call.reader->StartCall();
  call.reader->Finish(&call.response, &call.status, &call);
  return pending;
}

void EtcdClient::leaseRevoke(int64_t lease, std::optional<std::chrono::milliseconds> timeout) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  unary("lease revoke", std::to_string(lease), false,
        [&](Connection& c, grpc::ClientContext& ctx) {
          pb::LeaseRevokeResponse reply;
          auto status = c.lease->LeaseRevoke(&ctx, request, &reply);
          return std::pair{status, std::move(reply)};
        },
        timeout);
}

std::unique_ptr<EtcdKeepAlive> EtcdClient::keepAlive(int64_t lease,
                                                     std::chrono::milliseconds interval) {
  return std::make_unique<EtcdKeepAlive>(*this, lease, interval);
}

std::unique_ptr<EtcdWatch> EtcdClient::watch(const std::string& key, const std::string& rangeEnd,
                                             int64_t startRevision) {
  return std::make_unique<EtcdWatch>(*this, key, rangeEnd, startRevision);
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

namespace detail {
namespace {

// One bidirectional stream driven through its own completion queue, one operation in flight at
// a time (so the completion that arrives is always the one awaited). Every operation started
// completes before the queue goes away, also when a wait timed out: the destructor cancels and
// drains.
template <typename Request, typename Response>
struct AsyncStream {
  enum Tag : intptr_t { kNone = 0, kStart, kWrite, kRead, kFinish };

  // Waits for the pending operation until `deadline`: its ok bit, or nullopt on timeout (it then
  // stays pending).
  std::optional<bool> wait(Clock::time_point deadline) {
    void* got = nullptr;
    bool ok = false;
    switch (cq.AsyncNext(&got, &ok, grpcDeadline(deadline))) {
      case grpc::CompletionQueue::TIMEOUT: return std::nullopt;
      case grpc::CompletionQueue::SHUTDOWN: pending = kNone; return false;
      case grpc::CompletionQueue::GOT_EVENT: break;
    }
    pending = kNone;
    return ok;
  }
  // Starts the call, or writes, and waits; false when it failed or timed out (then cancelled).
  bool start(Clock::time_point deadline) {
    rw->StartCall(reinterpret_cast<void*>(kStart));
    started = true;
    pending = kStart;
    return settle(deadline);
  }
  bool write(const Request& request, Clock::time_point deadline) {
    rw->Write(request, reinterpret_cast<void*>(kWrite));
    pending = kWrite;
    return settle(deadline);
  }
  void read() {
    response.Clear();
    rw->Read(&response, reinterpret_cast<void*>(kRead));
    pending = kRead;
  }
  // The stream's status, once it failed (cancelling what is still pending); later calls return
  // the same.
  grpc::Status finish() {
    if (pending != kNone) {
      context.TryCancel();
      wait(Clock::now() + std::chrono::seconds(5));
    }
    if (started && !finished) {
      finished = true;
      rw->Finish(&status, reinterpret_cast<void*>(kFinish));
      pending = kFinish;
      if (!wait(Clock::now() + std::chrono::seconds(1))) {
        context.TryCancel();  // a stream still open at the other end: ours ends it
        wait(Clock::now() + std::chrono::seconds(5));
      }
    }
    return status;
  }
  ~AsyncStream() {
    context.TryCancel();
    finish();
    cq.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
  }

  bool settle(Clock::time_point deadline) {
    auto ok = wait(deadline);
    if (!ok) {
      context.TryCancel();
      wait(Clock::now() + std::chrono::seconds(5));
      return false;
    }
    return *ok;
  }

  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<Request, Response>> rw;
  Response response;
  Tag pending = kNone;
  bool started = false;
  bool finished = false;
  grpc::Status status;
};


}  // namespace
}  // namespace detail

// --- EtcdKeepAlive ---

struct EtcdKeepAlive::Stream
    : detail::AsyncStream<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse> {
  std::unique_ptr<pb::Lease::Stub> stub;
};

EtcdKeepAlive::EtcdKeepAlive(EtcdClient& client, int64_t lease,
                             std::chrono::milliseconds interval)
    : client_(client), lease_(lease), interval_(interval) {
  thread_ = std::thread([this] { run(); });
}

EtcdKeepAlive::~EtcdKeepAlive() { stop(); }

void EtcdKeepAlive::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (stream_) stream_->context.TryCancel();  // a wait on the stream returns at once
  }
  wake_.notify_all();
  std::lock_guard joining(joinMutex_);  // two stops at once join once
  if (thread_.joinable()) thread_.join();
  alive_ = false;
}

std::string EtcdKeepAlive::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

std::string EtcdKeepAlive::endpoint() const {
  std::lock_guard lock(mutex_);
  return endpoint_;
}

void EtcdKeepAlive::fail(std::string why) {
  std::lock_guard lock(mutex_);
  if (!stopping_ && failure_.empty()) {
    failure_ = "etcd: keep-alive of lease " + std::to_string(lease_) + ": " + why;
  }
  alive_ = false;
}

bool EtcdKeepAlive::pause(std::chrono::milliseconds duration) {
  std::unique_lock lock(mutex_);
  return !wake_.wait_for(lock, duration, [this] { return stopping_; });
}

void EtcdKeepAlive::run() {
  // Until the first answer the lease's TTL is unknown: the interval is a third of it.
  auto ttl = interval_ * 3;
  auto lastAck = Clock::now();
  std::string why = "no endpoint answered";
  // A lease just granted runs for its whole TTL: the first renewal (and its stream) is due an
  // interval later, not at once, when the agents of a job all take theirs and CPU is short.
  if (!pause(interval_)) return;
  while (true) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    if (Clock::now() >= lastAck + ttl + kElectionGrace) {
      fail("nothing acknowledged for " + detail::seconds(ttl + kElectionGrace) + ": " + why);
      return;
    }
    std::shared_ptr<EtcdClient::Connection> picked;
    try {
      // Short picks, so a stop() (an agent on its way out, etcd gone) never waits long on one.
      picked = client_.connection(std::min<std::chrono::milliseconds>(interval_, kPickSlice));
    } catch (const Error& error) {
      why = error.what();
      if (!pause(std::chrono::milliseconds(50))) return;
      continue;
    }
    why = renewOn(picked->name, picked->channel, picked->currentToken(), lastAck, ttl);
    if (why.empty()) return;  // stopped, or the lease is gone (fail() said so)
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;  // the stream ended because stop() cancelled it
    }
    client_.dropConnection(picked);  // the client's calls move on too
    why = "etcd " + picked->name + ": " + why;
    // A short pause: a stream refused at once must not spin.
    if (!pause(std::chrono::milliseconds(20))) return;
  }
}

std::string EtcdKeepAlive::renewOn(const std::string& endpoint,
                                   const std::shared_ptr<grpc::Channel>& channel,
                                   const std::string& token, Clock::time_point& lastAck,
                                   std::chrono::milliseconds& ttl) {
  auto stream = std::make_unique<Stream>();
  if (!token.empty()) stream->context.AddMetadata("token", token);
  // Without it a member cut off from its cluster keeps the stream open and answers nothing:
  // etcd refuses the stream at once instead when the member has no leader.
  stream->context.AddMetadata("hasleader", "true");
  stream->stub = pb::Lease::NewStub(channel);
  stream->rw = stream->stub->PrepareAsyncLeaseKeepAlive(&stream->context, &stream->cq);
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return {};
    stream_ = stream.get();
    endpoint_ = endpoint;
  }
  // The stream leaves stop()'s reach before it goes (its destructor may wait on the queue).
  struct Detach {
    EtcdKeepAlive& self;
    ~Detach() {
      std::lock_guard lock(self.mutex_);
      self.stream_ = nullptr;
      self.endpoint_.clear();
    }
  } detach{*this};
  // A renewal is answered in milliseconds; one unanswered for this long (or the client's
  // deadline, if shorter) means the member is gone or cut off: another one is tried.
  const auto renewTimeout =
      std::min<std::chrono::milliseconds>(client_.options().timeout,
                                          std::max<std::chrono::milliseconds>(interval_, std::chrono::seconds(1)));
  if (!stream->start(Clock::now() + renewTimeout)) return "the stream did not start: " + detail::statusText(stream->finish());
  pb::LeaseKeepAliveRequest request;
  request.set_id(lease_);
  while (true) {
    const auto sent = Clock::now();
    if (!stream->write(request, sent + renewTimeout)) {
      return "the stream ended: " + detail::statusText(stream->finish());
    }
    stream->read();
    const auto ok = stream->wait(sent + renewTimeout);
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return {};
    }
    if (!ok) return "no answer to a renewal within " + detail::seconds(renewTimeout);
    if (!*ok) return "the stream ended: " + detail::statusText(stream->finish());
    if (stream->response.ttl() <= 0) {
      fail("etcd says the lease is gone");
      return {};
    }
    // The lease runs for its TTL from when etcd renewed it, which is after `sent`.
    lastAck = sent;
    ttl = std::chrono::seconds(stream->response.ttl());
    ++renewals_;
    if (!pause(interval_)) return {};
  }
}

// --- EtcdWatch ---

struct EtcdWatch::Stream : detail::AsyncStream<pb::WatchRequest, pb::WatchResponse> {
  std::unique_ptr<pb::Watch::Stub> stub;
  std::string endpoint;
};

EtcdWatch::EtcdWatch(EtcdClient& client, std::vector<WatchRange> ranges) : client_(client) {
  if (ranges.empty()) throw std::invalid_argument("EtcdWatch: no range to watch");
  for (auto& range : ranges) {
    const int64_t start = range.startRevision;
    ranges_.push_back({std::move(range), start <= 0, start > 0 ? start - 1 : 0});
  }
  connect({}, {});
}

EtcdWatch::EtcdWatch(EtcdClient& client, std::string key, std::string rangeEnd,
                     int64_t startRevision)
    : EtcdWatch(client, {WatchRange{.key = std::move(key),
                                    .rangeEnd = std::move(rangeEnd),
                                    .startRevision = startRevision}}) {}

EtcdWatch::~EtcdWatch() = default;

void EtcdWatch::cancel() {
  std::lock_guard lock(mutex_);
  cancelled_ = true;
  if (stream_) stream_->context.TryCancel();
}

std::string EtcdWatch::endpoint() const {
  std::lock_guard lock(mutex_);
  return endpoint_;
}

std::string EtcdWatch::what() const {
  return "watch of " + detail::quoted(ranges_.front().range.key) +
         (ranges_.size() > 1 ? " (and " + std::to_string(ranges_.size() - 1) + " more)" : "");
}

void EtcdWatch::throwCancelled() const {
  throw NetworkError("etcd " + endpoint() + ": " + what() + " ended: cancelled");
}

void EtcdWatch::open(const std::string& endpoint, const std::shared_ptr<grpc::Channel>& channel,
                     const std::string& token) {
  auto stream = std::make_unique<Stream>();
  auto& s = *stream;
  if (!token.empty()) s.context.AddMetadata("token", token);
  s.endpoint = endpoint;
  s.context.AddMetadata("hasleader", "true");  // see EtcdKeepAlive
  s.stub = pb::Watch::NewStub(channel);
  s.rw = s.stub->PrepareAsyncWatch(&s.context, &s.cq);
  {
    // Published before the first wait, so cancel() cuts this open short too.
    std::lock_guard lock(mutex_);
    if (cancelled_) throwCancelled();
    stream_.swap(stream);
  }
  stream.reset();  // the failed stream, if any
  const std::string what = "etcd " + endpoint + ": " + this->what();
  const auto deadline = Clock::now() + client_.options().timeout;
  auto failed = [&](const std::string& how) {
    const auto status = s.finish();
    detail::throwStatus(
        status.ok() ? grpc::Status(grpc::StatusCode::CANCELLED, "stream closed") : status,
        what + " " + how);
  };
  if (!s.start(deadline)) failed("could not start");
  for (size_t i = 0; i < ranges_.size(); ++i) {
    const auto& r = ranges_[i];
    pb::WatchRequest request;
    auto* create = request.mutable_create_request();
    create->set_key(r.range.key);
    create->set_range_end(r.range.rangeEnd);
    create->set_start_revision(r.fromNow ? 0 : r.lastRevision + 1);
    create->set_watch_id(static_cast<int64_t>(i) + 1);  // ids of our own: events say their range
    if (r.range.only == WatchRange::Only::Puts)
      create->add_filters(pb::WatchCreateRequest::NODELETE);
    if (r.range.only == WatchRange::Only::Deletes)
      create->add_filters(pb::WatchCreateRequest::NOPUT);
    if (!s.write(request, deadline)) failed("was not accepted");
  }
  // etcd confirms each range with a response of its own (created) before any of its events;
  // an earlier range's events may come before a later one's confirmation.
  for (size_t confirmed = 0; confirmed < ranges_.size();) {
    s.read();
    const auto ok = s.wait(deadline);
    if (!ok) {
      s.context.TryCancel();
      s.wait(Clock::now() + std::chrono::seconds(5));
      failed("was not confirmed in time");
    }
    if (!*ok) failed("was not confirmed");
    const int64_t id = s.response.watch_id();
    if (id < 1 || id > static_cast<int64_t>(ranges_.size())) failed("got an unknown watch id");
    auto& r = ranges_[id - 1];
    if (s.response.canceled()) {
      // A start revision compacted away: the events since lastRevision() are lost for good.
      throw Error(what + ": " + detail::cancelReason(s.response, r.lastRevision));
    }
    if (!s.response.created()) {
      auto events = take(endpoint);
      early_.insert(early_.end(), events.begin(), events.end());
      continue;
    }
    if (r.fromNow) {
      // "From now" is after the revision etcd's confirmation carries: a resumed watch starts
      // there, and never replays history from revision 1.
      r.lastRevision = s.response.header().revision();
      r.fromNow = false;
    }
    ++confirmed;
  }
}

void EtcdWatch::connect(const std::string& failed, const std::string& why) {
  // The fail-over budget: as long as the client may take to pick an endpoint.
  const auto deadline = Clock::now() + client_.options().connectTimeout;
  std::string lastError = why;
  bool first = failed.empty();
  while (true) {
    if (cancelled_) throwCancelled();
    std::shared_ptr<EtcdClient::Connection> picked;
    try {
      picked = client_.connection();
      {
        std::lock_guard lock(mutex_);
        endpoint_ = picked->name;
      }
      open(picked->name, picked->channel, picked->currentToken());
      if (!first) ++reconnects_;
      return;
    } catch (const NetworkError& error) {
      lastError = error.what();
    } catch (const TimeoutError& error) {
      lastError = error.what();
    }
    if (cancelled_) throwCancelled();
    if (picked) client_.dropConnection(picked);
    if (Clock::now() >= deadline) {
      throw NetworkError("etcd: " + what() + ": no endpoint took it within " +
                         detail::seconds(client_.options().connectTimeout) + ": " + lastError);
    }
    first = false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a refusal at once must not spin
  }
}

std::vector<WatchEvent> EtcdWatch::take(const std::string& endpoint) {
  auto& response = stream_->response;
  auto& r = ranges_.at(response.watch_id() - 1);
  if (response.canceled()) {
    const std::string why = detail::cancelReason(response, r.lastRevision);
    stream_->finish();
    throw Error("etcd " + endpoint + ": " + what() + ": " + why);
  }
  std::vector<WatchEvent> events;
  for (const auto& event : response.events()) {
    // Revisions only grow within a range, and a resumed range starts after its lastRevision;
    // the check keeps "each event once" true by design.
    if (event.kv().mod_revision() <= r.lastRevision) continue;
    events.push_back({event.type() == mvccpb::Event::DELETE ? WatchEvent::Type::Delete
                                                            : WatchEvent::Type::Put,
                      detail::fromProto(event.kv())});
  }
  // A revision may hold several events (one txn): advance only after the whole batch.
  for (const auto& event : events) r.lastRevision = std::max(r.lastRevision, event.kv.modRevision);
  return events;
}

std::vector<WatchEvent> EtcdWatch::next(std::chrono::milliseconds timeout) {
  if (!early_.empty()) return std::exchange(early_, {});
  // A wait "practically forever" must not overflow the clock.
  const auto deadline =
      Clock::now() + std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24));
  while (true) {
    if (cancelled_) throwCancelled();
    auto& s = *stream_;  // replaced only on this thread (connect), so no lock to read it
    if (s.pending == Stream::kNone) s.read();
    const auto ok = s.wait(deadline);
    if (!ok) return {};  // the read stays pending for the next call
    if (!*ok) {
      const auto status = s.finish();
      if (cancelled_) throwCancelled();
      const std::string why = "etcd " + s.endpoint + ": " + what() + " ended: " +
                              detail::statusText(status);
      if (detail::permanent(status.error_code())) throw Error(why);
      {
        std::lock_guard lock(mutex_);
        endpoint_.clear();
      }
      // Drop the failed endpoint (if the client still uses it), then resume elsewhere. A copy:
      // connect() destroys the stream that holds the name.
      const std::string failed = s.endpoint;
      client_.dropEndpoint(failed);
      connect(failed, why);
      if (!early_.empty()) return std::exchange(early_, {});
      continue;
    }
    auto events = take(s.endpoint);
    if (!events.empty()) return events;
    if (Clock::now() >= deadline) return {};
  }
}

}  // namespace dlrun::rendezvous::etcd
