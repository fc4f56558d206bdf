// A namespace over another store: every key is sent as "<prefix>/<key>". Used to keep jobs,
// rendezvous rounds and restart attempts apart on one server.
#pragma once

#include <memory>

#include "store/store.h"

namespace dlrun {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t numKeys() override;  // the inner store's count: keys are not tracked per prefix
  void append(const std::string& key, const std::string& value) override;
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override;
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

  Store& inner() { return *inner_; }

 private:
  std::string join(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  const std::string prefix_;  // with the trailing '/'
  const std::shared_ptr<Store> inner_;
};

}  // namespace dlrun
