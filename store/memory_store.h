// An in-process store client: a connection to a MemoryStoreServer, as a TcpStore is one to
// dlrund. Each op is a wire::Request handed to the server's StoreEngine, and the reply is read
// from the bytes the engine sends back, so the semantics (and the refusals' messages) are
// dlrund's own. Leases belong to the client: abort() or destruction is a disconnect and fires
// them, as a killed agent's closing socket does.
//
// Built with a timeout only, a MemoryStore owns a private real-time server: the standalone
// store that tests and threads of one process share. Thread-safe; several threads may wait on
// one client at once (each wait is a peer of its own in the engine).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "store/leasing_store.h"
#include "store/memory_store_server.h"

namespace dlrun {

class MemoryStore : public LeasingStore {
 public:
  // A store of its own, on real time. `timeout` bounds get() and multiGet().
  explicit MemoryStore(std::chrono::milliseconds timeout = kDefaultTimeout);
  // A connection to a shared server.
  explicit MemoryStore(std::shared_ptr<MemoryStoreServer> server,
                       std::chrono::milliseconds timeout = kDefaultTimeout);
  ~MemoryStore() override;  // disconnects, firing this client's leases
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

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

  void lease(const std::string& key, const std::string& value, std::chrono::milliseconds ttl,
             const std::vector<std::pair<std::string, std::string>>& tripwires) override;
  bool waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  std::vector<std::string> peek(const std::vector<std::string>& keys) override;
  // Every later call throws NetworkError, as a TcpStore's with reconnect=false.
  void abort() override;
  Clock::time_point now() override { return server_->now(); }

  MemoryStoreServer& server() { return *server_; }

 private:
  // The connection as the engine sees it: immediate replies, read back under the server's
  // lock before anyone else can add to them.
  struct Connection : Peer {
    void send(std::string_view bytes) override { replies.append(bytes); }
    std::string replies;
  };

  // Runs one request on this connection; returns its reply bytes. Call with the lock held.
  std::string request(const wire::Request& request);
  // The same under the server's lock.
  std::string call(const wire::Request& request);
  void requireOpen() const;

  const std::shared_ptr<MemoryStoreServer> server_;
  const std::chrono::milliseconds timeout_;
  Connection connection_;
  bool aborted_ = false;  // under the server's mutex
};

}  // namespace dlrun
