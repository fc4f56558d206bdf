// Summing gradients across ranks: Gloo's ring all-reduce over TCP, bootstrapped through the
// dlrun store (a Gloo store adapter); shared memory where all ranks share one machine
// (shm_collective.h); one rank alone needs nothing.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "rendezvous/store/store.h"

namespace dlrun::trainer {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank ends with the element-wise sum over ranks. Blocks.
  virtual void allreduceSum(float* data, size_t count) = 0;
};

// A world of one.
std::unique_ptr<Collective> makeSoloCollective();

// Gloo over TCP. `store` is shared by all ranks (namespaced per attempt by the caller);
// `localAddr` is this host's address the other ranks can reach.
std::unique_ptr<Collective> makeGlooCollective(std::shared_ptr<rendezvous::Store> store, int rank,
                                               int size, const std::string& localAddr);

}  // namespace dlrun::trainer
