#include "agents/crash_loop.h"

#include <algorithm>
#include <cstdio>

namespace dlrun::agents {

bool CrashLoop::ended(const AttemptEnd& attempt) {
  if (last_ == attempt.attempt) return looping_;
  last_ = attempt.attempt;
  const bool progressed =
      attempt.step ? (!best_ || *attempt.step > *best_) : attempt.livedSeconds >= shortLife_;
  if (attempt.step) best_ = std::max(best_.value_or(*attempt.step), *attempt.step);
  if (progressed) {
    stalled_ = 0;
    longest_ = 0;
  } else {
    ++stalled_;
    if (!attempt.step) longest_ = std::max(longest_, attempt.livedSeconds);
  }
  looping_ = attempts_ > 0 && stalled_ >= attempts_;
  return looping_;
}

std::string CrashLoop::describe() const {
  const std::string last = "the last " + std::to_string(stalled_) + " attempts ended ";
  if (best_) return last + "without a step past " + std::to_string(*best_);
  char lived[32];
  std::snprintf(lived, sizeof lived, "%.1f", longest_);
  return last + "within " + lived + " s of their start, no step reported";
}

}  // namespace dlrun::agents
