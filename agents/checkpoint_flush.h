// dlrun.checkpoint's copies in the node's memory (checkpoint_memory.h) written to --checkpoint-dir
// (docs/guides/checkpoints.md): while the job runs, the steps its workers ask for (the same step
// on every rank, every --checkpoint-write-every seconds: python/dlrun/checkpoint.py), and as the
// agent ends, every copy they left. A job launched again (a requeue after a preemption, a new
// launch after a failure or a lost host) loads them from the directory.
//
// A rank's copy in memory (checkpoint_files.h) goes to DIR/rank-R/step-S/ with the same three
// files, made under a name of its own, synced, then renamed: a step there is whole or absent.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agents/checkpoint_files.h"

namespace dlrun::agents {

// The newest step that ranks 0 to worldSize - 1 all hold, if any (pure).
std::optional<int64_t> newestInCommon(const std::map<int, std::set<int64_t>>& wholeByRank,
                                      int worldSize);

// The steps of `rank` to remove from the directory, given every rank's whole steps there (pure):
// those older than the newest step that all `worldSize` ranks hold (it and newer ones stay: the
// ranks of a new launch have it in common), and, that step aside, all but the rank's 3 newest
// (where the other ranks' copies are elsewhere, a node-local directory, the newest 3 stay).
std::set<int64_t> stepsToRemove(const std::map<int, std::set<int64_t>>& wholeByRank, int rank,
                                int worldSize);

// Every marked copy in `memory` that `dir` lacks (the workers are gone), then the rule above.
CopyReport flushCheckpoints(const std::filesystem::path& memory, const std::filesystem::path& dir,
                            int worldSize);

// The copies the workers asked for (their `write` files), then the rule above.
CopyReport writeRequested(const std::filesystem::path& memory, const std::filesystem::path& dir);

}  // namespace dlrun::agents
