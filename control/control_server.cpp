#include "control/control_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "grpc_runtime.h"
#include "store/tcp_store.h"

namespace dlrun::control {

namespace {

// How long the connections the service opens to its own store may take: it is local.
constexpr auto kStoreConnectTimeout = std::chrono::seconds(2);
constexpr auto kStoreReplyTimeout = std::chrono::seconds(10);
// How long open calls get to finish when the server goes away.
constexpr auto kShutdownGrace = std::chrono::seconds(1);

}  // namespace

StoreConnector storeAt(const std::string& address, uint16_t port) {
  const std::string host = address == "0.0.0.0" ? "127.0.0.1" : address == "::" ? "::1" : address;
  return [host, port] {
    return std::make_unique<TcpStore>(TcpStoreOptions{.at = {host, port},
                                                      .timeout = kStoreReplyTimeout,
                                                      .connectTimeout = kStoreConnectTimeout,
                                                      .reconnect = false});
  };
}

ControlServer::ControlServer(WatchTiming timing, bool inProcess)
    : service_(
          {.connect = [this] { return openStore(); }, .watch = timing, .inProcess = inProcess}) {
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

std::shared_ptr<grpc::Channel> ControlServer::inProcessChannel() {
  return server_->InProcessChannel(grpc::ChannelArguments());
}

void ControlServer::readFrom(StoreConnector connect) {
  std::lock_guard lock(mutex_);
  connect_ = std::move(connect);
}

std::unique_ptr<LeasingStore> ControlServer::openStore() {
  StoreConnector connect;
  {
    std::lock_guard lock(mutex_);
    connect = connect_;
  }
  if (!connect) throw NetworkError("the store is not serving yet");
  return connect();
}

StoreWithControl::StoreWithControl(StoreServerOptions options, StoreConnector connect)
    : connect_(std::move(connect)), store_([&] {
        options.foreign = [this](int fd) { handOver(fd); };
        return std::move(options);
      }()) {}

StoreWithControl::~StoreWithControl() = default;

void StoreWithControl::handOver(int fd) {
  if (!control_) {
    try {
      control_ = std::make_unique<ControlServer>();
    } catch (const Error& e) {
      log::warn(std::string(e.what()) + ": a control plane client was turned away");
      ::close(fd);
      return;
    }
    // The store has bound its port by now: its thread, this one, starts after the bind.
    control_->readFrom(connect_ ? connect_ : storeAt(store_.address(), store_.port()));
  }
  control_->adopt(fd);
}

}  // namespace dlrun::control
