// A blocking client of dlrund or of any PyTorch 2.x TCPStore server, speaking the V2 wire
// protocol (VALIDATE, then PING to prove the connection: a server that answers anything else,
// or nothing for a few seconds, is named in a NotAStoreError). Thread-safe: one request at a time
// on one connection. A timed-out wait sends CANCEL_WAIT so the connection stays in step; any
// other failure closes the connection, and the next call reconnects unless told not to.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/host_port.h"
#include "store/leasing_store.h"
#include "store/tcp_stream.h"

namespace dlrun {

struct TcpStoreOptions {
  HostPort at{"127.0.0.1", 29500};  // the store; a name is resolved at each connection
  // How long get()/multiGet() wait for keys, and the deadline of every other reply.
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  // How long to keep retrying (with jittered exponential backoff) while the server is not up.
  std::chrono::milliseconds connectTimeout = std::chrono::seconds(60);
  // Whether a call after a failed or aborted connection opens a new one. A client holding
  // leases sets false: a new connection would silently drop them, so calls throw instead.
  bool reconnect = true;
  // How long a server that accepted the connection has to answer the opening PING before it is
  // taken for something else than a dlrun store. A dlrun store answers within microseconds;
  // a client of a store that may be busy for seconds (thousands of workers starting beside
  // it) allows more.
  std::chrono::milliseconds handshakeTimeout = std::chrono::seconds(3);
};

class TcpStore : public LeasingStore {
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
  int64_t numKeys() override;
  void append(const std::string& key, const std::string& value) override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;
  // One round trip where multiGet() takes two.
  std::vector<std::string> peek(const std::vector<std::string>& keys) override;

  // Round trip with a nonce; throws ProtocolError when the echo differs.
  void ping();
  void queuePush(const std::string& key, const std::string& value);
  // Pops the oldest item; with `block`, first waits up to the timeout for one to exist.
  // Returns nullopt when the queue is empty.
  std::optional<std::string> queuePop(const std::string& key, bool block);
  int64_t queueLen(const std::string& key);
  // dlrund's SPACE_OPEN and SPACE_CLOSE (wire.h): the port of `attempt`'s key space in
  // `group` (0: a later attempt's is open), and the end of the group's space.
  uint16_t openSpace(const std::string& group, int64_t attempt);
  void closeSpace(const std::string& group);

  // LeasingStore (leasing_store.h). lease() is dlrund's LEASE op: a PyTorch server drops the
  // connection. A wait that times out sends CANCEL_WAIT. After abort(), later calls reconnect,
  // or with reconnect=false throw NetworkError.
  void lease(const std::string& key, const std::string& value, std::chrono::milliseconds ttl,
             const std::vector<std::pair<std::string, std::string>>& tripwires) override;
  bool waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  void abort() override;

  const TcpStoreOptions& options() const { return options_; }

 private:
  // Runs fn with the connection under the lock, (re)connecting first; a failure inside fn
  // closes the connection so the next call starts clean.
  template <typename Fn>
  auto locked(Fn&& fn);
  void connect();
  // VALIDATE, then PING: proves a dlrun store (or a PyTorch 2.x one) answers. Throws
  // NotAStoreError when something else does.
  void handshake();
  // Every change of stream_'s descriptor holds streamMutex_, so abort() never shuts down a
  // descriptor that was closed and reused meanwhile.
  bool usable();                 // whether the connection is open; closes it after an abort()
  void adopt(TcpStream stream);  // throws NetworkError when abort() came first
  void closeStream();
  bool abortPending();
  std::string lostConnection() const;
  void send(const std::string& request);
  uint8_t readU8();
  int64_t readI64();
  std::string readBytes();
  Clock::time_point replyDeadline() const { return Clock::now() + options_.timeout; }

  const TcpStoreOptions options_;
  std::mutex mutex_;        // one request at a time
  std::mutex streamMutex_;  // stream_'s descriptor and aborted_, for abort()
  TcpStream stream_;
  bool aborted_ = false;
};

}  // namespace dlrun
