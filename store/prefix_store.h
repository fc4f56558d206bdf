// A namespace over another store: every key is sent as "<prefix>/<key>". Used to keep jobs,
// rendezvous rounds and restart attempts apart on one server.
#pragma once

#include <memory>

#include "store/store.h"

namespace dlrun {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);

  // numKeys() is the inner store's count: keys are not tracked per prefix.
  DLRUN_STORE_KEY_OPS_OVERRIDE;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

  Store& inner() { return *inner_; }

 private:
  std::string join(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;

  const std::string prefix_;  // with the trailing '/'
  const std::shared_ptr<Store> inner_;
};

}  // namespace dlrun
