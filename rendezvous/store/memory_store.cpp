#include "rendezvous/store/memory_store.h"

#include <algorithm>
#include <charconv>

#include "common/error.h"

namespace dlrun::rendezvous {

void MemoryStore::set(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mutex_);
    data_[key] = value;
  }
  changed_.notify_all();
}

std::string MemoryStore::get(const std::string& key) {
  std::unique_lock lock(mutex_);
  waitLocked(lock, {key}, timeout_);
  return data_.at(key);
}

int64_t MemoryStore::add(const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = data_.find(key);
    if (it != data_.end()) {
      const std::string& text = it->second;
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size())
        throw Error("add: the value of key '" + key + "' is not an integer");
    }
    if (__builtin_add_overflow(value, delta, &value))
      throw Error("add: the value of key '" + key + "' would overflow a 64-bit integer");
    data_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

std::string MemoryStore::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  std::string stored;
  {
    std::lock_guard lock(mutex_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;
      it = data_.emplace(key, desired).first;
    } else if (it->second == expected) {
      it->second = desired;
    }
    stored = it->second;
  }
  changed_.notify_all();
  return stored;
}

bool MemoryStore::deleteKey(const std::string& key) {
  std::lock_guard lock(mutex_);
  return data_.erase(key) > 0;
}

bool MemoryStore::check(const std::vector<std::string>& keys) {
  std::lock_guard lock(mutex_);
  return hasAll(keys);
}

void MemoryStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  waitLocked(lock, keys, timeout);
}

int64_t MemoryStore::numKeys() {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(data_.size());
}

void MemoryStore::append(const std::string& key, const std::string& value) {
  {
    std::lock_guard lock(mutex_);
    data_[key] += value;
  }
  changed_.notify_all();
}

std::vector<std::string> MemoryStore::multiGet(const std::vector<std::string>& keys) {
  std::unique_lock lock(mutex_);
  waitLocked(lock, keys, timeout_);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(data_.at(key));
  return values;
}

void MemoryStore::multiSet(const std::vector<std::string>& keys,
                           const std::vector<std::string>& values) {
  requireSameLength(keys, values);
  {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) data_[keys[i]] = values[i];
  }
  changed_.notify_all();
}

void MemoryStore::waitLocked(std::unique_lock<std::mutex>& lock,
                             const std::vector<std::string>& keys,
                             std::chrono::milliseconds timeout) {
  if (!changed_.wait_for(lock, timeout, [&] { return hasAll(keys); }))
    throw TimeoutError("timed out after " + std::to_string(timeout.count()) +
                       " ms waiting for store keys");
}

bool MemoryStore::hasAll(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return data_.contains(k); });
}

}  // namespace dlrun::rendezvous
