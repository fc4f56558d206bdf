#include "control/control_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "common/error.h"

namespace dlrun::control {

namespace {

// How long the connections the service opens to its own store may take: it is local.
constexpr auto kStoreConnectTimeout = std::chrono::seconds(2);
constexpr auto kStoreReplyTimeout = std::chrono::seconds(10);
// How long open calls get to finish when the server goes away.
constexpr auto kShutdownGrace = std::chrono::seconds(1);

}  // namespace

ControlServer::ControlServer(WatchTiming timing)
    : service_({.connect = [this] { return openStore(); }, .watch = timing}) {
  // Process-wide, read by the builder: grpc.health.v1.Health answers SERVING for "" and for
  // the Control service while the server runs.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.RegisterService(&service_);
  acceptor_ = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
      grpc::InsecureServerCredentials());
  server_ = builder.BuildAndStart();
  if (!server_) throw Error("cannot start the control plane's gRPC server");
  server_->GetHealthCheckService()->SetServingStatus(v1::Control::service_full_name(), true);
}

ControlServer::~ControlServer() {
  server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
}

void ControlServer::adopt(int fd) {
  // gRPC reads the peer's address from the descriptor (getpeername), so ServerContext::peer()
  // names the client as it would on a port of gRPC's own.
  grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
  connection.fd = fd;
  acceptor_->HandleNewConnection(&connection);
}

void ControlServer::readStoreAt(const std::string& address, uint16_t port) {
  const std::string host = address == "0.0.0.0" ? "127.0.0.1" : address == "::" ? "::1" : address;
  std::lock_guard lock(mutex_);
  store_ = rendezvous::TcpStoreOptions{.host = host,
                                       .port = port,
                                       .timeout = kStoreReplyTimeout,
                                       .connectTimeout = kStoreConnectTimeout,
                                       .reconnect = false};
}

std::unique_ptr<rendezvous::LeasingStore> ControlServer::openStore() {
  std::optional<rendezvous::TcpStoreOptions> options;
  {
    std::lock_guard lock(mutex_);
    options = store_;
  }
  if (!options) throw NetworkError("the store is not serving yet");
  return std::make_unique<rendezvous::TcpStore>(*options);
}

StoreWithControl::StoreWithControl(rendezvous::StoreServerOptions options)
    : store_([&] {
        options.foreign = [this](int fd) { control_.adopt(fd); };
        return std::move(options);
      }()) {
  control_.readStoreAt(store_.address(), store_.port());
}

}  // namespace dlrun::control
