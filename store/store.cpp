// The helpers Store and LeasingStore give every implementation, so that each message is
// written once.
#include "store/store.h"

#include <stdexcept>

#include "common/error.h"
#include "store/leasing_store.h"

namespace dlrun {

void Store::requireSameLength(const std::vector<std::string>& keys,
                              const std::vector<std::string>& values) {
  if (keys.size() != values.size())
    throw Error("multiSet: " + std::to_string(keys.size()) + " keys but " +
                std::to_string(values.size()) + " values");
}

void LeasingStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  if (!waitFor(keys, timeout))
    throw TimeoutError(
        "timed out after " + std::to_string(timeout.count()) + " ms waiting for store key(s) " +
        keys.front() +
        (keys.size() > 1 ? " and " + std::to_string(keys.size() - 1) + " more" : ""));
}

void LeasingStore::requirePositiveTtl(const std::string& key, std::chrono::milliseconds ttl) {
  if (ttl <= std::chrono::milliseconds::zero())
    throw Error("a lease on store key '" + key + "' needs a positive TTL, not " +
                std::to_string(ttl.count()) + " ms");
}

int64_t storedCount(const std::string& text, const std::string& key) {
  if (text.empty()) return 0;
  try {
    size_t used = 0;
    const int64_t value = std::stoll(text, &used);
    if (used == text.size()) return value;
  } catch (const std::logic_error&) {
  }
  throw ProtocolError("malformed number '" + text + "' under " + key);
}

}  // namespace dlrun
