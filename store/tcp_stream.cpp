#include "store/tcp_stream.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/host_port.h"

namespace dlrun {
namespace {

std::string systemError(const std::string& what) { return what + ": " + std::strerror(errno); }

int remainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1'000'000'000));
}

// Starts a non-blocking connect to one address and waits for it by the deadline.
int connectOne(const addrinfo& ai, Clock::time_point deadline, std::string& error, bool& refused) {
  refused = false;
  int fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol);
  if (fd < 0) {
    error = systemError("socket");
    return -1;
  }
  if (::connect(fd, ai.ai_addr, ai.ai_addrlen) != 0 && errno != EINPROGRESS) {
    refused = errno == ECONNREFUSED;
    error = systemError("connect");
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  int ready;
  do {
    ready = ::poll(&p, 1, remainingMs(deadline));
  } while (ready < 0 && errno == EINTR);
  int soError = 0;
  socklen_t len = sizeof(soError);
  if (ready <= 0) {
    error = ready == 0 ? "connect timed out" : systemError("poll");
    ::close(fd);
    return -1;
  }
  ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &soError, &len);
  if (soError != 0) {
    refused = soError == ECONNREFUSED;
    error = std::string("connect: ") + std::strerror(soError);
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

TcpStream TcpStream::connect(const std::string& host, uint16_t port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list); rc != 0)
    throw NetworkError("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  std::string error = "no address";
  bool refused = false;
  int fd = -1;
  for (addrinfo* ai = list; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = connectOne(*ai, deadline, error, refused);
  }
  ::freeaddrinfo(list);
  if (fd < 0) {
    const std::string message = "cannot connect to " + joinHostPort(host, port) + ": " + error;
    if (refused) throw ConnectionRefused(message);
    throw NetworkError(message);
  }
  return TcpStream(fd);
}

TcpStream::~TcpStream() { close(); }

TcpStream::TcpStream(TcpStream&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }

TcpStream& TcpStream::operator=(TcpStream&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void TcpStream::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void TcpStream::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void TcpStream::await(short events, Clock::time_point deadline) {
  pollfd p{fd_, events, 0};
  while (true) {
    int ready = ::poll(&p, 1, remainingMs(deadline));
    if (ready > 0) return;
    if (ready == 0) throw TimeoutError("timed out waiting for the store");
    if (errno != EINTR) throw NetworkError(systemError("poll"));
  }
}

void TcpStream::writeAll(std::string_view bytes, Clock::time_point deadline) {
  if (fd_ < 0) throw NetworkError("not connected");
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      bytes.remove_prefix(static_cast<size_t>(n));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      await(POLLOUT, deadline);
    } else if (errno != EINTR) {
      throw NetworkError(systemError("send to the store"));
    }
  }
}

std::string TcpStream::readSome(size_t max, Clock::time_point deadline) {
  if (fd_ < 0) throw NetworkError("not connected");
  std::string out(max, '\0');
  while (true) {
    ssize_t n = ::recv(fd_, out.data(), max, 0);
    if (n >= 0) {
      out.resize(static_cast<size_t>(n));
      return out;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      await(POLLIN, deadline);
    } else if (errno != EINTR) {
      throw NetworkError(systemError("receive from the store"));
    }
  }
}

std::string TcpStream::readExact(size_t n, Clock::time_point deadline) {
  std::string out;
  out.reserve(n);
  while (out.size() < n) {
    std::string chunk = readSome(n - out.size(), deadline);
    if (chunk.empty()) throw NetworkError("the store closed the connection");
    out += chunk;
  }
  return out;
}

bool TcpStream::awaitClose(Clock::time_point deadline) {
  try {
    while (!readSome(4096, deadline).empty()) {
    }
    return true;
  } catch (const TimeoutError&) {
    return false;
  } catch (const NetworkError&) {
    return true;  // reset by the peer: closed as well
  }
}

}  // namespace dlrun
