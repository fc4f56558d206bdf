// What the etcd client, its keep-alives and its watches share (rendezvous/etcd only, not an
// interface): gRPC's deadlines and failures in dlrun's terms, the client's connection to one
// endpoint, and a bidirectional stream driven through a completion queue of its own.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/clock.h"
#include "etcd/rpc.grpc.pb.h"
#include "rendezvous/etcd/etcd_client.h"

namespace dlrun::rendezvous::etcd {

namespace detail {

// The client's connection to one endpoint: its channel and stubs, and the auth token there.
struct Connection {
  std::string name;  // the endpoint, as messages name it
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  mutable std::mutex tokenMutex;
  std::string token;  // etcd's auth token on this endpoint; empty without a user
  std::string currentToken() const {
    std::lock_guard lock(tokenMutex);
    return token;
  }
};

// gRPC takes deadlines on the system clock; every deadline here is a duration from now, so a
// wall-clock step between the two reads is the only exposure.
std::chrono::system_clock::time_point grpcDeadline(Clock::time_point deadline);
std::string seconds(std::chrono::milliseconds duration);  // "3 s", "250 ms"
// One line: gRPC's messages may carry newlines (a resolver's report, a proxy's page).
std::string oneLine(std::string text);
std::string statusText(const grpc::Status& status);  // "UNAVAILABLE: why"
// Throws the error of the dlrun tree that fits a failed call: a deadline is a TimeoutError, an
// unreachable or leaderless endpoint a NetworkError, anything else (a refusal by etcd) an Error.
[[noreturn]] void throwStatus(const grpc::Status& status, const std::string& message);
KeyValue fromProto(const mvccpb::KeyValue& kv);
std::string quoted(const std::string& key);  // 'key', on one line
// Codes that say the request itself is refused: another endpoint would refuse it too.
bool permanent(grpc::StatusCode code);

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

}  // namespace detail
}  // namespace dlrun::rendezvous::etcd
