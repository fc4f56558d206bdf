// A node's store proxy (--store-proxy): the workers' TCPStore clients connect to it on loopback,
// and it carries their requests to the job's store over a few connections of its own, so the
// store holds a handful of connections per node instead of one per worker, and a barrier costs
// it a request per node instead of two per worker.
//
// What it coalesces, where that cannot change an answer:
//  - WAITs on the same keys: one upstream wait, its reply to every local waiter;
//  - ADDs to one key read in one turn of the proxy's loop, or while one is in flight: one ADD of
//    their sum, whose result is split so each client gets the value it would have seen had the
//    ADDs run one after the other.
// GETs are never cached. PING is answered by the proxy (the server its client reaches). Every
// other op is forwarded as it came, on a connection of the
// client's protocol era: immediate ones in order on one shared connection, blocking ones
// (WAIT, BARRIER) each on a connection of a pool. A group of WAITs is one GROUP_WAIT (wire.h),
// whose reply says when a QUEUE_PUSH woke it: then one client goes on and the others wait on, so
// one push still releases one blocked popper, as the store's wake-one does. LEASE is refused: it
// is the agents' own. The store must be dlrun's (dlrund's or an agent's). When the store's
// connection fails, every client's is closed: as a worker straight on the store would, each sees
// its store gone.
//
// Runs on the caller's io_context; not thread-safe (call everything on that thread but stats()).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/host_port.h"
#include "store/wire.h"

namespace boost::asio {
class io_context;
}

namespace dlrun {

struct StoreProxyOptions {
  HostPort upstream;  // the job's store, at a numeric address
  // Where the workers connect: loopback, the node's own; port 0: a free port (port()).
  HostPort listen{"127.0.0.1", 0};
  wire::Limits limits;
};

// What a proxy has done since it started (read from any thread).
struct StoreProxyStats {
  uint64_t clients = 0;           // local connections accepted
  uint64_t requests = 0;          // requests from them
  uint64_t upstreamRequests = 0;  // requests sent to the store
  uint64_t upstreamConnections = 0;
  uint64_t coalescedWaits = 0;  // local WAITs that joined one already sent
  uint64_t coalescedAdds = 0;   // local ADDs folded into another's upstream ADD
};

namespace detail {
class ProxyImpl;
}

class StoreProxy {
 public:
  // Listens at once (port() is valid on return); throws NetworkError when it cannot. Connects
  // to the store on the first client's first request.
  StoreProxy(boost::asio::io_context& io, StoreProxyOptions options);
  ~StoreProxy();
  StoreProxy(const StoreProxy&) = delete;
  StoreProxy& operator=(const StoreProxy&) = delete;

  uint16_t port() const;
  // Closes the listener, every client and every store connection.
  void stop();
  StoreProxyStats stats() const;

 private:
  std::shared_ptr<detail::ProxyImpl> impl_;
};

}  // namespace dlrun
