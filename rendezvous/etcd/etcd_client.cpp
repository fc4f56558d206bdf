#include "rendezvous/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <charconv>

#include "common/clock.h"
#include "common/error.h"
#include "etcd/rpc.grpc.pb.h"

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
};

EtcdClient::EtcdClient(EtcdClientOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) throw ConfigError("etcd: no endpoint given");
  connection();
}

EtcdClient::~EtcdClient() = default;

std::string EtcdClient::endpoint() const {
  std::lock_guard lock(mutex_);
  return connection_ ? connection_->name : std::string();
}

std::shared_ptr<EtcdClient::Connection> EtcdClient::connection() {
  std::lock_guard lock(mutex_);
  if (connection_) return connection_;
  // Every endpoint dials at once; the first that connects wins (the list's order breaks ties).
  // Waits are cut into short slices per channel, so a slow endpoint never holds up the others.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (const auto& endpoint : options_.endpoints) {
    channels.push_back(grpc::CreateCustomChannel(
        endpoint.text(), grpc::InsecureChannelCredentials(), detail::channelArguments()));
  }
  const auto deadline = Clock::now() + options_.connectTimeout;
  constexpr auto kSlice = std::chrono::milliseconds(20);
  while (true) {
    for (size_t i = 0; i < channels.size(); ++i) {
      if (channels[i]->GetState(true) == GRPC_CHANNEL_READY) {
        auto picked = std::make_shared<Connection>();
        picked->name = options_.endpoints[i].text();
        picked->channel = channels[i];
        picked->kv = pb::KV::NewStub(channels[i]);
        picked->lease = pb::Lease::NewStub(channels[i]);
        connection_ = picked;
        return picked;
      }
    }
    if (Clock::now() >= deadline) break;
    for (auto& channel : channels) {
      const auto until = std::min(deadline, Clock::now() + kSlice);
      channel->WaitForStateChange(channel->GetState(false), detail::grpcDeadline(until));
    }
  }
  throw NetworkError("etcd: no endpoint answered within " +
                     detail::seconds(options_.connectTimeout) + ": " +
                     describe(options_.endpoints));
}

void EtcdClient::dropConnection(const std::shared_ptr<Connection>& failed) {
  std::lock_guard lock(mutex_);
  if (connection_ == failed) connection_.reset();
}

// One unary call with the client's deadline. A failure that says the endpoint is gone (or too
// slow) drops it, so the next call picks again; `retry` (reads only) makes that next call here.
template <typename Call>
auto EtcdClient::unary(const char* what, const std::string& key, bool retry, Call&& call,
                       std::optional<std::chrono::milliseconds> timeout) {
  for (int attempt = 0;; ++attempt) {
    auto picked = connection();
    grpc::ClientContext context;
    context.set_deadline(detail::grpcDeadline(Clock::now() + timeout.value_or(options_.timeout)));
    auto [status, response] = call(*picked, context);
    if (status.ok()) return response;
    const auto code = status.error_code();
    const bool endpointFailed = code == grpc::StatusCode::UNAVAILABLE ||
                                code == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (endpointFailed) dropConnection(picked);
    if (endpointFailed && retry && attempt == 0) continue;
    detail::throwStatus(status, "etcd " + picked->name + ": " + what +
                                    (key.empty() ? "" : " " + detail::quoted(key)) + " failed");
  }
}

RangeResult EtcdClient::range(const std::string& key, const std::string& rangeEnd,
                              int64_t revision) {
  pb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(rangeEnd);
  request.set_revision(revision);
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
  return unary("txn", key, false, [&](Connection& c, grpc::ClientContext& ctx) {
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

int64_t EtcdClient::add(const std::string& key, int64_t delta) {
  // Optimistic: assume the key is missing, so creating it costs one round trip; a lost race
  // hands back the current value for the next try.
  std::optional<KeyValue> current;
  while (true) {
    int64_t base = 0;
    if (current) {
      const auto& text = current->value;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), base);
      if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
        throw Error("etcd " + endpoint() + ": add " + detail::quoted(key) +
                    ": the value is not an integer");
      }
    }
    const int64_t next = base + delta;
    auto result = putIfRevision(key, current ? current->modRevision : 0, std::to_string(next));
    if (result.swapped) return next;
    current = std::move(result.current);
  }
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
  auto picked = connection();
  return std::make_unique<EtcdKeepAlive>(picked->channel, picked->name, lease, interval);
}

