// Summing gradients across ranks: Gloo's ring all-reduce over TCP, bootstrapped through the
// dlrun store (a Gloo store adapter); shared memory where all ranks share one machine
// (shm_collective.h); one rank alone needs nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/progress_board.h"
#include "store/store.h"

namespace dlrun::trainer {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank ends with the element-wise sum over ranks. Blocks.
  virtual void allreduceSum(float* data, size_t count) = 0;
};

// `inner`, telling its agent's progress board (--hang-timeout) when this rank waits in an
// all-reduce and when it leaves, so a hang report tells the rank stuck elsewhere from the ranks
// it holds up. `progress` must outlive it.
std::unique_ptr<Collective> reportingProgress(std::unique_ptr<Collective> inner,
                                              ProgressReporter& progress);

// A world of one.
std::unique_ptr<Collective> makeSoloCollective();

// Gloo over TCP. `store` is shared by all ranks (namespaced per attempt by the caller);
// `localAddr` is this host's address the other ranks can reach.
std::unique_ptr<Collective> makeGlooCollective(std::shared_ptr<Store> store, int rank, int size,
                                               const std::string& localAddr);

}  // namespace dlrun::trainer
