#include "common/listen.h"

#include <fcntl.h>

#include <chrono>

#include "common/error.h"

namespace dlrun {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {
void keepFromChildren(int fd) { ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC); }
}  // namespace

error_code openListener(tcp::acceptor& acceptor, const tcp::endpoint& at, int backlog) {
  error_code ec;
  acceptor.open(at.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec && at.address().is_v6()) acceptor.set_option(asio::ip::v6_only(false), ec);
  if (!ec) acceptor.bind(at, ec);
  if (!ec) acceptor.listen(backlog, ec);
  if (!ec) keepFromChildren(acceptor.native_handle());
  return ec;
}

tcp::acceptor listenOn(asio::io_context& io, const tcp::endpoint& at, const std::string& what,
                       int backlog) {
  tcp::acceptor acceptor(io);
  if (const error_code ec = openListener(acceptor, at, backlog))
    throw NetworkError("cannot listen on " + what + ": " + ec.message());
  return acceptor;
}

Listener::Listener(tcp::acceptor acceptor)
    : acceptor_(std::move(acceptor)),
      retry_(acceptor_.get_executor()),
      bound_(acceptor_.local_endpoint()) {}

void Listener::start(OnSocket onSocket, OnFailure onFailure) {
  accept(std::move(onSocket), std::move(onFailure));
}

void Listener::accept(OnSocket onSocket, OnFailure onFailure) {
  acceptor_.async_accept([this, onSocket = std::move(onSocket),
                          onFailure = std::move(onFailure)](const error_code& ec,
                                                            tcp::socket socket) mutable {
    if (ec == asio::error::operation_aborted || stopped_) return;
    if (!ec) {
      keepFromChildren(socket.native_handle());
      onSocket(std::move(socket));
      if (!stopped_) accept(std::move(onSocket), std::move(onFailure));
      return;
    }
    onFailure(ec);
    retry_.expires_after(std::chrono::milliseconds(50));
    retry_.async_wait([this, onSocket = std::move(onSocket),
                       onFailure = std::move(onFailure)](const error_code& e) mutable {
      if (!e && !stopped_) accept(std::move(onSocket), std::move(onFailure));
    });
  });
}

bool Listener::stop() {
  if (stopped_) return false;
  stopped_ = true;
  error_code ec;
  acceptor_.close(ec);
  retry_.cancel();
  return true;
}

}  // namespace dlrun
