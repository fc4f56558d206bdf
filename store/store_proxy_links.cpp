// The store proxy's connections: Upstream, one to the store, and Client, a worker's.
#include "common/error.h"
#include "common/log.h"
#include "store/store_proxy_impl.h"

namespace dlrun::detail {

// One worker's connection: its requests parsed as the store parses them, its replies sent in
// the order of its requests whatever order they come back in.
class Client : public std::enable_shared_from_this<Client> {
 public:
  Client(ProxyImpl& proxy, tcp::socket socket) : proxy_(proxy), socket_(std::move(socket)) {}

  void start() {
    error_code ec;
    socket_.non_blocking(true, ec);
    socket_.set_option(tcp::no_delay(true), ec);
    awaitReadable();
  }

  void close(const std::string& why) {
    if (closed_) return;
    closed_ = true;
    withdrawWaits();
    resume(UINT64_MAX);
    if (!why.empty()) log::warn("store proxy: closing a worker's connection: " + why);
    error_code ec;
    socket_.close(ec);
    proxy_.forget(this);
  }

 private:
  // A reply to come. An immediate op's are sent in the order of the requests; a blocking
  // op's (WAIT, BARRIER: `deferred`) whenever it comes, as the store sends it when it wakes the
  // waiter, but never before the replies of earlier immediate ops.
  struct Slot {
    std::optional<std::string> reply;
    bool deferred = false;
    Cancel cancel;  // a deferred one's, until it is answered
  };

  void awaitReadable() {
    socket_.async_wait(tcp::socket::wait_read,
                       [self = shared_from_this()](const error_code& ec) { self->onReadable(ec); });
  }

  void onReadable(const error_code& waitError) {
    if (closed_) return;
    if (waitError) return close("");
    const std::span<char> scratch = proxy_.scratch();
    error_code ec;
    const size_t n = socket_.read_some(asio::buffer(scratch.data(), scratch.size()), ec);
    if (ec == asio::error::would_block || ec == asio::error::try_again) return awaitReadable();
    if (ec) return close(ec == asio::error::eof ? "" : ec.message());
    in_.append(scratch.data(), n);
    if (!process()) return;
    if (in_.size() > proxy_.limits().maxBufferedBytes) return close("too much buffered");
    awaitReadable();
  }

  // Runs every complete request in in_. False when the connection was closed.
  bool process() {
    size_t pos = 0;
    while (pos < in_.size()) {
      const std::span<const char> data(in_.data() + pos, in_.size() - pos);
      if (!era_ && !(era_ = wire::detectEra(data))) break;
      const auto result = wire::parseRequest(*era_, data, proxy_.limits(), request_);
      if (result.status == wire::ParseStatus::Incomplete) break;
      if (result.status == wire::ParseStatus::Invalid) {
        close(result.error);
        return false;
      }
      ++proxy_.counters.requests;
      if (!handle(std::string_view(data.data(), result.consumed))) return false;
      pos += result.consumed;
    }
    in_.erase(0, pos);
    return true;
  }

  // One request; `raw` is its bytes, forwarded as they came where nothing is coalesced.
  bool handle(std::string_view raw) {
    const wire::Request& r = request_;
    const wire::Era era = *era_;
    switch (r.op) {
      case Op::Validate:  // the proxy's own connections validate themselves
        return true;
      case Op::Lease:
      case Op::WatchKey:
      case Op::GroupWait:  // a proxy's upstream is the store itself, not another proxy
      case Op::GroupCancel:
      case Op::SpaceOpen:  // the agent opens its workers' space itself
      case Op::SpaceClose:
        close(std::string(wire::opName(r.op)) + " is not forwarded to the store");
        return false;
      case Op::Ping: {  // the proxy is the server this client reaches: it answers itself
        std::string echo;
        wire::Encoder(echo).u32(r.word);
        fill(newSlot(false), echo);
        return true;
      }
      case Op::CancelWait:
        withdrawWaits();
        fill(newSlot(false), std::string(1, static_cast<char>(wire::WaitReply::WaitCanceled)));
        return true;
      case Op::Wait: {
        const uint64_t slot = newSlot(true);
        resume(slot);  // a group held back for this request would otherwise wait on it forever
        slots_[slot].cancel = proxy_.wait(era, raw, filler(slot), afterNext());
        return true;
      }
      case Op::Add: proxy_.add(era, r.keys[0], r.number, filler(newSlot(false))); return true;
      case Op::Barrier: {
        const uint64_t slot = newSlot(true);
        resume(slot);
        slots_[slot].cancel = proxy_.forwardBlocking(era, raw, r.op, filler(slot));
        return true;
      }
      default: break;
    }
    // Nothing of a reply yet: an op without one is known by its size 0.
    const auto size = wire::replySize(r.op, r.keys.size(), {}, proxy_.limits());
    const bool replies = !size || *size > 0;
    proxy_.forward(era, raw, r.op, r.keys.size(), replies ? filler(newSlot(false)) : Take());
    return true;
  }

