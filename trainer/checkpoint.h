// Checkpoints: the model, the optimizer's momentum and where training stands, in one file
// written atomically (a temporary file, fsync, rename, fsync of the directory) and guarded by a
// CRC, so a checkpoint torn mid-write is never loaded. The newest valid one wins at start.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dlrun::trainer {

struct Checkpoint {
  int epoch = 0;               // the epoch in progress
  int64_t samplesInEpoch = 0;  // global samples of that epoch already trained on
  int64_t globalStep = 0;
  std::vector<int> widths;  // the model's layer widths, checked on load
  std::vector<float> params;
  std::vector<float> velocity;
};

// Writes `dir`/checkpoint-<globalStep>.bin and keeps the newest `keep` files. Throws Error
// naming the directory when it cannot be written; a failed write leaves no file behind.
void saveCheckpoint(const std::string& dir, const Checkpoint& checkpoint, int keep = 2);

// The newest checkpoint in `dir` that reads back whole, or nullopt.
std::optional<Checkpoint> loadNewestCheckpoint(const std::string& dir);

// Reads one file; nullopt when it is torn, corrupt or not a checkpoint.
std::optional<Checkpoint> readCheckpoint(const std::string& path);

}  // namespace dlrun::trainer
