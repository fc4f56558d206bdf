// An in-process Store: a map under a mutex, waiters on a condition variable. For tests and for
// code paths that share a store between threads of one process.
#pragma once

#include <condition_variable>
#include <mutex>
#include <unordered_map>

#include "rendezvous/store/store.h"

namespace dlrun::rendezvous {

class MemoryStore : public Store {
 public:
  explicit MemoryStore(std::chrono::milliseconds timeout = kDefaultTimeout) : timeout_(timeout) {}

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

 private:
  // Waits on lock until every key exists; throws TimeoutError.
  void waitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                  std::chrono::milliseconds timeout);
  bool hasAll(const std::vector<std::string>& keys) const;

  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::unordered_map<std::string, std::string> data_;
};

}  // namespace dlrun::rendezvous
