#include "store/prefix_store.h"

namespace dlrun {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix) + "/"), inner_(std::move(inner)) {}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(join(key));
  return out;
}

void PrefixStore::set(const std::string& key, const std::string& value) {
  inner_->set(join(key), value);
}

std::string PrefixStore::get(const std::string& key) { return inner_->get(join(key)); }

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return inner_->add(join(key), delta);
}

std::string PrefixStore::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  return inner_->compareSet(join(key), expected, desired);
}

bool PrefixStore::deleteKey(const std::string& key) { return inner_->deleteKey(join(key)); }

bool PrefixStore::check(const std::vector<std::string>& keys) { return inner_->check(join(keys)); }

void PrefixStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  inner_->wait(join(keys), timeout);
}

int64_t PrefixStore::numKeys() { return inner_->numKeys(); }

void PrefixStore::append(const std::string& key, const std::string& value) {
  inner_->append(join(key), value);
}

std::vector<std::string> PrefixStore::multiGet(const std::vector<std::string>& keys) {
  return inner_->multiGet(join(keys));
}

void PrefixStore::multiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  inner_->multiSet(join(keys), values);
}

}  // namespace dlrun
