// A checkpoint's copy made and summed in one pass (pure: memory in, memory out). dlrun.checkpoint
// (python/dlrun/_copies.py) calls it through the module dlrun-checkpoint-copy.so
// (checkpoint_copy_module.cpp), which the agent names to its workers as DLRUN_CHECKPOINT_COPY.
// The sums are those of CopyChecksum (checkpoint_wire.h): each 4 KiB block's 64-bit words, summed
// with wrap-around.
//
// Why native: a save blocks the training loop while it copies, and torch's copy_ reads each
// destination line before writing it and leaves the copy in the caches; the checksum then reads
// the copy again. Streaming (non-temporal) stores that also sum what they write take one pass
// over memory instead of three (on the 2-core development machine: 100 MB in 7 ms against 11).
#pragma once

#include <cstddef>
#include <cstdint>

namespace dlrun::agents {

// One tensor's bytes and where they go in the copy.
struct CopyPiece {
  const char* from = nullptr;
  uint64_t offset = 0;  // in the copy: a multiple of 8
  uint64_t bytes = 0;
};

// Writes `pieces` (in increasing offset, not overlapping) into `copy` of `size` bytes (a whole
// number of 4 KiB blocks), zeroes every byte between and after them, and sets blockSums[i] (size /
// 4096 of them) to the sum of block i as written. `copy` must be 16-byte aligned. Returns false,
// writing nothing, where the pieces do not fit that description.
bool copyAndSumBlocks(char* copy, uint64_t size, const CopyPiece* pieces, size_t count,
                      uint64_t* blockSums);

// blockSums[i] = the sum of block i of `data` (`size` bytes, a whole number of blocks).
void sumBlocks(const char* data, uint64_t size, uint64_t* blockSums);

}  // namespace dlrun::agents