std::unique_ptr<EtcdWatch> EtcdClient::watch(const std::string& key, const std::string& rangeEnd,
                                             int64_t startRevision) {
  auto picked = connection();
  try {
    return std::make_unique<EtcdWatch>(picked->channel, picked->name, key, rangeEnd,
                                       startRevision, options_.timeout);
  } catch (const NetworkError&) {
    dropConnection(picked);
    throw;
  } catch (const TimeoutError&) {
    dropConnection(picked);
    throw;
  }
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

// --- EtcdKeepAlive ---

struct EtcdKeepAlive::Stream {
  grpc::ClientContext context;
  std::unique_ptr<pb::Lease::Stub> stub;
  std::unique_ptr<grpc::ClientReaderWriter<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse>>
      rw;
};

EtcdKeepAlive::EtcdKeepAlive(std::shared_ptr<grpc::Channel> channel, std::string endpoint,
                             int64_t lease, std::chrono::milliseconds interval)
    : endpoint_(std::move(endpoint)), lease_(lease), interval_(interval),
      stream_(std::make_unique<Stream>()) {
  // Without it a member cut off from its cluster keeps the stream open and answers nothing:
  // etcd refuses the stream at once instead when the member has no leader.
  stream_->context.AddMetadata("hasleader", "true");
  stream_->stub = pb::Lease::NewStub(channel);
  stream_->rw = stream_->stub->LeaseKeepAlive(&stream_->context);
  thread_ = std::thread([this] { run(); });
}

EtcdKeepAlive::~EtcdKeepAlive() { stop(); }

void EtcdKeepAlive::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  stream_->context.TryCancel();  // a Read blocked on the stream returns at once
  std::lock_guard joining(joinMutex_);  // two stops at once join once
  if (thread_.joinable()) thread_.join();
  alive_ = false;
}

std::string EtcdKeepAlive::failure() const {
  std::lock_guard lock(mutex_);
  return failure_;
}

void EtcdKeepAlive::fail(std::string why) {
  std::lock_guard lock(mutex_);
  if (!stopping_ && failure_.empty()) {
    failure_ = "etcd " + endpoint_ + ": keep-alive of lease " + std::to_string(lease_) + ": " +
               why;
  }
  alive_ = false;
}

void EtcdKeepAlive::run() {
  pb::LeaseKeepAliveRequest request;
  request.set_id(lease_);
  pb::LeaseKeepAliveResponse response;
  while (true) {
    if (!stream_->rw->Write(request) || !stream_->rw->Read(&response)) {
      const auto status = stream_->rw->Finish();
      fail("the stream ended: " + detail::statusText(status));
      return;
    }
    if (response.ttl() <= 0) {
      fail("etcd says the lease is gone");
      break;
    }
    ++renewals_;
    std::unique_lock lock(mutex_);
    if (wake_.wait_for(lock, interval_, [this] { return stopping_; })) break;
  }
  stream_->context.TryCancel();
  stream_->rw->Finish();
}

// --- EtcdWatch ---

struct EtcdWatch::Stream {
  enum Tag : intptr_t { kStart = 1, kWrite, kRead, kFinish };

  // Waits for `tag`'s completion until `deadline`: its ok bit, or nullopt on timeout. Nothing
  // else is ever in flight but the one operation awaited, so another tag cannot arrive.
  std::optional<bool> await(Tag tag, Clock::time_point deadline) {
    void* got = nullptr;
    bool ok = false;
    switch (cq.AsyncNext(&got, &ok, detail::grpcDeadline(deadline))) {
      case grpc::CompletionQueue::TIMEOUT: return std::nullopt;
      case grpc::CompletionQueue::SHUTDOWN: return false;
      case grpc::CompletionQueue::GOT_EVENT: break;
    }
    if (got != reinterpret_cast<void*>(tag)) return false;
    return ok;
  }

  // The stream failed: collects its status and throws it (once; later calls throw the same).
  [[noreturn]] void fail(const std::string& what) {
    if (!finished) {
      finished = true;
      rw->Finish(&status, reinterpret_cast<void*>(kFinish));
      await(kFinish, Clock::now() + std::chrono::seconds(5));
    }
    detail::throwStatus(status.ok() ? grpc::Status(grpc::StatusCode::CANCELLED, "stream closed")
                                    : status,
                        "etcd " + endpoint + ": watch of " + detail::quoted(key) + " " + what);
  }

  // Every operation started must complete before the queue goes away (also when the
  // constructor threw); after the cancel each does at once.
  ~Stream() {
    context.TryCancel();
    if (readPending) await(kRead, Clock::now() + std::chrono::seconds(5));
    if (started && !finished) {
      finished = true;
      rw->Finish(&status, reinterpret_cast<void*>(kFinish));
      await(kFinish, Clock::now() + std::chrono::seconds(5));
    }
    cq.Shutdown();
    void* tag = nullptr;
    bool ok = false;
    while (cq.Next(&tag, &ok)) {
    }
  }

