#include "agents/quarantine.h"

#include <cmath>

namespace dlrun::agents {

namespace {

std::string seconds(std::chrono::milliseconds span) {
  return std::to_string(static_cast<long long>(std::ceil(span.count() / 1000.0))) + " s";
}

}  // namespace

bool Quarantine::failed(Clock::time_point when) {
  if (options_.after <= 0) return false;
  failures_.push_back(when);
  while (!failures_.empty() && when - failures_.front() > options_.window) failures_.pop_front();
  if (static_cast<int>(failures_.size()) < options_.after) return false;
  until_ = when + options_.coolDown;
  counted_ = static_cast<int>(failures_.size());
  failures_.clear();  // let in again, it starts with a clean record
  return true;
}

std::optional<std::string> Quarantine::reason(Clock::time_point now) const {
  if (!until_ || now >= *until_) return std::nullopt;
  return "quarantined: its workers failed " + std::to_string(counted_) + " times within " +
         seconds(options_.window) + " (--quarantine-after); let in again in " +
         seconds(std::chrono::duration_cast<std::chrono::milliseconds>(*until_ - now));
}

}  // namespace dlrun::agents
