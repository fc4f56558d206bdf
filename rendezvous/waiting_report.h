// What an agent says while a round waits for too few nodes, and whom it names when it gives
// up. Pure (time comes from the caller), so tests reach every rule without a store.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"

namespace dlrun::rendezvous {

class WaitingReport {
 public:
  static constexpr std::chrono::seconds kEvery{10};

  explicit WaitingReport(int minNodes) : minNodes_(minNodes) {}

  // The line to print now, if any, with `joined` nodes in the round: at once when the count
  // changed, else at most every kEvery while the round is below its minimum.
  // "waiting for 1 more node(s): 2 of 3 joined, giving up in 598 s"
  std::optional<std::string> update(int joined, Clock::time_point now, Clock::time_point giveUp);

 private:
  const int minNodes_;
  std::optional<int> lastJoined_;
  Clock::time_point lastSaid_{};
};

// The nodes of `expected` (the last round's members) that are not in `joined`, in order.
std::vector<std::string> missingNodes(const std::vector<std::string>& expected,
                                      const std::vector<std::string>& joined);

}  // namespace dlrun::rendezvous
