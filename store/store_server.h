// The TCPStore-compatible server: one Boost.Asio io_context, one session per connection, no
// thread per connection. An idle connection holds no buffers: sessions wait for readability
// and read into one scratch buffer shared by the server (safe because one thread runs the
// io_context), keeping only an incomplete request's bytes between reads. Leases (wire.h's
// LEASE) expire on one timer armed at the earliest deadline. A connection that opens with
// HTTP/2 may go to another server instead (StoreServerOptions::foreign): one port serves both.
// The server counts what it serves (StoreStats): connections, requests by op, bytes, refusals.
// A peer its AdmissionRule does not allow is closed as soon as it is accepted, before any byte
// is read (HTTP/2 ones too), counted in StoreStats::rejected and logged once per address.
// Each attempt of a job may get a key space of its own behind a port of its own (wire.h's
// SPACE_OPEN): the workers of one attempt never read another's keys, and a space's keys go
// with it when the job's next attempt opens its own.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/host_port.h"
#include "store/admission.h"
#include "store/wire.h"

namespace boost::asio {
class io_context;
}

namespace dlrun {

struct StoreServerOptions {
  // Where to listen: a numeric address or a name ("::" for IPv6); port 0 picks a free port,
  // read back with port().
  HostPort listen{"0.0.0.0", 0};
  wire::Limits limits;
  int backlog = 4096;  // a barrier of thousands of clients connects at once
  // When set, a connection whose first byte is 'P' (HTTP/2's preface, "PRI * HTTP/2.0") is no
  // store client: its descriptor goes to this callback, which owns it from then on, with the
  // bytes unread. A TCPStore request opens with an op code (0..18, or 64..68). Called on the
  // io_context's thread; it must not block.
  std::function<void(int fd)> foreign;
  // Who may connect; empty (the default) admits everyone. More hosts: StoreServer::allow.
  AdmissionRule admission;
};

// What a server has served since it started: totals, never reset. Counted on the server's
// thread (a relaxed load and store per request, no read-modify-write: one thread writes);
// StoreServer::stats() reads them from any thread, each count on its own.
struct StoreStats {
  uint64_t connections = 0;  // accepted and admitted, foreign ones included
  uint64_t foreign = 0;      // of those, handed to StoreServerOptions::foreign
  uint64_t open = 0;         // connections open now
  uint64_t refused = 0;      // closed for breaking the protocol or a limit
  uint64_t rejected = 0;     // closed unread: the peer's address is not admitted
  uint64_t bytesIn = 0;      // read from clients
  uint64_t bytesOut = 0;     // written to clients
  uint64_t keys = 0;         // keys held, as of the last request served
  uint64_t waiters = 0;      // WAITs not yet answered, as of the last request served
  uint64_t spaces = 0;       // attempts' key spaces open now (wire.h, SPACE_OPEN)
  std::array<uint64_t, wire::kOpCount> ops{};  // requests handled, indexed by wire::Op

  uint64_t requests() const;  // every op
  // One line: "connections=N foreign=N requests=N" then NAME=N for each op served, in
  // wire::Op order (SET=12 GET=3 ...). "rejected=N" follows foreign= once a peer was rejected:
  // only then, so the line of a store without admission control reads as it always has.
  std::string describe() const;
};

namespace detail {
class ServerImpl;
}

class StoreServer {
 public:
  // Binds and listens at once, so port() is valid on return; serves while `io` runs.
  // Throws NetworkError when the address cannot be bound.
  StoreServer(boost::asio::io_context& io, StoreServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  uint16_t port() const;
  std::string address() const;  // the bound numeric address

  // Closes the listener and every connection; io.run() then returns once handlers drain.
  // Call on the io_context's thread.
  void stop();

  // Admits one more host (a node of the job) from now on; on an empty rule (everyone) it
  // makes the rule admit only the hosts added. Safe from any thread: the rule is changed on
  // the io_context's thread, so it takes effect once that thread gets to it.
  void allow(const IpBytes& host);

  // Safe from any thread.
  size_t connectionCount() const;
  StoreStats stats() const;

 private:
  std::shared_ptr<detail::ServerImpl> impl_;
};

// A StoreServer with its own io_context on its own thread, for embedding the store in a
// process whose main thread blocks elsewhere (the agent waiting on workers, tests).
class StoreServerThread {
 public:
  explicit StoreServerThread(StoreServerOptions options);
  ~StoreServerThread();  // stops the server and joins the thread
  StoreServerThread(const StoreServerThread&) = delete;
  StoreServerThread& operator=(const StoreServerThread&) = delete;

  uint16_t port() const { return server_->port(); }
  std::string address() const { return server_->address(); }
  size_t connectionCount() const { return server_->connectionCount(); }
  StoreStats stats() const { return server_->stats(); }
  void allow(const IpBytes& host) { server_->allow(host); }

 private:
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<StoreServer> server_;
  std::thread thread_;
};

}  // namespace dlrun
