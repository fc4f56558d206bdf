#include "control/control_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include "common/error.h"
#include "grpc_runtime.h"

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
  proto::prepareGrpc();
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
        options.foreign = [this](int fd) { handOver(fd); };
        return std::move(options);
      }()) {
  // The port is ours (the store's constructor throws otherwise): now gRPC is worth starting.
  // Should that fail, ~StoreWithControl does not run, so the early connections are closed here.
  std::unique_ptr<ControlServer> control;
  try {
    control = std::make_unique<ControlServer>();
  } catch (...) {
    std::lock_guard lock(mutex_);
    for (int fd : early_) ::close(fd);
    early_.clear();
    throw;
  }
  control->readStoreAt(store_.address(), store_.port());
  std::lock_guard lock(mutex_);
  control_ = std::move(control);
  for (int fd : early_) control_->adopt(fd);
  early_.clear();
}

StoreWithControl::~StoreWithControl() = default;

void StoreWithControl::handOver(int fd) {
  std::lock_guard lock(mutex_);
  if (control_) {
    control_->adopt(fd);
  } else {
    early_.push_back(fd);
  }
}

}  // namespace dlrun::control
