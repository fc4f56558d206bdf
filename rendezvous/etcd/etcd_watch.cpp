// EtcdWatch (etcd_watch.h): key ranges watched over one Watch stream, resumed on another
// endpoint from the last revision seen.
#include "rendezvous/etcd/etcd_watch.h"

#include <algorithm>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "rendezvous/etcd/etcd_call.h"
#include "rendezvous/etcd/etcd_client_internal.h"

namespace dlrun::rendezvous::etcd {
namespace detail {
namespace {

// Why etcd cancelled a watch, as one line; a compaction names the revisions involved.
std::string cancelReason(const etcdserverpb::WatchResponse& response, int64_t lastRevision) {
  std::string why =
      response.cancel_reason().empty() ? "cancelled by etcd" : oneLine(response.cancel_reason());
  if (response.compact_revision() > 0)
    why += " (history compacted up to revision " + std::to_string(response.compact_revision()) +
           "; the watch resumes from " + std::to_string(lastRevision + 1) + ")";
  return why;
}

}  // namespace
}  // namespace detail

namespace pb = etcdserverpb;

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
  client_.impl_->countRequest("watch");
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
    std::shared_ptr<detail::Connection> picked;
    try {
      picked = client_.impl_->connection();
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
    if (picked) client_.impl_->dropConnection(picked);
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
    events.push_back(
        {event.type() == mvccpb::Event::DELETE ? WatchEvent::Type::Delete : WatchEvent::Type::Put,
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
      const std::string why =
          "etcd " + s.endpoint + ": " + what() + " ended: " + detail::statusText(status);
      if (detail::permanent(status.error_code())) throw Error(why);
      {
        std::lock_guard lock(mutex_);
        endpoint_.clear();
      }
      // Drop the failed endpoint (if the client still uses it), then resume elsewhere. A copy:
      // connect() destroys the stream that holds the name.
      const std::string failed = s.endpoint;
      client_.impl_->dropEndpoint(failed);
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
