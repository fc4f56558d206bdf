// What the files of EtcdClient share (etcd_client.cpp, etcd_client_leases.cpp): the unary
// call that the calls of both go through; rendezvous/etcd only, not an interface.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "common/clock.h"
#include "rendezvous/etcd/etcd_call.h"
#include "rendezvous/etcd/etcd_client.h"

namespace dlrun::rendezvous::etcd {

// One unary call with the client's deadline. A failure that says the endpoint is gone (or too
// slow) drops it, so the next call picks again; a Read makes that next call here:
// once after a deadline, and after UNAVAILABLE again on the next endpoint for as long as
// connectTimeout (during an election members answer "leader changed", UNAVAILABLE).
template <typename Call>
auto EtcdClient::unary(const char* what, const std::string& key, CallKind kind, Call&& call,
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
    countRequest(what);
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
    const bool endpointFailed =
        code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (endpointFailed) dropConnection(picked);
    if (endpointFailed && kind == CallKind::Read &&
        (attempt == 0 || (code == grpc::StatusCode::UNAVAILABLE &&
                          Clock::now() - start < options_.connectTimeout))) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // no spin
      continue;
    }
    detail::throwStatus(status, "etcd " + picked->name + ": " + what +
                                    (key.empty() ? "" : " " + detail::quoted(key)) + " failed");
  }
}

}  // namespace dlrun::rendezvous::etcd