  std::string endpoint;
  std::string key;
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  std::unique_ptr<pb::Watch::Stub> stub;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<pb::WatchRequest, pb::WatchResponse>> rw;
  pb::WatchResponse response;
  bool started = false;
  bool readPending = false;
  bool finished = false;
  grpc::Status status;
};

EtcdWatch::EtcdWatch(std::shared_ptr<grpc::Channel> channel, std::string endpoint,
                     std::string key, std::string rangeEnd, int64_t startRevision,
                     std::chrono::milliseconds timeout)
    : stream_(std::make_unique<Stream>()),
      lastRevision_(startRevision > 0 ? startRevision - 1 : 0) {
  using Tag = Stream::Tag;
  auto& s = *stream_;
  s.endpoint = std::move(endpoint);
  s.key = key;
  s.context.AddMetadata("hasleader", "true");  // see EtcdKeepAlive
  s.stub = pb::Watch::NewStub(channel);
  s.rw = s.stub->PrepareAsyncWatch(&s.context, &s.cq);
  const auto deadline = Clock::now() + timeout;
  s.rw->StartCall(reinterpret_cast<void*>(Tag::kStart));
  s.started = true;
  auto ok = s.await(Tag::kStart, deadline);
  if (!ok) {
    s.context.TryCancel();
    s.await(Tag::kStart, Clock::now() + std::chrono::seconds(5));
    s.fail("could not start");
  }
  if (!*ok) s.fail("could not start");
  pb::WatchRequest request;
  auto* create = request.mutable_create_request();
  create->set_key(key);
  create->set_range_end(rangeEnd);
  create->set_start_revision(startRevision);
  s.rw->Write(request, reinterpret_cast<void*>(Tag::kWrite));
  ok = s.await(Tag::kWrite, deadline);
  if (!ok) {
    s.context.TryCancel();
    s.await(Tag::kWrite, Clock::now() + std::chrono::seconds(5));
    s.fail("was not accepted in time");
  }
  if (!*ok) s.fail("was not accepted");
  // etcd confirms with a response of its own (created) before any event.
  s.rw->Read(&s.response, reinterpret_cast<void*>(Tag::kRead));
  s.readPending = true;
  ok = s.await(Tag::kRead, deadline);
  if (!ok) {
    s.context.TryCancel();
    s.await(Tag::kRead, Clock::now() + std::chrono::seconds(5));
    s.readPending = false;
    s.fail("was not confirmed in time");
  }
  s.readPending = false;
  if (!*ok) s.fail("was not confirmed");
  if (!s.response.created()) s.fail("got no confirmation");
}

EtcdWatch::~EtcdWatch() = default;

void EtcdWatch::cancel() { stream_->context.TryCancel(); }

std::vector<WatchEvent> EtcdWatch::next(std::chrono::milliseconds timeout) {
  using Tag = Stream::Tag;
  auto& s = *stream_;
  // A wait "practically forever" must not overflow the clock.
  const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24));
  while (true) {
    if (s.finished) s.fail("ended");
    if (!s.readPending) {
      s.response.Clear();
      s.rw->Read(&s.response, reinterpret_cast<void*>(Tag::kRead));
      s.readPending = true;
    }
    const auto ok = s.await(Tag::kRead, deadline);
    if (!ok) return {};  // the read stays pending for the next call
    s.readPending = false;
    if (!*ok) s.fail("ended");
    if (s.response.canceled()) {
      std::string why = s.response.cancel_reason().empty() ? "cancelled by etcd"
                                                             : detail::oneLine(s.response.cancel_reason());
      if (s.response.compact_revision() > 0) {
        why += " (history compacted up to revision " +
               std::to_string(s.response.compact_revision()) + ")";
      }
      s.context.TryCancel();
      try {
        s.fail("ended");
      } catch (const Error&) {
      }
      throw Error("etcd " + s.endpoint + ": watch of " + detail::quoted(s.key) + ": " + why);
    }
    std::vector<WatchEvent> events;
    for (const auto& event : s.response.events()) {
      // Revisions only grow on one stream; the check keeps "each event once" true by design.
      if (event.kv().mod_revision() <= lastRevision_) continue;
      events.push_back({event.type() == mvccpb::Event::DELETE ? WatchEvent::Type::Delete
                                                              : WatchEvent::Type::Put,
                        detail::fromProto(event.kv())});
    }
    // A revision may hold several events (one txn): advance only after the whole batch.
    for (const auto& event : events) lastRevision_ = std::max(lastRevision_, event.kv.modRevision);
    if (!events.empty()) return events;
    if (Clock::now() >= deadline) return {};
  }
}

}  // namespace dlrun::rendezvous::etcd
