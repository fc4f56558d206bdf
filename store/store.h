// The key-value store every part of dlrun coordinates through: the rendezvous, the agent and
// the trainer take a Store&. Implementations: TcpStore (a client of dlrund or of any PyTorch
// TCPStore server), MemoryStore (in-process, on dlrund's engine) and PrefixStore (a namespace
// over another store); the first two also lease (leasing_store.h). Values are byte strings.
// Every method may block; each is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace dlrun {

class Store {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{300'000};

  virtual ~Store() = default;

  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits up to the store's timeout for the key to exist; throws TimeoutError.
  virtual std::string get(const std::string& key) = 0;
  // Adds to a decimal integer value (missing counts as 0) and returns the result.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Sets `desired` if the value equals `expected` (a missing key matches an empty `expected`);
  // returns the value stored afterwards.
  virtual std::string compareSet(const std::string& key, const std::string& expected,
                                 const std::string& desired) = 0;
  // Returns whether the key existed.
  virtual bool deleteKey(const std::string& key) = 0;
  // Whether every key exists, without waiting.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; throws TimeoutError after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual int64_t numKeys() = 0;
  // Appends to the value, creating the key when missing.
  virtual void append(const std::string& key, const std::string& value) = 0;
  // Waits like get() for every key, then reads them all at once.
  virtual std::vector<std::string> multiGet(const std::vector<std::string>& keys) = 0;
  // Throws Error when the two lists differ in length.
  virtual void multiSet(const std::vector<std::string>& keys,
                        const std::vector<std::string>& values) = 0;

 protected:
  // Throws Error unless multiSet got as many values as keys.
  static void requireSameLength(const std::vector<std::string>& keys,
                                const std::vector<std::string>& values);
};

// A counter's value as ADD leaves it (decimal text); a missing key (empty) reads 0. Throws
// ProtocolError naming `key` for anything else.
int64_t storedCount(const std::string& text, const std::string& key);

}  // namespace dlrun
