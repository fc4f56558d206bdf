// EtcdKeepAlive (etcd_keep_alive.h): one lease renewed over a LeaseKeepAlive stream, on a thread.
#include "rendezvous/etcd/etcd_keep_alive.h"

#include <algorithm>

#include "common/error.h"
#include "rendezvous/etcd/etcd_call.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_client_internal.h"

namespace dlrun::rendezvous::etcd {

namespace pb = etcdserverpb;

struct EtcdKeepAlive::Stream
    : detail::AsyncStream<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse> {
  std::unique_ptr<pb::Lease::Stub> stub;
};

EtcdKeepAlive::EtcdKeepAlive(EtcdClient& client, int64_t lease, std::chrono::milliseconds interval)
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
    const auto patience =
        std::max<std::chrono::milliseconds>(ttl + kElectionGrace, client_.options().outageTimeout);
    if (Clock::now() >= lastAck + patience) {
      fail("nothing acknowledged for " + detail::seconds(patience) + ": " + why);
      return;
    }
    std::shared_ptr<detail::Connection> picked;
    try {
      // Short picks, so a stop() (an agent on its way out, etcd gone) never waits long on one.
      picked =
          client_.impl_->connection(std::min<std::chrono::milliseconds>(interval_, kPickSlice));
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
    client_.impl_->dropConnection(picked);  // the client's calls move on too
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
  const auto renewTimeout = std::min<std::chrono::milliseconds>(
      client_.options().timeout,
      std::max<std::chrono::milliseconds>(interval_, std::chrono::seconds(1)));
  if (!stream->start(Clock::now() + renewTimeout))
    return "the stream did not start: " + detail::statusText(stream->finish());
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

}  // namespace dlrun::rendezvous::etcd
