#include "control/liveness_server.h"

#include <fcntl.h>

#include "common/asio.h"
#include "common/error.h"

namespace dlrun::control {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr std::string_view kAlive =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n"
    "Connection: close\r\n\r\nalive\n";
// The agent's workers must not inherit the port.
void keepFromChildren(int fd) { ::fcntl(fd, F_SETFD, FD_CLOEXEC); }

// A probe that sends nothing is answered after this long; one that sends a request, at once.
constexpr auto kRequestWait = std::chrono::milliseconds(500);

// One probe: its request read (so closing sends no reset over an unread request), the answer
// written, the connection closed.
struct Probe : std::enable_shared_from_this<Probe> {
  explicit Probe(tcp::socket s) : socket(std::move(s)), timer(socket.get_executor()) {}

  void start() {
    timer.expires_after(kRequestWait);
    timer.async_wait([self = shared_from_this()](const error_code& ec) {
      if (!ec) self->socket.cancel();
    });
    socket.async_read_some(asio::buffer(request),
                           [self = shared_from_this()](const error_code&, size_t) {
                             self->timer.cancel();
                             self->answer();
                           });
  }

  void answer() {
    asio::async_write(socket, asio::buffer(kAlive.data(), kAlive.size()),
                      [self = shared_from_this()](const error_code&, size_t) {
                        error_code ec;
                        self->socket.shutdown(tcp::socket::shutdown_both, ec);
                        self->socket.close(ec);
                      });
  }

  tcp::socket socket;
  asio::steady_timer timer;
  char request[4096];
};

}  // namespace

struct LivenessServer::Impl : std::enable_shared_from_this<Impl> {
  explicit Impl(asio::io_context& io) : acceptor(io) {}

  void accept() {
    acceptor.async_accept([self = shared_from_this()](const error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) {
        keepFromChildren(socket.native_handle());
        std::make_shared<Probe>(std::move(socket))->start();
      }
      self->accept();
    });
  }

  tcp::acceptor acceptor;
};

LivenessServer::LivenessServer(const std::string& host, uint16_t port)
    : io_(std::make_unique<asio::io_context>(1)), impl_(std::make_shared<Impl>(*io_)) {
  error_code ec;
  const tcp::endpoint endpoint(asio::ip::make_address(host, ec), port);
  if (!ec) impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    throw NetworkError("cannot serve the liveness port " + host + ":" + std::to_string(port) +
                       ": " + ec.message());
  keepFromChildren(impl_->acceptor.native_handle());
  port_ = impl_->acceptor.local_endpoint().port();
  impl_->accept();
  thread_ = std::thread([this] { io_->run(); });
}

LivenessServer::~LivenessServer() {
  io_->stop();
  thread_.join();
}

}  // namespace dlrun::control
