// Helpers shared by the tests that talk to a live store server over loopback.
#pragma once

#include <chrono>
#include <string>
#include <thread>

#include "store/tcp_stream.h"
#include "store/wire.h"

namespace dlrun::testing {

// A raw connection for byte-level tests: every call fails the test's deadline instead of
// hanging.
class RawClient {
 public:
  explicit RawClient(uint16_t port) : stream_(TcpStream::connect("127.0.0.1", port, deadline())) {}

  void send(const std::string& bytes) { stream_.writeAll(bytes, deadline()); }
  std::string read(size_t n) { return stream_.readExact(n, deadline()); }
  // True when the server closes the connection (within the deadline).
  bool closedByServer() { return stream_.awaitClose(deadline()); }
  void close() { stream_.close(); }

  // Opens a V2 connection: VALIDATE with the magic.
  void validate() {
    std::string hello;
    wire::Encoder(hello).op(wire::Era::V2, wire::Op::Validate).u32(wire::kValidationMagic);
    send(hello);
  }

 private:
  static Clock::time_point deadline() { return Clock::now() + std::chrono::seconds(10); }
  TcpStream stream_;
};

// Polls a condition that another thread changes, until it holds or the deadline passes.
template <typename Predicate>
bool eventually(Predicate predicate, std::chrono::milliseconds within = std::chrono::seconds(10)) {
  const auto deadline = Clock::now() + within;
  while (!predicate()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline std::string i64Bytes(int64_t v) {
  std::string out;
  wire::Encoder(out).i64(v);
  return out;
}

inline std::string lengthPrefixed(std::string_view v) {
  std::string out;
  wire::Encoder(out).bytes(v);
  return out;
}

}  // namespace dlrun::testing
