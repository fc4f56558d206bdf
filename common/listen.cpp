#include "common/listen.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>

#include "common/error.h"
#include "common/port_holder.h"

namespace dlrun {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {
template <typename Socket>
error_code openNatively(Socket& socket, const tcp& protocol) {
  const int fd = ::socket(protocol.family(), SOCK_STREAM | SOCK_CLOEXEC, protocol.protocol());
  if (fd < 0) return {errno, boost::system::system_category()};
  error_code ec;
  socket.assign(protocol, fd, ec);
  if (ec) ::close(fd);
  return ec;
}
}  // namespace

error_code openCloseOnExec(tcp::acceptor& socket, const tcp& protocol) {
  return openNatively(socket, protocol);
}

error_code openCloseOnExec(tcp::socket& socket, const tcp& protocol) {
  return openNatively(socket, protocol);
}

error_code openListener(tcp::acceptor& acceptor, const tcp::endpoint& at, int backlog) {
  error_code ec = openCloseOnExec(acceptor, at.protocol());
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec && at.address().is_v6()) acceptor.set_option(asio::ip::v6_only(false), ec);
  if (!ec) acceptor.bind(at, ec);
  if (!ec) acceptor.listen(backlog, ec);
  return ec;
}

tcp::acceptor listenOn(asio::io_context& io, const tcp::endpoint& at, const std::string& what,
                       int backlog) {
  tcp::acceptor acceptor(io);
  if (const error_code ec = openListener(acceptor, at, backlog)) {
    const auto holder = ec == asio::error::address_in_use ? portHolder(at.port()) : std::nullopt;
    throw NetworkError("cannot listen on " + what + ": " + ec.message() +
                       (holder ? " (by " + *holder + ")" : ""));
  }
  return acceptor;
}

Listener::Listener(tcp::acceptor acceptor)
    : acceptor_(std::move(acceptor)),
      retry_(acceptor_.get_executor()),
      bound_(acceptor_.local_endpoint()) {
  acceptor_.non_blocking(true);  // accept() runs accept4 itself, after a wait, and must not block
}

void Listener::start(OnSocket onSocket, OnFailure onFailure) {
  accept(std::move(onSocket), std::move(onFailure));
}

void Listener::accept(OnSocket onSocket, OnFailure onFailure) {
  acceptor_.async_wait(
      tcp::acceptor::wait_read, [this, onSocket = std::move(onSocket),
                                 onFailure = std::move(onFailure)](const error_code& ec) mutable {
        if (ec == asio::error::operation_aborted || stopped_) return;
        error_code failure = ec;
        // A bounded batch per wake, so a burst of connections does not hold up the others'
        // requests; the next wait finds the rest (re-arming the wait re-checks readiness).
        for (int batch = 0; !failure && !stopped_ && batch < 64; ++batch) {
          // accept4 sets close-on-exec in the same call: accept, then fcntl twice, cost a barrier
          // two more system calls per connection.
          const int fd = ::accept4(acceptor_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
          if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR || errno == ECONNABORTED) continue;  // the peer gave up: next
            failure = error_code(errno, asio::error::get_system_category());
            break;
          }
          tcp::socket socket(acceptor_.get_executor());
          socket.assign(bound_.protocol(), fd, failure);
          if (failure) {
            ::close(fd);
            break;
          }
          onSocket(std::move(socket));
        }
        if (stopped_) return;
        if (!failure) return accept(std::move(onSocket), std::move(onFailure));
        onFailure(failure);
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
