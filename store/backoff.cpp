#include "store/backoff.h"

#include <algorithm>

namespace dlrun {

ExponentialBackoff::ExponentialBackoff(std::chrono::milliseconds initial,
                                       std::chrono::milliseconds max, double factor, double jitter)
    : initial_(initial),
      max_(max),
      factor_(factor),
      jitter_(std::clamp(jitter, 0.0, 1.0)),
      current_(static_cast<double>(initial.count())),
      random_(std::random_device{}()) {}

std::chrono::milliseconds ExponentialBackoff::next() {
  std::uniform_real_distribution<double> spread(1.0 - jitter_, 1.0 + jitter_);
  const double delay = current_ * spread(random_);
  current_ = std::min(current_ * factor_, static_cast<double>(max_.count()));
  return std::chrono::milliseconds(static_cast<int64_t>(delay));
}

void ExponentialBackoff::reset() { current_ = static_cast<double>(initial_.count()); }

}  // namespace dlrun
