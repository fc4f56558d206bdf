#include "store/store_proxy.h"

#include <iterator>

#include "common/error.h"
#include "common/log.h"
#include "store/store_proxy_impl.h"

namespace dlrun {
namespace detail {

void ProxyImpl::start() {
  listener_.start(
      [self = shared_from_this()](tcp::socket socket) {
        ++self->counters.clients;
        auto client = startClient(*self, std::move(socket));
        self->clients_.emplace(client.get(), client);
      },
      [](const error_code& ec) { log::warn("store proxy: accept failed: " + ec.message()); });
}

void ProxyImpl::stop() {
  listener_.stop();
  failAll("");
}

void ProxyImpl::failAll(const std::string& why) {
  if (failing_) return;
  failing_ = true;
  if (!why.empty()) log::warn("store proxy: " + why + "; closing its workers' connections");
  for (const auto& upstream : upstreams_) upstream->close();
  upstreams_.clear();
  shared_ = {};
  for (auto& pool : pool_) pool.clear();
  waits_.clear();
  adds_.clear();
  posted_.clear();
  auto clients = std::move(clients_);
  clients_.clear();
  for (auto& [raw, client] : clients) closeClient(*client);
  failing_ = false;
}

std::shared_ptr<Upstream> ProxyImpl::connect(wire::Era era) {
  ++counters.upstreamConnections;
  auto upstream = std::make_shared<Upstream>(*this, era);
  upstreams_.insert(upstream);
  upstream->start();
  return upstream;
}

std::shared_ptr<Upstream> ProxyImpl::pooled(wire::Era era) {
  auto& pool = pool_[static_cast<size_t>(era)];
  if (pool.empty()) return connect(era);
  auto upstream = std::move(pool.back());
  pool.pop_back();
  return upstream;
}

void ProxyImpl::drop(const std::shared_ptr<Upstream>& upstream) {
  upstream->close();
  upstreams_.erase(upstream);
}

void ProxyImpl::release(wire::Era era, std::shared_ptr<Upstream> upstream) {
  // Kept for the next blocking request; a burst of distinct WAITs leaves at most this many.
  constexpr size_t kKept = 64;
  auto& pool = pool_[static_cast<size_t>(era)];
  if (pool.size() < kKept && upstream->idle()) {
    pool.push_back(std::move(upstream));
  } else {
    drop(upstream);
  }
}

std::shared_ptr<Upstream>& ProxyImpl::shared(wire::Era era) {
  auto& upstream = shared_[static_cast<size_t>(era)];
  if (!upstream) upstream = connect(era);
  return upstream;
}

void ProxyImpl::forward(wire::Era era, std::string_view request, Op op, size_t keys, Take take) {
  sendPostedAdds();
  shared(era)->send(request, op, keys, std::move(take));
}

Cancel ProxyImpl::forwardBlocking(wire::Era era, std::string_view request, Op op, Take take) {
  struct Pending {
    bool canceled = false;
    std::weak_ptr<Upstream> upstream;  // once sent
  };
  auto pending = std::make_shared<Pending>();
  std::string ping;
  wire::Encoder(ping).op(era, Op::Ping).u32(0);
  forward(era, ping, Op::Ping, 0,
          [this, era, op, pending, request = std::string(request),
           take = std::move(take)](std::string_view) mutable {
            if (pending->canceled) return;
            auto upstream = pooled(era);
            pending->upstream = upstream;
            upstream->send(request, op, 0,
                           [this, era, upstream, take = std::move(take)](std::string_view reply) {
                             take(reply);
                             release(era, upstream);
                           });
          });
  return [this, pending] {
    pending->canceled = true;
    if (auto upstream = pending->upstream.lock(); upstream && !upstream->idle()) drop(upstream);
  };
}

// Groups wait with dlrun's GROUP_WAIT (wire.h), whose reply says whether a QUEUE_PUSH woke
// them: the store then wakes one waiter, so the group releases one client and waits on.
Cancel ProxyImpl::wait(wire::Era, std::string_view request, Take take, AfterNext afterNext) {
  // The keys as the request carries them (after the op byte), alike in both eras.
  std::string id(request.substr(1));
  auto [group, fresh] = waits_.try_emplace(id);
  const uint64_t member = nextMember_++;
  group->second.members.emplace(member, Member{std::move(take), std::move(afterNext)});
  if (fresh) {
    group->second.serial = member;
    group->second.request =
        std::string(1, static_cast<char>(wire::encodeOp(wire::Era::V2, Op::GroupWait))) + id;
    sendGroupWait(id);
  } else {
    ++counters.coalescedWaits;
  }
  return [this, id, member] {
    auto it = waits_.find(id);
    if (it == waits_.end() || it->second.members.erase(member) == 0) return;
    if (!it->second.members.empty()) return;
    const Cancel withdraw = std::move(it->second.withdraw);
    waits_.erase(it);
    if (withdraw) withdraw();
  };
}

void ProxyImpl::sendGroupWait(const std::string& id) {
  sendPostedAdds();
  WaitGroup& group = waits_.at(id);
  group.covered = nextMember_;
  group.withdraw =
      shared(wire::Era::V2)->sendGroupWait(group.request, [this, id](std::string_view reply) {
        groupWoken(id, reply);
      });
}

// A QUEUE_PUSH woke the group (StopWaitingOne): its first client goes on; the others wait on
// once that client's next request (its QUEUE_POP) has been answered, so they do not find the
// item it is about to take and wake for nothing. A write woke it (StopWaiting): every client
// the wake covers goes on (releaseCovered).
void ProxyImpl::groupWoken(const std::string& id, std::string_view reply) {
  auto it = waits_.find(id);
  if (it == waits_.end()) return;
  WaitGroup& group = it->second;
  group.withdraw = nullptr;  // the store's wait is over
  if (reply[0] == static_cast<char>(wire::WaitReply::StopWaitingOne) && group.members.size() > 1) {
    // A first that joined after the wait was sent may find the item taken: all ask again.
    if (group.members.begin()->first >= group.covered) return sendGroupWait(id);
    const Member first = std::move(group.members.begin()->second);
    group.members.erase(group.members.begin());
    first.take(std::string(1, static_cast<char>(wire::WaitReply::StopWaiting)));
    first.afterNext([this, id] {
      auto group = waits_.find(id);
      if (group != waits_.end() && !group->second.withdraw && !group->second.checking)
        sendGroupWait(id);
    });
    return;
  }
  releaseCovered(id);
}

// Releases the members the store's answer covers. Those that joined later may have joined
// after the keys were deleted again (the wake was on its way): the store is asked for them.
void ProxyImpl::releaseCovered(const std::string& id) {
  auto it = waits_.find(id);
  std::map<uint64_t, Member>& members = it->second.members;
  auto late = members.lower_bound(it->second.covered);
  std::map<uint64_t, Member> released(std::make_move_iterator(members.begin()),
                                      std::make_move_iterator(late));
  members.erase(members.begin(), late);
  if (members.empty())
    waits_.erase(it);
  else
    checkLate(id);
  const std::string stop(1, static_cast<char>(wire::WaitReply::StopWaiting));
  for (const auto& [number, member] : released) member.take(stop);
}

// Asks the store whether the keys exist now, for the members that joined after the last
// answer was asked for: they go on if so, else the group waits again (with them covered).
void ProxyImpl::checkLate(const std::string& id) {
  WaitGroup& group = waits_.at(id);
  group.checking = true;
  group.covered = nextMember_;
  const std::string check =
      std::string(1, static_cast<char>(wire::encodeOp(wire::Era::V2, Op::Check))) + id;
  forward(wire::Era::V2, check, Op::Check, 0,
          [this, id, serial = group.serial](std::string_view reply) {
            auto it = waits_.find(id);
            if (it == waits_.end() || it->second.serial != serial) return;  // all gave up
            it->second.checking = false;
            if (reply[0] == static_cast<char>(wire::CheckReply::Ready)) return releaseCovered(id);
            if (!it->second.withdraw) sendGroupWait(id);
          });
}

void ProxyImpl::add(wire::Era era, std::string_view key, int64_t delta, Take take) {
  std::string id = std::string(1, static_cast<char>(era)) + std::string(key);
  auto [it, fresh] = adds_.try_emplace(id);
  AddBatch& batch = it->second;
  if (fresh) {
    batch.era = era;
    batch.key = std::string(key);
  }
  batch.queued.emplace_back(delta, std::move(take));
  if (batch.inFlight) return;
  batch.inFlight = true;
  posted_.push_back(std::move(id));
  if (posted_.size() > 1) return;
  // Sent once the requests already read in this turn of the loop are in: the ADDs of clients
  // that sent theirs together (a barrier's) go up as one, at no added wait.
  asio::post(io_, [weak = weak_from_this()] {
    if (auto self = weak.lock()) self->sendPostedAdds();
  });
}

void ProxyImpl::sendPostedAdds() {
  const std::vector<std::string> ids = std::move(posted_);
  posted_.clear();
  for (const auto& id : ids) sendAdds(id);  // failAll empties posted_ with adds_
}

// Sends the queued ADDs of one key as one. The store answers their sum's result R; the i-th
// gets R less the deltas after it: the value it would have seen with the ADDs one by one.
void ProxyImpl::sendAdds(const std::string& id) {
  AddBatch& batch = adds_.at(id);
  std::vector<std::pair<int64_t, Take>> group;
  // One batch holds ADDs of one sign whose sum fits in 64 bits, so every value handed back lies
  // between the key's old value and its new one, as one ADD at a time would give them. The rest
  // go in the next batch.
  const bool down = batch.queued.front().first < 0;
  int64_t sum = 0;
  size_t taken = 0;
  for (; taken < batch.queued.size(); ++taken) {
    const int64_t delta = batch.queued[taken].first;
    int64_t next = delta;
    if (taken > 0 && ((delta < 0) != down || __builtin_add_overflow(sum, delta, &next))) break;
    sum = next;
  }
  group.assign(std::make_move_iterator(batch.queued.begin()),
               std::make_move_iterator(batch.queued.begin() + static_cast<ptrdiff_t>(taken)));
  batch.queued.erase(batch.queued.begin(), batch.queued.begin() + static_cast<ptrdiff_t>(taken));
  batch.inFlight = true;
  counters.coalescedAdds += taken - 1;
  std::string request;
  wire::Encoder(request).op(batch.era, Op::Add).bytes(batch.key).i64(sum);
  forward(batch.era, request, Op::Add, 1,
          [this, id, sum, group = std::move(group)](std::string_view reply) {
            int64_t value = static_cast<int64_t>(wire::loadU64(reply.data())) - sum;
            for (const auto& [delta, take] : group) {
              std::string bytes;
              wire::Encoder(bytes).i64(value += delta);
              take(bytes);
            }
            auto it = adds_.find(id);
            if (it == adds_.end()) return;
            it->second.inFlight = false;
            if (it->second.queued.empty()) {
              adds_.erase(it);
            } else {
              sendAdds(id);
            }
          });
}

}  // namespace detail

StoreProxy::StoreProxy(boost::asio::io_context& io, StoreProxyOptions options)
    : impl_(std::make_shared<detail::ProxyImpl>(io, std::move(options))) {
  impl_->start();
}

StoreProxy::~StoreProxy() { impl_->stop(); }

uint16_t StoreProxy::port() const { return impl_->port(); }

void StoreProxy::stop() { impl_->stop(); }

StoreProxyStats StoreProxy::stats() const {
  const auto& c = impl_->counters;
  return {.clients = c.clients.load(),
          .requests = c.requests.load(),
          .upstreamRequests = c.upstreamRequests.load(),
          .upstreamConnections = c.upstreamConnections.load(),
          .coalescedWaits = c.coalescedWaits.load(),
          .coalescedAdds = c.coalescedAdds.load()};
}

}  // namespace dlrun
