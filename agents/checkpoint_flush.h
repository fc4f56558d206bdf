// dlrun.checkpoint's copies in the node's memory (checkpoint_memory.h) written to --checkpoint-dir
// (docs/guides/checkpoints.md): while the job runs, the steps its workers ask for (the same step
// on every rank, every --checkpoint-write-every seconds: python/dlrun/checkpoint.py), and as the
// agent ends, every copy they left. A job launched again (a requeue after a preemption, a new
// launch after a failure or a lost host) loads them from the directory.
//
// A rank's copy in memory is rank-R/slot-K/{tensors,meta,step}, whole once `step` ("STEP
// CHECKSUM") exists; a worker asks for it with rank-R/slot-K/write ("STEP WORLD_SIZE"). It goes
// to DIR/rank-R/step-S/ with the same three files, made under a name of its own, synced, then
// renamed: a step there is whole or absent. While the agent reads a slot it holds a shared flock
// on its `lock`; a worker takes it exclusively before it writes the slot again.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace dlrun::agents {

// The step a copy's mark names ("STEP CHECKSUM"), nothing for anything else (pure).
std::optional<int64_t> markedStep(const std::string& mark);

// The newest step that ranks 0 to worldSize - 1 all hold, if any (pure).
std::optional<int64_t> newestInCommon(const std::map<int, std::set<int64_t>>& wholeByRank,
                                      int worldSize);

// The steps of `rank` to remove from the directory, given every rank's whole steps there (pure):
// those older than the newest step that all `worldSize` ranks hold (it and newer ones stay: the
// ranks of a new launch have it in common), and, that step aside, all but the rank's 3 newest
// (where the other ranks' copies are elsewhere, a node-local directory, the newest 3 stay).
std::set<int64_t> stepsToRemove(const std::map<int, std::set<int64_t>>& wholeByRank, int rank,
                                int worldSize);

struct FlushReport {
  std::vector<std::pair<int, int64_t>> written;  // (rank, step) of each copy written
  std::vector<std::string> problems;             // one line each: a copy that could not be
};

// Every marked copy in `memory` that `dir` lacks (the workers are gone), then the rule above.
FlushReport flushCheckpoints(const std::filesystem::path& memory, const std::filesystem::path& dir,
                             int worldSize);

// The copies the workers asked for (their `write` files), then the rule above.
FlushReport writeRequested(const std::filesystem::path& memory, const std::filesystem::path& dir);

// writeRequested on a thread of its own (disk writes block) every `every` until destroyed.
class CheckpointWriter {
 public:
  CheckpointWriter(std::filesystem::path memory, std::filesystem::path dir,
                   std::chrono::milliseconds every, std::function<void(const FlushReport&)> told);
  ~CheckpointWriter();  // stops at the end of a write under way, and joins
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dlrun::agents
