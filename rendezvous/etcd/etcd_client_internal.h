// What the files of EtcdClient share (etcd_client.cpp, etcd_client_leases.cpp), and its watches
// and keep-alives reach: the client's inside, the endpoint it picked, and the unary call that
// every call goes through; rendezvous/etcd only, not an interface.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/clock.h"
#include "rendezvous/etcd/etcd_call.h"
#include "rendezvous/etcd/etcd_client.h"

namespace dlrun::rendezvous::etcd::detail {

// EtcdClient's state: the endpoint in use, picked again after a failure, and what was sent.
struct EtcdClientImpl {
  explicit EtcdClientImpl(EtcdClientOptions options) : options(std::move(options)) {}

  // The picked endpoint, picking one if none; a pick prefers endpoints other than the one that
  // failed last (a member cut off from its cluster still connects, and would be picked again).
  // A pick waits up to connectTimeout, or `within` when that is shorter, without holding the
  // client's lock (other calls, a release on the way out, need not wait for it).
  std::shared_ptr<Connection> connection(std::optional<std::chrono::milliseconds> within = {});
  // A token for the client's user on `connection`; throws Error when etcd refuses them.
  std::string authenticate(const Connection& connection);
  // Adds the token of `connection` (if any) to a call's metadata.
  static void authorize(const Connection& connection, grpc::ClientContext& context);
  // A fresh token on `connection` (after etcd called the old one invalid).
  void reauthenticate(const std::shared_ptr<Connection>& connection);
  void dropConnection(const std::shared_ptr<Connection>& failed);
  void dropEndpoint(const std::string& failed);  // by name, for a stream that failed
  // A read changes nothing, so it may be made again; a write is never retried (it may have
  // happened).
  enum class CallKind { Read, Write };
  template <typename Call>
  auto unary(const char* what, const std::string& key, CallKind kind, Call&& call,
             std::optional<std::chrono::milliseconds> timeout = {});
  void countRequest(const char* kind);

  const EtcdClientOptions options;
  mutable std::mutex mutex;
  std::map<std::string, int64_t> requestsSent;  // under mutex
  std::shared_ptr<Connection> inUse;            // under mutex; empty: pick again
  std::string failed;  // the endpoint dropped last: picked only when no other is ready
};

// The call `unary` makes: `method` of the connection's stub `stub` (kv, lease) with `request`,
// which the returned callable refers to (it must outlive the call).
template <typename Stub, typename Request, typename Reply>
auto stubCall(std::unique_ptr<Stub> Connection::*stub,
              grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Reply*),
              const Request& request) {
  return [stub, method, &request](Connection& c, grpc::ClientContext& context) {
    Reply reply;
    auto status = ((*(c.*stub)).*method)(&context, request, &reply);
    return std::pair{status, std::move(reply)};
  };
}

// One unary call with the client's deadline. A failure that says the endpoint is gone (or too
// slow) drops it, so the next call picks again; a Read makes that next call here:
// once after a deadline, and after UNAVAILABLE again on the next endpoint for as long as
// connectTimeout (during an election members answer "leader changed", UNAVAILABLE).
template <typename Call>
auto EtcdClientImpl::unary(const char* what, const std::string& key, CallKind kind, Call&& call,
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
    if (options.endpoints.size() > 1 && picked->channel->GetState(true) != GRPC_CHANNEL_READY) {
      dropConnection(picked);
      picked = connection(timeout);
    }
    grpc::ClientContext context;
    context.set_deadline(grpcDeadline(Clock::now() + timeout.value_or(options.timeout)));
    authorize(*picked, context);
    countRequest(what);
    auto [status, response] = call(*picked, context);
    if (status.ok()) return response;
    const auto code = status.error_code();
    // A simple token expires after etcd's --auth-token-ttl without use: a new one, then again.
    if (!reauthenticated && !options.security.user.empty() &&
        status.error_message().find("invalid auth token") != std::string::npos) {
      reauthenticated = true;
      reauthenticate(picked);
      continue;
    }
    const bool endpointFailed =
        code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (endpointFailed) dropConnection(picked);
    if (endpointFailed && kind == CallKind::Read &&
        (attempt == 0 || (code == grpc::StatusCode::UNAVAILABLE &&
                          Clock::now() - start < options.connectTimeout))) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // no spin
      continue;
    }
    throwStatus(status, "etcd " + picked->name + ": " + what +
                            (key.empty() ? "" : " " + quoted(key)) + " failed");
  }
}

}  // namespace dlrun::rendezvous::etcd::detail
