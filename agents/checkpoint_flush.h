// In-memory checkpoints written to --checkpoint-dir as the agent ends (docs/guides/checkpoints.md):
// the copies its workers left in the node's memory (checkpoint_memory.h) would go with it, and a
// job launched again (a requeue after a preemption, a new launch after a failure) loads them
// from the directory instead (python/dlrun/checkpoint.py reads both alike).
//
// Each rank's marked copies (rank-R/slot-K/{tensors,meta,step}: whole once `step` exists) go to
// DIR/rank-R/step-S/ with the same three files, made under a name of its own, synced, then
// renamed: a step there is whole or absent. A rank keeps its two newest steps there: the job's
// newest complete step is among the two newest copies of every rank, so the ranks always find
// one in common.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace dlrun::agents {

// The step a copy's mark names ("STEP CHECKSUM"), nothing for anything else (pure).
std::optional<int64_t> markedStep(const std::string& mark);

struct FlushReport {
  std::vector<std::pair<int, int64_t>> written;  // (rank, step) of each copy written
  std::vector<std::string> problems;             // one line each: a copy that could not be
};

// Writes the copies in `memory` that `dir` lacks, then leaves each of those ranks its two newest
// steps in `dir`.
FlushReport flushCheckpoints(const std::filesystem::path& memory, const std::filesystem::path& dir);

}  // namespace dlrun::agents
