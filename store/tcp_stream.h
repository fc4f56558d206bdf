// A blocking TCP connection with deadlines: the transport of TcpStore, and of tests and the
// benchmark that speak the wire protocol byte by byte. Each call takes an absolute deadline and
// throws TimeoutError when it passes, NetworkError when the connection fails or the peer closes
// (ConnectionRefused when nothing listens there).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/clock.h"
#include "common/error.h"

namespace dlrun {

// Nothing listens at the address: the host answered, the server is not there.
class ConnectionRefused : public NetworkError {
 public:
  using NetworkError::NetworkError;
};

class TcpStream {
 public:
  // One attempt to connect to host (numeric address or name) and port, by the deadline.
  static TcpStream connect(const std::string& host, uint16_t port, Clock::time_point deadline);

  TcpStream() = default;
  ~TcpStream();
  TcpStream(TcpStream&& other) noexcept;
  TcpStream& operator=(TcpStream&& other) noexcept;
  TcpStream(const TcpStream&) = delete;
  TcpStream& operator=(const TcpStream&) = delete;

  bool isOpen() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close();
  // Shuts the connection down both ways: a call blocked on it in another thread fails at once.
  // The descriptor stays open until close().
  void shutdown();

  void writeAll(std::string_view bytes, Clock::time_point deadline);
  // Reads exactly n bytes.
  std::string readExact(size_t n, Clock::time_point deadline);
  // Reads whatever arrives first (at least one byte); an empty string means the peer closed.
  std::string readSome(size_t max, Clock::time_point deadline);
  // Waits until the peer closes the connection; false when the deadline passes first.
  // Bytes that arrive meanwhile are discarded.
  bool awaitClose(Clock::time_point deadline);

 private:
  explicit TcpStream(int fd) : fd_(fd) {}
  // Waits for `events` on the socket until the deadline; throws TimeoutError.
  void await(short events, Clock::time_point deadline);

  int fd_ = -1;
};

}  // namespace dlrun
