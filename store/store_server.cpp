// Exception safety: nothing here throws once the server is listening. Handlers take error
// codes; a client that breaks the protocol or a limit is logged once and disconnected, and the
// server and every other client carry on. Only the constructor throws (it cannot bind).
//
// Each session waits for readability, reads what is there into the server's scratch buffer,
// runs every complete request through its engine, and flushes the replies with a non-blocking
// write; only what the kernel does not take at once goes through async_write.
//
// Spaces (wire.h's SPACE_OPEN): an attempt's key space is a listener of its own on the store's
// address, port 0, with an engine of its own; its sessions reach that engine alone, so nothing
// an attempt's workers write is seen by another attempt's, and closing the space (its listener,
// its sessions, its engine) frees every key at once. HTTP/2 goes to the foreign server there
// too: the control plane answers wherever the workers find the store.
#include "store/store_server.h"

#include <sys/socket.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "common/asio.h"

#include "common/error.h"
#include "common/host_port.h"
#include "common/listen.h"
#include "common/log.h"
#include "store/store_engine.h"

namespace dlrun {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace detail {

class Session;

// One attempt's key space (wire.h, SPACE_OPEN): the group's newest attempt.
struct Space {
  Space(tcp::acceptor acceptor, int64_t attempt)
      : attempt(attempt), listener(std::move(acceptor)) {}
  int64_t attempt;
  Listener listener;
  StoreEngine engine;
  std::unordered_set<Session*> sessions;
  bool closing = false;  // SPACE_CLOSE came: it goes with its last connection
};

// A count with one writer, the io_context's thread: a relaxed load and store (a plain increment
// on x86), no locked read-modify-write on the request path; readable from any thread.
class Counter {
 public:
  void bump() { add(1); }
  void add(uint64_t n) {
    value_.store(value_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  void set(uint64_t n) { value_.store(n, std::memory_order_relaxed); }
  uint64_t read() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class ServerImpl : public std::enable_shared_from_this<ServerImpl> {
 public:
  ServerImpl(asio::io_context& io, StoreServerOptions options)
      : io_(io), options_(std::move(options)), listener_(listen(io, options_)), leaseTimer_(io) {}

  static tcp::acceptor listen(asio::io_context& io, const StoreServerOptions& options);
  void accept();
  bool admits(tcp::socket& socket);
  void stop();
  void forget(Session* session);
  void armLeaseTimer();
  // SPACE_OPEN and SPACE_CLOSE (wire.h): the group's space's port, 0 for an older attempt or
  // a closing space; a space that closes at once (its connections cut), or once its last
  // connection has gone.
  uint16_t openSpace(std::string_view group, int64_t attempt);
  void closeSpace(std::string_view group);
  void closeSpaceWhenIdle(std::string_view group);
  void leftSpace(Space& space);  // one of its sessions closed
  void acceptInto(Space& space);
  void admit(tcp::socket socket, StoreEngine& engine, Space* space);
  // Keys and waiters of every engine, as of the last request served.
  void noteCounts();

  asio::io_context& io() { return io_; }
  const wire::Limits& limits() const { return options_.limits; }
  std::span<char> scratch() { return {scratch_.get(), kScratchSize}; }

  asio::io_context& io_;
  StoreServerOptions options_;
  Listener listener_;
  asio::steady_timer leaseTimer_;
  std::optional<StoreEngine::TimePoint> leaseTimerAt_;  // when the armed lease timer fires
  StoreEngine engine_;
  std::map<std::string, std::unique_ptr<Space>, std::less<>> spaces_;  // by group
  std::unordered_map<Session*, std::shared_ptr<Session>> sessions_;
  std::atomic<size_t> connectionCount_{0};
  Counter accepted_;
  Counter foreign_;
  Counter refused_;
  Counter rejected_;
  // Addresses already logged as rejected: bounded, so a scan from many addresses costs a
  // fixed amount of memory and log (past the bound they are counted, not logged).
  std::set<IpBytes> loggedRejections_;
  static constexpr size_t kMaxLoggedRejections = 1024;
  Counter bytesIn_;
  Counter bytesOut_;
  Counter keys_;     // gauges, as of the last request served
  Counter waiters_;
  Counter spacesOpen_;
  std::array<Counter, wire::kOpCount> ops_;
  // Left uninitialised: its pages are touched only as large reads come (a store that serves
  // small requests never faults most of them in; zeroed, all 64 pages were, at every start).
  static constexpr size_t kScratchSize = 256 * 1024;
  std::unique_ptr<char[]> scratch_{new char[kScratchSize]};
};

class Session : public Peer, public std::enable_shared_from_this<Session> {
 public:
  // `space`: the attempt's space this connection reached through its port; null for the
  // store's own port.
  Session(ServerImpl& server, tcp::socket socket, StoreEngine& engine, Space* space)
      : server_(server),
        engine_(engine),
        space_(space),
        socket_(std::move(socket)),
        sniff_(bool(server.options_.foreign)) {}

  void start() {
    if (log::verbose()) log::debug("connection from " + peerName());
    error_code ec;
    socket_.non_blocking(true, ec);
    socket_.set_option(tcp::no_delay(true), ec);
    awaitReadable();
  }

  void send(std::string_view bytes) override {
    if (closed_) return;
    out_.append(bytes);
    if (!batching_) flush();
  }

  // Ends the session; `reason` (when not empty) is logged as the one line about this client.
  void close(const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    if (!reason.empty()) {
      log::warn("disconnecting " + peerName() + ": " + reason);
    } else if (log::verbose()) {
      log::debug("connection from " + peerName() + " closed");
    }
    engine_.disconnect(*this);
    error_code ec;
    socket_.close(ec);
    server_.forget(this);
    if (space_) {
      space_->sessions.erase(this);
      server_.leftSpace(*space_);  // may end the space: the last use of space_
    }
  }

 private:
  // A client that broke the protocol or a limit: counted, then closed.
  void refuse(const std::string& reason) {
    server_.refused_.bump();
    close(reason);
  }

  // Looked up only when a line is logged: a getpeername per connection costs the barrier.
  std::string peerName() const {
    error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    return ec ? "a client" : joinHostPort(remote.address().to_string(), remote.port());
  }

  // async_read_some and async_receive try at once and leave the epoll registration alone when
  // they must wait; async_wait re-arms it (an epoll_ctl) every time: a third of a barrier
  // connection's system calls.
  void awaitReadable() {
    auto self = shared_from_this();
    if (sniff_) {  // peek at the first byte: HTTP/2's preface goes to another server unread
      socket_.async_receive(asio::buffer(first_, 1), tcp::socket::message_peek,
                            [self](const error_code& ec, size_t n) { self->onPeeked(ec, n); });
      return;
    }
    socket_.async_read_some(asio::buffer(first_), [self](const error_code& ec, size_t n) {
      self->onRead(ec, n);
    });
  }

  void onPeeked(const error_code& ec, size_t n) {
    if (closed_) return;
    if (ec || n == 0) return close("");
    sniff_ = false;
    if (first_[0] == 'P') return handOver();
    awaitReadable();
  }

  void onRead(const error_code& readError, size_t n) {
    if (closed_) return;
    if (readError) return close(readError == asio::error::eof ? "" : readError.message());
    // Most requests fit first_; a full one may have more behind it, read now into the scratch.
    const std::span<char> scratch = server_.scratch();
    std::memcpy(scratch.data(), first_, n);
    if (n == sizeof(first_)) {
      error_code ec;
      n += socket_.read_some(asio::buffer(scratch.data() + n, scratch.size() - n), ec);
      // Would-block: nothing more yet. End of stream: the next read says so.
      if (ec && ec != asio::error::would_block && ec != asio::error::try_again &&
          ec != asio::error::eof)
        return close(ec.message());
    }
    server_.bytesIn_.add(n);

    // Parse straight from the scratch buffer unless an earlier read left a partial request.
    std::span<const char> data(scratch.data(), n);
    if (!in_.empty()) {
      in_.append(scratch.data(), n);
      data = std::span<const char>(in_.data(), in_.size());
    }
    if (data.size() >= needed_ && !process(data)) return;
    server_.noteCounts();
    server_.armLeaseTimer();
    if (in_.size() + out_.size() > server_.limits().maxBufferedBytes) return refuse(overLimit());
    flush();
    if (!closed_) awaitReadable();
  }

  // The connection opened with HTTP/2: it goes to StoreServerOptions::foreign, its preface
  // unread (peeked), so the other server reads all of it itself.
  void handOver() {
    error_code ec;
    const int fd = socket_.release(ec);
    if (ec) return close(ec.message());
    closed_ = true;  // the engine never saw this peer, so there is nothing to disconnect
    server_.foreign_.bump();
    server_.forget(this);
    server_.options_.foreign(fd);
  }

  // Runs every complete request in `data`; keeps the tail of an incomplete one in in_.
  // Returns false when the session was closed.
  bool process(std::span<const char> data) {
    size_t pos = 0;
    const auto now = std::chrono::steady_clock::now();
    batching_ = true;
    while (pos < data.size()) {
      if (!era_) {
        era_ = wire::detectEra(data.subspan(pos));
        if (!era_) break;
      }
      auto result = wire::parseRequest(*era_, data.subspan(pos), server_.limits(), request_);
      if (result.status == wire::ParseStatus::Incomplete) {
        needed_ = result.needed;
        break;
      }
      if (result.status == wire::ParseStatus::Invalid) {
        refuse(result.error);
        return false;
      }
      server_.ops_[static_cast<size_t>(request_.op)].bump();
      if (auto refused = handle(now); !refused.empty()) {
        refuse(refused);
        return false;
      }
      pos += result.consumed;
      needed_ = 0;
      if (out_.size() > server_.limits().maxBufferedBytes) {
        refuse(overLimit());
        return false;
      }
    }
    batching_ = false;
    const bool fromCarry = !in_.empty();
    if (fromCarry) {
      in_.erase(0, pos);
    } else {
      in_.assign(data.data() + pos, data.size() - pos);
    }
    if (in_.empty()) in_.shrink_to_fit();  // a finished large request gives its memory back
    return true;
  }

  // The server's own ops, then the engine's. A space serves no leases (their one timer is the
  // store's) and opens no spaces.
  std::string handle(std::chrono::steady_clock::time_point now) {
    const wire::Op op = request_.op;
    const bool serverOp = op == wire::Op::SpaceOpen || op == wire::Op::SpaceClose;
    if (space_ && (serverOp || op == wire::Op::Lease))
      return std::string(wire::opName(op)) + " on an attempt's port";
    if (!serverOp) return engine_.handle(*this, request_, now);
    std::string out;
    if (op == wire::Op::SpaceOpen) {
      wire::Encoder(out).u64(server_.openSpace(request_.keys[0], request_.number));
    } else {
      server_.closeSpaceWhenIdle(request_.keys[0]);
      wire::Encoder(out).u8(0);
    }
    send(out);
    return {};
  }

  std::string overLimit() const {
    return "more than " + std::to_string(server_.limits().maxBufferedBytes) +
           " bytes buffered for this connection (unread replies or an oversized request)";
  }

  void flush() {
    if (writing_ || out_.empty() || closed_) return;
    error_code ec;
    const size_t n = socket_.write_some(asio::buffer(out_), ec);
    if (ec && ec != asio::error::would_block && ec != asio::error::try_again) {
      // Close later: send() may run inside another session's request handling.
      asio::post(server_.io(), [self = shared_from_this()] { self->close(""); });
      return;
    }
    out_.erase(0, n);
    server_.bytesOut_.add(n);
    if (out_.empty()) return;
    writing_ = true;
    sending_.swap(out_);
    asio::async_write(socket_, asio::buffer(sending_),
                      [self = shared_from_this()](const error_code& e, size_t n) {
                        self->server_.bytesOut_.add(n);
                        self->writing_ = false;
                        self->sending_.clear();
                        if (e) return self->close("");
                        self->flush();
                      });
  }

  ServerImpl& server_;
  StoreEngine& engine_;
  Space* space_;
  tcp::socket socket_;
  std::optional<wire::Era> era_;
  wire::Request request_;  // reused across requests to keep its vectors' capacity
  std::string in_;         // bytes of an incomplete request
  size_t needed_ = 0;      // in_ must reach this size before parsing again
  std::string out_;        // replies not yet handed to the kernel
  std::string sending_;    // replies owned by the async_write in flight
  bool writing_ = false;
  bool batching_ = false;
  bool closed_ = false;
  bool sniff_;  // the first read is still to come and StoreServerOptions::foreign is set
  char first_[128];  // each read's first bytes: most requests whole
};

tcp::acceptor ServerImpl::listen(asio::io_context& io, const StoreServerOptions& options) {
  error_code ec;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(options.host, std::to_string(options.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty())
    throw NetworkError("cannot resolve listen address '" + options.host + "': " + ec.message());
  return listenOn(io, endpoints.begin()->endpoint(),
                  joinHostPort(options.host, options.port), options.backlog);
}

void ServerImpl::accept() {
  listener_.start(
      [self = shared_from_this()](tcp::socket socket) {
        self->admit(std::move(socket), self->engine_, nullptr);
      },
      [](const error_code& ec) { log::warn("accept failed: " + ec.message()); });
}

void ServerImpl::admit(tcp::socket socket, StoreEngine& engine, Space* space) {
  if (!admits(socket)) return;
  auto session = std::make_shared<Session>(*this, std::move(socket), engine, space);
  sessions_.emplace(session.get(), session);
  if (space) space->sessions.insert(session.get());
  connectionCount_.store(sessions_.size());
  accepted_.bump();
  session->start();
}

// The space's listener stops before its Space goes (closeSpace), so the Space outlives every
// handler that reaches it.
void ServerImpl::acceptInto(Space& space) {
  space.listener.start(
      [self = shared_from_this(), &space](tcp::socket socket) {
        self->admit(std::move(socket), space.engine, &space);
      },
      [](const error_code& ec) { log::warn("accept failed: " + ec.message()); });
}

uint16_t ServerImpl::openSpace(std::string_view group, int64_t attempt) {
  auto it = spaces_.find(group);
  if (it != spaces_.end()) {
    if (attempt < it->second->attempt) return 0;
    if (attempt == it->second->attempt)
      return it->second->closing ? 0 : it->second->listener.local().port();
    closeSpace(group);
  }
  const tcp::endpoint at(listener_.local().address(), 0);
  tcp::acceptor acceptor(io_);
  if (const error_code failed = openListener(acceptor, at, options_.backlog)) {
    log::warn("store: cannot open a port for attempt " + std::to_string(attempt) + " of '" +
              std::string(group) + "': " + failed.message());
    return 0;
  }
  auto& space = *spaces_.emplace(std::string(group), std::make_unique<Space>(
                                                         std::move(acceptor), attempt))
                     .first->second;
  spacesOpen_.set(spaces_.size());
  acceptInto(space);
  return space.listener.local().port();
}

void ServerImpl::closeSpace(std::string_view group) {
  auto it = spaces_.find(group);
  if (it == spaces_.end()) return;
  Space& space = *it->second;
  space.closing = true;
  space.listener.stop();
  const std::vector<Session*> open(space.sessions.begin(), space.sessions.end());
  for (Session* session : open) session->close("");  // the last one erases the space
  if (open.empty()) leftSpace(space);
}

// The job is over, but another node's workers may still be stopping (and writing): the space
// takes no new connection and goes with the last one open.
void ServerImpl::closeSpaceWhenIdle(std::string_view group) {
  auto it = spaces_.find(group);
  if (it == spaces_.end()) return;
  it->second->closing = true;
  it->second->listener.stop();
  if (it->second->sessions.empty()) leftSpace(*it->second);
}

void ServerImpl::leftSpace(Space& space) {
  if (!space.closing || !space.sessions.empty()) return;
  std::erase_if(spaces_, [&](const auto& entry) { return entry.second.get() == &space; });
  spacesOpen_.set(spaces_.size());
  noteCounts();
}

void ServerImpl::noteCounts() {
  size_t keys = engine_.keyCount(), waiters = engine_.waiterCount();
  for (const auto& [group, space] : spaces_) {
    keys += space->engine.keyCount();
    waiters += space->engine.waiterCount();
  }
  keys_.set(keys);
  waiters_.set(waiters);
}

// Closes a peer the rule does not admit, unread. The peer's address is looked up only when
// there is a rule: a getpeername per connection costs a barrier of thousands of clients.
bool ServerImpl::admits(tcp::socket& socket) {
  if (options_.admission.empty()) return true;
  error_code ec;
  const auto peer = socket.remote_endpoint(ec).address();
  if (ec) return false;  // gone already; the socket closes as it goes out of scope
  const auto v6 = peer.is_v4() ? asio::ip::make_address_v6(asio::ip::v4_mapped, peer.to_v4())
                               : peer.to_v6();
  const IpBytes bytes = v6.to_bytes();
  if (options_.admission.allows(bytes)) return true;
  socket.close(ec);
  if (loggedRejections_.size() < kMaxLoggedRejections && loggedRejections_.insert(bytes).second) {
    const std::string shown = v6.is_v4_mapped()
                                  ? asio::ip::make_address_v4(asio::ip::v4_mapped, v6).to_string()
                                  : v6.to_string();
    const std::string& flag = options_.admission.flag();
    log::warn("store: refused a connection from " + shown + " (not in the job's hosts" +
              (flag.empty() ? "" : " or " + flag) + ")");
  }
  rejected_.bump();  // after the line, so whoever sees the count can find the line too
  return false;
}

void ServerImpl::forget(Session* session) {
  sessions_.erase(session);
  connectionCount_.store(sessions_.size());
}

// One timer serves every lease, armed at the earliest deadline. Renewals only move deadlines
// later, so the timer is re-armed only for a deadline earlier than the armed one; firing early
// costs one pass that expires nothing and re-arms. Without leases nothing is armed.
void ServerImpl::armLeaseTimer() {
  const auto next = engine_.nextLeaseDeadline();
  if (!next || (leaseTimerAt_ && *leaseTimerAt_ <= *next)) return;
  leaseTimerAt_ = next;
  leaseTimer_.expires_at(*next);  // cancels the wait armed for a later deadline
  leaseTimer_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (ec || self->listener_.stopped()) return;
    self->leaseTimerAt_.reset();
    self->engine_.expireLeases(std::chrono::steady_clock::now());
    self->armLeaseTimer();
  });
}

void ServerImpl::stop() {
  if (!listener_.stop()) return;
  leaseTimer_.cancel();
  while (!spaces_.empty()) closeSpace(spaces_.begin()->first);
  std::vector<std::shared_ptr<Session>> all;
  for (auto& [raw, session] : sessions_) all.push_back(session);
  for (auto& session : all) session->close("");
}

}  // namespace detail

StoreServer::StoreServer(asio::io_context& io, StoreServerOptions options)
    : impl_(std::make_shared<detail::ServerImpl>(io, std::move(options))) {
  impl_->accept();
}

StoreServer::~StoreServer() = default;

uint16_t StoreServer::port() const { return impl_->listener_.local().port(); }

std::string StoreServer::address() const {
  return impl_->listener_.local().address().to_string();
}

void StoreServer::stop() { impl_->stop(); }

void StoreServer::allow(const IpBytes& host) {
  asio::post(impl_->io_, [impl = impl_, host] { impl->options_.admission.add(host); });
}

size_t StoreServer::connectionCount() const { return impl_->connectionCount_.load(); }

StoreStats StoreServer::stats() const {
  StoreStats stats{.connections = impl_->accepted_.read(),
                   .foreign = impl_->foreign_.read(),
                   .open = impl_->connectionCount_.load(),
                   .refused = impl_->refused_.read(),
                   .rejected = impl_->rejected_.read(),
                   .bytesIn = impl_->bytesIn_.read(),
                   .bytesOut = impl_->bytesOut_.read(),
                   .keys = impl_->keys_.read(),
                   .waiters = impl_->waiters_.read(),
                   .spaces = impl_->spacesOpen_.read()};
  for (size_t op = 0; op < wire::kOpCount; ++op) stats.ops[op] = impl_->ops_[op].read();
  return stats;
}

uint64_t StoreStats::requests() const {
  uint64_t total = 0;
  for (uint64_t count : ops) total += count;
  return total;
}

std::string StoreStats::describe() const {
  std::string text = "connections=" + std::to_string(connections) +
                     " foreign=" + std::to_string(foreign) +
                     (rejected ? " rejected=" + std::to_string(rejected) : "") +
                     " requests=" + std::to_string(requests());
  for (size_t op = 0; op < wire::kOpCount; ++op) {
    if (ops[op] == 0) continue;
    text += ' ';
    text += wire::opName(static_cast<wire::Op>(op));
    text += '=' + std::to_string(ops[op]);
  }
  return text;
}

StoreServerThread::StoreServerThread(StoreServerOptions options)
    : io_(std::make_unique<asio::io_context>(1)),
      server_(std::make_unique<StoreServer>(*io_, std::move(options))),
      thread_([this] { io_->run(); }) {}

StoreServerThread::~StoreServerThread() {
  asio::post(*io_, [this] { server_->stop(); });
  thread_.join();
}

}  // namespace dlrun
