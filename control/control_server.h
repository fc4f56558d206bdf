// The control plane's gRPC server (ARCHITECTURE.md section 10): the Control service and gRPC's
// health service (grpc.health.v1), on no port of its own. A store server hands it each
// connection that opens with HTTP/2 (StoreServerOptions::foreign), so the store's one port
// serves TCPStore clients and gRPC clients alike; `dlrun status` under etcd calls it in process.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "control/control_service.h"
#include "store/store_server.h"

namespace grpc {
class Channel;
class Server;
namespace experimental {
class ExternalConnectionAcceptor;
}
}  // namespace grpc

namespace dlrun::control {

// Opens a connection to the store that holds the jobs' keys (ControlServiceOptions::connect).
using StoreConnector = std::function<std::unique_ptr<LeasingStore>()>;

// Connections to the dlrun store a server bound at address:port (0.0.0.0 or :: is reached
// through loopback), with the short deadlines of a store on this host.
StoreConnector storeAt(const std::string& address, uint16_t port);

class ControlServer {
 public:
  // Starts the gRPC server. `inProcess`: it is called only through inProcessChannel()
  // (ControlServiceOptions::inProcess). Throws Error when gRPC cannot start it.
  explicit ControlServer(WatchTiming timing = {}, bool inProcess = false);
  // Ends open calls (a follower within its poll) and waits for their handlers.
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // StoreServerOptions::foreign: serves one accepted connection, whose descriptor it owns.
  void adopt(int fd);
  // A channel to this server within the process, for a client that has no port to dial.
  std::shared_ptr<grpc::Channel> inProcessChannel();
  // The store whose jobs it serves (storeAt(), or etcd's for an etcd job). Calls before this
  // answer UNAVAILABLE.
  void readFrom(StoreConnector connect);

 private:
  std::unique_ptr<LeasingStore> openStore();

  std::mutex mutex_;
  StoreConnector connect_;
  ControlService service_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::unique_ptr<grpc::Server> server_;
};

// A StoreServerThread with the control plane on its port: what an agent serves its job's store
// (or, under etcd, its workers' store) with. The gRPC server is built on the first HTTP/2
// connection, on the store's thread (a few ms of CPU, once, while the store waits): most jobs
// are never asked, and on the endpoint's host every agent tries to serve and all but one lose
// the bind, so building it at once would cost every launch and every losing agent (32 agents on
// loopback and 2 busy cores: 26 instead of 22 ms of CPU each, 406 instead of 345 ms to
// rendezvous, when it was built at each bind).
class StoreWithControl {
 public:
  // `connect`: the store whose jobs it serves; none: this very store. Throws NetworkError when
  // the port cannot be bound.
  explicit StoreWithControl(StoreServerOptions options, StoreConnector connect = {});
  ~StoreWithControl();
  StoreWithControl(const StoreWithControl&) = delete;
  StoreWithControl& operator=(const StoreWithControl&) = delete;
  const StoreServerThread& store() const { return store_; }

 private:
  void handOver(int fd);  // StoreServerOptions::foreign, on the store's thread

  // Declared before the store: they outlive the store that hands them connections.
  StoreConnector connect_;
  std::unique_ptr<ControlServer> control_;  // built on the first handOver, on the store's thread
  StoreServerThread store_;
};

}  // namespace dlrun::control
