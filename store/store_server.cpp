// Exception safety: nothing here throws once the server is listening. Handlers take error
// codes; a client that breaks the protocol or a limit is logged once and disconnected, and the
// server and every other client carry on. Only the constructor throws (it cannot bind).
// Each connection is a Session (store_session.cpp).
//
// Spaces (wire.h's SPACE_OPEN): an attempt's key space is a listener of its own on the store's
// address, port 0, with an engine of its own; its sessions reach that engine alone, so nothing
// an attempt's workers write is seen by another attempt's, and closing the space (its listener,
// its sessions, its engine) frees every key at once. HTTP/2 goes to the foreign server there
// too: the control plane answers wherever the workers find the store.
#include "store/store_server.h"

#include <sys/socket.h>

#include "common/error.h"
#include "common/host_port.h"
#include "common/log.h"
#include "store/store_server_impl.h"

namespace dlrun {

using detail::error_code;
using detail::tcp;
namespace asio = boost::asio;

namespace detail {

tcp::acceptor ServerImpl::listen(asio::io_context& io, const StoreServerOptions& options) {
  error_code ec;
  tcp::resolver resolver(io);
  const HostPort& at = options.listen;
  auto endpoints = resolver.resolve(at.socketHost(), std::to_string(at.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty())
    throw NetworkError("cannot resolve listen address '" + at.host + "': " + ec.message());
  return listenOn(io, endpoints.begin()->endpoint(), at.text(), options.backlog);
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
  auto made = std::make_unique<Space>(std::string(group), std::move(acceptor), attempt);
  Space& space = *spaces_.emplace(made->group, std::move(made)).first->second;
  spacesOpen_.set(spaces_.size());
  acceptInto(space);
  return space.listener.local().port();
}

void ServerImpl::closeSpace(std::string_view group) {
  auto it = spaces_.find(group);
  if (it == spaces_.end()) return;
  const std::vector<Session*> open(it->second->sessions.begin(), it->second->sessions.end());
  closeSpaceWhenIdle(group);
  for (Session* session : open) session->close("");  // the last one erases the space
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
  const std::string group = space.group;  // erasing destroys the space, and its group with it
  spaces_.erase(group);
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
  const auto v6 =
      peer.is_v4() ? asio::ip::make_address_v6(asio::ip::v4_mapped, peer.to_v4()) : peer.to_v6();
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

void ServerImpl::forget(Session* session, Space* space) {
  sessions_.erase(session);
  connectionCount_.store(sessions_.size());
  if (!space) return;
  space->sessions.erase(session);
  leftSpace(*space);
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
  std::vector<std::string> groups;
  for (const auto& [group, space] : spaces_) groups.push_back(group);
  for (const auto& group : groups) closeSpace(group);
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

std::string StoreServer::address() const { return impl_->listener_.local().address().to_string(); }

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
