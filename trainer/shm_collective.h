// Summing over ranks that share one machine through a shared-memory segment instead of Gloo's
// TCP, which costs milliseconds a step even between two processes of one machine: each rank
// copies its values in, sums a stripe of everyone's values (in rank order, so every rank gets
// the same bits) and copies the sums out, with two futex barriers per call.
#pragma once

#include <memory>

#include "store/store.h"
#include "trainer/collective.h"

namespace dlrun::trainer {

// Every rank must call it. Rank 0 creates the segment and names it in `store` (namespaced per
// attempt by the caller); each rank maps it and tells the others through `store` whether it
// could. Returns nullptr on every rank unless all could (ranks on other machines, or in
// containers with /dev/shm of their own). Once made, a sum throws Error when a peer has exited
// while it waits, and TimeoutError when one has not arrived within 30 s (Gloo's default).
std::unique_ptr<Collective> makeSharedMemoryCollective(Store& store, int rank, int size);

}  // namespace dlrun::trainer
