// The module dlrun-checkpoint-copy.so: checkpoint_copy.h for dlrun.checkpoint's workers, which
// open it with ctypes (python/dlrun/_copies.py), with a C interface no Python version binds.
// Nothing else of dlrun is linked in; the version script exports these two symbols alone.
#include "agents/checkpoint_copy.h"

using dlrun::agents::CopyPiece;

static_assert(sizeof(CopyPiece) == 24, "_copies.py passes each piece as 3 int64");

// 1 when the copy was written (checkpoint_copy.h), 0 when the pieces do not fit it.
extern "C" __attribute__((visibility("default"))) int dlrun_checkpoint_copy_in(
    char* copy, uint64_t size, const CopyPiece* pieces, size_t count, uint64_t* blockSums) {
  return dlrun::agents::copyAndSumBlocks(copy, size, pieces, count, blockSums) ? 1 : 0;
}

extern "C" __attribute__((visibility("default"))) void dlrun_checkpoint_sum_blocks(
    const char* data, uint64_t size, uint64_t* blockSums) {
  dlrun::agents::sumBlocks(data, size, blockSums);
}
