// The store server's inside (store_server.h): the server, its connections and the attempts'
// key spaces, shared by store_server.cpp (accepting, spaces, leases, counts) and
// store_session.cpp (one connection: reading, parsing, replying). All of it runs on the
// server's io_context thread; only the counters are read from other threads.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/asio.h"
#include "common/listen.h"
#include "store/store_engine.h"
#include "store/store_server.h"

namespace dlrun::detail {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

class Session;

// One attempt's key space (wire.h, SPACE_OPEN): the group's newest attempt.
struct Space {
  Space(std::string group, tcp::acceptor acceptor, int64_t attempt)
      : group(std::move(group)), attempt(attempt), listener(std::move(acceptor)) {}
  std::string group;  // its key in ServerImpl::spaces_
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
  // A session that closed or was handed over, and left its space (which may then end).
  void forget(Session* session, Space* space);
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
  Counter keys_;  // gauges, as of the last request served
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

  void start();
  void send(std::string_view bytes) override;

  // Ends the session; `reason` (when not empty) is logged as the one line about this client.
  void close(const std::string& reason);

 private:
  // A client that broke the protocol or a limit: counted, then closed.
  void refuse(const std::string& reason);

  // Looked up only when a line is logged: a getpeername per connection costs the barrier.
  std::string peerName() const;

  // async_read_some and async_receive try at once and leave the epoll registration alone when
  // they must wait; async_wait re-arms it (an epoll_ctl) every time: a third of a barrier
  // connection's system calls.
  void awaitReadable();
  void onPeeked(const error_code& ec, size_t n);
  void onRead(const error_code& readError, size_t n);

  // The connection opened with HTTP/2: it goes to StoreServerOptions::foreign, its preface
  // unread (peeked), so the other server reads all of it itself.
  void handOver();

  // Runs every complete request in `data`; keeps the tail of an incomplete one in in_.
  // Returns false when the session was closed.
  bool process(std::span<const char> data);

  // The server's own ops, then the engine's. A space serves no leases (their one timer is the
  // store's) and opens no spaces. Throws RequestError for a refused request.
  void handle(std::chrono::steady_clock::time_point now);
  std::string overLimit() const;
  void flush();
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
  bool sniff_;       // the first read is still to come and StoreServerOptions::foreign is set
  char first_[128];  // each read's first bytes: most requests whole
};

}  // namespace dlrun::detail
