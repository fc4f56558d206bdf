// EtcdClient's lease calls: grant (now, or sent ahead as a PendingLeaseGrant), revoke and
// keep-alive.
#include "rendezvous/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include "common/clock.h"
#include "common/error.h"
#include "etcd/rpc.grpc.pb.h"
#include "rendezvous/etcd/etcd_call.h"
#include "rendezvous/etcd/etcd_client_internal.h"
#include "rendezvous/etcd/etcd_keep_alive.h"

namespace dlrun::rendezvous::etcd {

namespace pb = etcdserverpb;
using CallKind = detail::EtcdClientImpl::CallKind;

int64_t EtcdClient::leaseGrant(std::chrono::seconds ttl) {
  pb::LeaseGrantRequest request;
  request.set_ttl(ttl.count());
  const auto response = impl_->unary(
      "lease grant", {}, CallKind::Write,
      detail::stubCall(&detail::Connection::lease, &pb::Lease::Stub::LeaseGrant, request));
  if (!response.error().empty()) {
    throw Error("etcd " + endpoint() +
                ": lease grant failed: " + detail::oneLine(response.error()));
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
  // After the context: it lives in the call's arena, which the context frees.
  std::unique_ptr<grpc::ClientAsyncResponseReader<pb::LeaseGrantResponse>> reader;
  bool started = false;   // Finish() asked: a completion will come
  bool finished = false;  // its completion taken from the queue
};

PendingLeaseGrant::~PendingLeaseGrant() {
  if (!call_) return;
  if (call_->started) {
    cancel();
    take();  // at once after the cancel: a queue is drained before it goes
  }
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
  const auto picked = impl_->connection();
  auto pending = std::make_unique<PendingLeaseGrant>();
  auto& call = *(pending->call_ = std::make_unique<PendingLeaseGrant::Call>());
  call.request.set_ttl(ttl.count());
  call.context.set_deadline(detail::grpcDeadline(Clock::now() + impl_->options.timeout));
  detail::EtcdClientImpl::authorize(*picked, call.context);
  call.reader = picked->lease->PrepareAsyncLeaseGrant(&call.context, call.request, &call.queue);
  call.reader->StartCall();
  call.reader->Finish(&call.response, &call.status, &call);
  call.started = true;
  return pending;
}

void EtcdClient::leaseRevoke(int64_t lease, std::optional<std::chrono::milliseconds> timeout) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  impl_->unary("lease revoke", std::to_string(lease), CallKind::Write,
               detail::stubCall(&detail::Connection::lease, &pb::Lease::Stub::LeaseRevoke, request),
               timeout);
}

std::unique_ptr<EtcdKeepAlive> EtcdClient::keepAlive(int64_t lease,
                                                     std::chrono::milliseconds interval) {
  return std::make_unique<EtcdKeepAlive>(*this, lease, interval);
}

}  // namespace dlrun::rendezvous::etcd
