// How long to sleep between connection attempts. Staggered, jittered retries keep thousands
// of agents that start together from hammering a store that is still coming up (and from
// overflowing its listen backlog in lockstep).
#pragma once

#include <chrono>
#include <random>

namespace dlrun {

class Backoff {
 public:
  virtual ~Backoff() = default;
  virtual std::chrono::milliseconds next() = 0;
  virtual void reset() = 0;
};

// initial, initial*factor, ... capped at `max`, each scaled by a random factor in
// [1 - jitter, 1 + jitter].
class ExponentialBackoff : public Backoff {
 public:
  explicit ExponentialBackoff(std::chrono::milliseconds initial = std::chrono::milliseconds(10),
                              std::chrono::milliseconds max = std::chrono::milliseconds(1000),
                              double factor = 2.0, double jitter = 0.5);
  std::chrono::milliseconds next() override;
  void reset() override;

 private:
  const std::chrono::milliseconds initial_, max_;
  const double factor_, jitter_;
  double current_;
  std::mt19937_64 random_;
};

}  // namespace dlrun
