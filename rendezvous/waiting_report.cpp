#include "rendezvous/waiting_report.h"

#include <algorithm>

namespace dlrun::rendezvous {

std::optional<std::string> WaitingReport::update(int joined, Clock::time_point now,
                                                 Clock::time_point giveUp) {
  if (joined >= minNodes_) return std::nullopt;  // the last call runs; the round closes soon
  const bool changed = lastJoined_ != joined;
  if (!changed && now - lastSaid_ < kEvery) return std::nullopt;
  lastJoined_ = joined;
  lastSaid_ = now;
  const auto left = std::chrono::ceil<std::chrono::seconds>(std::max(giveUp - now, {}));
  return "waiting for " + std::to_string(minNodes_ - joined) +
         " more node(s): " + std::to_string(joined) + " of " + std::to_string(minNodes_) +
         " joined, giving up in " + std::to_string(left.count()) + " s";
}

std::vector<std::string> missingNodes(const std::vector<std::string>& expected,
                                      const std::vector<std::string>& joined) {
  std::vector<std::string> missing;
  for (const auto& node : expected) {
    if (std::find(joined.begin(), joined.end(), node) == joined.end()) missing.push_back(node);
  }
  return missing;
}

}  // namespace dlrun::rendezvous
