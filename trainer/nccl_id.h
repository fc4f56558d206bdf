// The NCCL communicator's unique id, made by rank 0 and handed to the other ranks through the
// job's store, as the Gloo bootstrap hands over addresses. ncclGetUniqueId needs no device, so
// this part of the CUDA engine runs (and is tested) on any machine with NCCL.
#pragma once

#include <nccl.h>

#include "store/store.h"

namespace dlrun::trainer {

// Rank 0 makes the id and sets it in `store` (which the caller namespaces per attempt); the
// others wait for it. Throws Error when NCCL cannot make one or a stored value is not an id.
ncclUniqueId shareNcclId(Store& store, int rank);

// A fresh id, for a rank alone.
ncclUniqueId newNcclId();

}  // namespace dlrun::trainer
