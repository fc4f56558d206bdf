#include "rendezvous/store/store.h"

#include "common/error.h"

namespace dlrun::rendezvous {

void Store::requireSameLength(const std::vector<std::string>& keys,
                              const std::vector<std::string>& values) {
  if (keys.size() != values.size())
    throw Error("multiSet: " + std::to_string(keys.size()) + " keys but " +
                std::to_string(values.size()) + " values");
}

}  // namespace dlrun::rendezvous