  AfterNext afterNext() {
    return [self = weak_from_this()](std::function<void()> then) {
      auto client = self.lock();
      if (!client || client->closed_) return then();
      client->resumes_.emplace_back(client->nextSlot_, std::move(then));
    };
  }

  // Runs what waited for a reply to slot `filled` or an earlier one (all: the connection went).
  void resume(uint64_t filled) {
    std::vector<std::function<void()>> due;
    std::erase_if(resumes_, [&](auto& entry) {
      if (entry.first > filled) return false;
      due.push_back(std::move(entry.second));
      return true;
    });
    for (auto& then : due) then();
  }

  uint64_t newSlot(bool deferred) {
    slots_.emplace(nextSlot_, Slot{.deferred = deferred});
    return nextSlot_++;
  }

  // The WAITs and BARRIERs still waiting are given up (CANCEL_WAIT, or the connection went).
  void withdrawWaits() {
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (!it->second.deferred || it->second.reply) {
        ++it;
        continue;
      }
      if (it->second.cancel) it->second.cancel();
      it = slots_.erase(it);
    }
  }

  Take filler(uint64_t slot) {
    return [self = weak_from_this(), slot](std::string_view reply) {
      if (auto client = self.lock()) client->fill(slot, reply);
    };
  }

  // The reply of request `slot`; sends every reply now due.
  void fill(uint64_t slot, std::string_view reply) {
    auto at = slots_.find(slot);
    if (closed_ || at == slots_.end() || at->second.reply) return;
    at->second.reply = std::string(reply);
    at->second.cancel = nullptr;
    resume(slot);
    bool blocked = false;  // an earlier immediate op's reply is still to come
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (it->second.reply && !blocked) {
        outbox_.queued() += *it->second.reply;
        it = slots_.erase(it);
        continue;
      }
      if (!it->second.reply && !it->second.deferred) blocked = true;
      ++it;
    }
    flush();
  }

  void flush() {
    if (closed_) return;
    outbox_.write(socket_, [self = shared_from_this()](const error_code& ec) {
      if (ec) return self->close("");
      self->flush();
    });
  }

  ProxyImpl& proxy_;
  tcp::socket socket_;
  std::optional<wire::Era> era_;
  wire::Request request_;
  std::string in_;
  Outbox outbox_;
  std::map<uint64_t, Slot> slots_;  // by request number
  uint64_t nextSlot_ = 0;
  // GROUP_WAIT groups waiting for this client's next reply (AfterNext): the first slot whose
  // reply lets each go on.
  std::vector<std::pair<uint64_t, std::function<void()>>> resumes_;
  bool closed_ = false;
};

std::shared_ptr<Client> startClient(ProxyImpl& proxy, tcp::socket socket) {
  auto client = std::make_shared<Client>(proxy, std::move(socket));
  client->start();
  return client;
}

void closeClient(Client& client) { client.close(""); }

Upstream::Upstream(ProxyImpl& proxy, wire::Era era)
    : proxy_(proxy), socket_(proxy.io()), era_(era) {}

void Upstream::start() {
  if (era_ == wire::Era::V2)
    wire::Encoder(outbox_.queued()).op(era_, Op::Validate).u32(wire::kValidationMagic);
  // Where this fails, async_connect opens the socket itself and reports the same failure.
  [[maybe_unused]] const error_code opened = openCloseOnExec(socket_, proxy_.upstream().protocol());
  socket_.async_connect(proxy_.upstream(), [self = shared_from_this()](const error_code& ec) {
    if (self->closed_) return;
    if (ec) return self->fail("cannot connect to the store: " + ec.message());
    error_code ignored;
    self->socket_.set_option(tcp::no_delay(true), ignored);
    self->connected_ = true;
    self->read();
    self->flush();
  });
}

