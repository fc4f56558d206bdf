// A blocking client of dlrund or of any PyTorch 2.x TCPStore server, speaking the V2 wire
// protocol (VALIDATE, then PING to prove the connection). Thread-safe: one request at a time
// on one connection. A timed-out wait sends CANCEL_WAIT so the connection stays in step; any
// other failure closes the connection and the next call reconnects.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rendezvous/store.h"
#include "rendezvous/tcp_stream.h"

namespace dlrun::rendezvous {

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 29500;
  // How long get()/multiGet() wait for keys, and the deadline of every other reply.
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  // How long to keep retrying (with jittered exponential backoff) while the server is not up.
  std::chrono::milliseconds connectTimeout = std::chrono::seconds(60);
};

class TcpStore : public Store {
 public:
  // Connects at once; throws NetworkError or TimeoutError when connectTimeout passes.
  explicit TcpStore(TcpStoreOptions options);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t numKeys() override;
  void append(const std::string& key, const std::string& value) override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;

  // Round trip with a nonce; throws ProtocolError when the echo differs.
  void ping();
  void queuePush(const std::string& key, const std::string& value);
  // Pops the oldest item; with `block`, first waits up to the timeout for one to exist.
  // Returns nullopt when the queue is empty.
  std::optional<std::string> queuePop(const std::string& key, bool block);
  int64_t queueLen(const std::string& key);

  const TcpStoreOptions& options() const { return options_; }

 private:
  // Runs fn with the connection under the lock, (re)connecting first; a failure inside fn
  // closes the connection so the next call starts clean.
  template <typename Fn>
  auto locked(Fn&& fn);
  void connect();
  void send(const std::string& request);
  void waitLocked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  uint8_t readU8();
  int64_t readI64();
  std::string readBytes();
  Clock::time_point replyDeadline() const { return Clock::now() + options_.timeout; }

  const TcpStoreOptions options_;
  std::mutex mutex_;
  TcpStream stream_;
};

}  // namespace dlrun::rendezvous
