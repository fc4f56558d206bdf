// Repeat offenders put out (docs/guides/health-checks.md): a node whose workers failed
// --quarantine-after times within --quarantine-window sits out the rounds of the next
// --quarantine-for, so restarts land on other nodes (a spare, or the round forms without it),
// then it is let in again. Pure: the agent tells it when its workers failed.
#pragma once

#include <chrono>
#include <deque>
#include <filesystem>
#include <optional>
#include <string>

#include "common/clock.h"

namespace dlrun::agents {

struct QuarantineOptions {
  int after = 0;  // failures of this node's workers; 0: never
  std::chrono::milliseconds window{600'000};
  std::chrono::milliseconds coolDown{600'000};
  // Where a node put out appends its name (--quarantine-file; under Slurm, by default
  // $SLURM_SUBMIT_DIR/dlrun-exclude-$SLURM_JOB_ID): a requeued batch script excludes them.
  std::optional<std::filesystem::path> file;
  std::string nodeName;  // as the scheduler names this node (SLURMD_NODENAME, else the hostname)
};

class Quarantine {
 public:
  explicit Quarantine(QuarantineOptions options) : options_(options) {}

  // One of this node's workers failed at `when` (an attempt's root cause on this node); true
  // when this failure puts the node out.
  bool failed(Clock::time_point when);
  // Why the node sits out at `now`, one line; nothing once let in.
  std::optional<std::string> reason(Clock::time_point now) const;

 private:
  QuarantineOptions options_;
  std::deque<Clock::time_point> failures_;  // within the window of the newest
  std::optional<Clock::time_point> until_;
  int counted_ = 0;  // the failures that put it out
};

}  // namespace dlrun::agents