void Upstream::send(std::string_view request, Op op, size_t keys, Take take) {
  if (closed_) return;
  ++proxy_.counters.upstreamRequests;
  outbox_.queued().append(request);
  if (take) expected_.push_back({op, keys, std::move(take), framed_});
  flush();
}

Cancel Upstream::sendGroupWait(std::string_view request, Take take) {
  if (closed_) return [] {};
  ++proxy_.counters.upstreamRequests;
  framed_ = true;
  const uint64_t number = groupsSent_++;
  groups_.emplace(number, std::move(take));
  outbox_.queued().append(request);
  flush();
  return [weak = weak_from_this(), number] {
    auto self = weak.lock();
    if (!self || self->closed_ || self->groups_.erase(number) == 0) return;
    ++self->proxy_.counters.upstreamRequests;
    wire::Encoder(self->outbox_.queued()).op(wire::Era::V2, Op::GroupCancel).u64(number);
    self->flush();
  };
}

void Upstream::flush() {
  if (!connected_ || closed_) return;
  outbox_.write(socket_, [self = shared_from_this()](const error_code& ec) {
    if (self->closed_) return;
    if (ec) return self->fail("the store's connection failed: " + ec.message());
    self->flush();
  });
}

void Upstream::read() {
  socket_.async_read_some(
      asio::buffer(buffer_),
      [self = shared_from_this()](const error_code& ec, size_t n) { self->onRead(ec, n); });
}

void Upstream::onRead(const error_code& ec, size_t n) {
  if (closed_) return;
  if (ec) return fail(ec == asio::error::eof ? "the store closed its connection" : ec.message());
  in_.append(buffer_.data(), n);
  size_t pos = 0;
  try {
    while (pos < in_.size()) {
      const auto size = takeReply(std::span<const char>(in_.data() + pos, in_.size() - pos));
      if (closed_) return;  // the taker failed everything
      if (!size) break;
      pos += *size;
    }
  } catch (const ProtocolError& e) {
    return fail(std::string("the store's reply is malformed: ") + e.what());
  }
  in_.erase(0, pos);
  read();
}

std::optional<size_t> Upstream::takeReply(std::span<const char> data) {
  const bool framed = expected_.empty() ? framed_ : expected_.front().framed;
  size_t header = 0;
  if (framed) {
    if (data.empty()) return std::nullopt;
    if (data[0] == static_cast<char>(wire::FramedReply::GroupWait)) {
      constexpr size_t kSize = 1 + 8 + 1;
      if (data.size() < kSize) return std::nullopt;
      const uint64_t number = wire::loadU64(data.data() + 1);
      auto group = groups_.find(number);
      if (group == groups_.end()) {
        if (number >= groupsSent_) throw ProtocolError("a wake for a GROUP_WAIT never sent");
        return kSize;  // withdrawn meanwhile
      }
      const Take take = std::move(group->second);
      groups_.erase(group);
      take(std::string_view(data.data() + 9, 1));
      return kSize;
    }
    if (data[0] != static_cast<char>(wire::FramedReply::InOrder))
      throw ProtocolError("a framed reply of kind " + std::to_string(uint8_t(data[0])));
    header = 1;
  }
  if (expected_.empty()) throw ProtocolError("a reply nobody asked for");
  const auto size = wire::replySize(expected_.front().op, expected_.front().keys,
                                    data.subspan(header), proxy_.limits());
  if (!size) return std::nullopt;
  Expected done = std::move(expected_.front());
  expected_.pop_front();
  done.take(std::string_view(data.data() + header, *size));
  return header + *size;
}

void Upstream::fail(const std::string& why) {
  if (closed_) return;
  proxy_.failAll(why);
}

void Upstream::close() {
  if (closed_) return;
  closed_ = true;
  expected_.clear();
  error_code ec;
  socket_.close(ec);
}

}  // namespace dlrun::detail
