#include "control/liveness_server.h"

#include "common/asio.h"
#include "common/error.h"
#include "common/host_port.h"
#include "common/listen.h"

namespace dlrun::control {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

constexpr std::string_view kAlive =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n"
    "Connection: close\r\n\r\nalive\n";

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

tcp::acceptor openPort(asio::io_context& io, const std::string& host, uint16_t port) {
  const std::string what = "the liveness port " + joinHostPort(host, port);
  error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) throw NetworkError("cannot listen on " + what + ": " + ec.message());
  return listenOn(io, {address, port}, what);
}

}  // namespace

struct LivenessServer::Impl : std::enable_shared_from_this<Impl> {
  explicit Impl(tcp::acceptor acceptor) : listener(std::move(acceptor)) {}

  // A failed accept only waits for the next: a probe has nothing to be told.
  void accept() {
    listener.start([self = shared_from_this()](
                       tcp::socket socket) { std::make_shared<Probe>(std::move(socket))->start(); },
                   [](const error_code&) {});
  }

  Listener listener;
};

LivenessServer::LivenessServer(const std::string& host, uint16_t port)
    : io_(std::make_unique<asio::io_context>(1)),
      impl_(std::make_shared<Impl>(openPort(*io_, host, port))) {
  port_ = impl_->listener.local().port();
  impl_->accept();
  thread_ = std::thread([this] { io_->run(); });
}

LivenessServer::~LivenessServer() {
  io_->stop();
  thread_.join();
}

}  // namespace dlrun::control
