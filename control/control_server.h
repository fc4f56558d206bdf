// The control plane's gRPC server (ARCHITECTURE.md section 10): the Control service and gRPC's
// health service (grpc.health.v1), on no port of its own. The job's store server hands it each
// connection that opens with HTTP/2 (StoreServerOptions::foreign), so the store's one port
// serves TCPStore clients and gRPC clients alike.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "control/control_service.h"
#include "rendezvous/store/store_server.h"
#include "rendezvous/store/tcp_store.h"

namespace grpc {
class Server;
namespace experimental {
class ExternalConnectionAcceptor;
}
}  // namespace grpc

namespace dlrun::control {

class ControlServer {
 public:
  // Starts the gRPC server. Throws Error when gRPC cannot start it.
  explicit ControlServer(WatchTiming timing = {});
  // Ends open calls (a follower within its poll) and waits for their handlers.
  ~ControlServer();
  ControlServer(const ControlServer&) = delete;
  ControlServer& operator=(const ControlServer&) = delete;

  // StoreServerOptions::foreign: serves one accepted connection, whose descriptor it owns.
  void adopt(int fd);
  // The store whose jobs it serves: the store server that hands it connections, at the address
  // that server bound (0.0.0.0 or :: is reached through loopback). Calls before this answer
  // UNAVAILABLE.
  void readStoreAt(const std::string& address, uint16_t port);

 private:
  std::unique_ptr<rendezvous::LeasingStore> openStore();

  std::mutex mutex_;
  std::optional<rendezvous::TcpStoreOptions> store_;
  ControlService service_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::unique_ptr<grpc::Server> server_;
};

// A StoreServerThread with the control plane on its port: what an agent that serves its job's
// store in-process runs. The gRPC server is built only once the store holds its port: on the
// endpoint's host every agent tries to serve and all but one lose the bind, and each of those
// would otherwise pay for starting gRPC and stopping it again (3 to 5 ms of CPU: 32 agents on
// loopback and 2 busy cores took 26 instead of 22 ms of CPU each and rendezvoused in 406
// instead of 345 ms, medians of 21 alternating runs). A gRPC client that connects before it is
// built waits in early_ for it.
class StoreWithControl {
 public:
  // Throws NetworkError when the port cannot be bound (no gRPC server is started then).
  explicit StoreWithControl(rendezvous::StoreServerOptions options);
  ~StoreWithControl();
  StoreWithControl(const StoreWithControl&) = delete;
  StoreWithControl& operator=(const StoreWithControl&) = delete;
  const rendezvous::StoreServerThread& store() const { return store_; }

 private:
  void handOver(int fd);  // StoreServerOptions::foreign, on the store's thread

  // Declared before the store: they outlive the store that hands them connections.
  std::mutex mutex_;
  std::unique_ptr<ControlServer> control_;  // set once built, under mutex_
  std::vector<int> early_;                  // connections that came first, under mutex_
  rendezvous::StoreServerThread store_;
};

}  // namespace dlrun::control
