// What the schedulers' discovery (slurm/, mpi/) shares: the environment it reads, the flags
// the user gave (which win over anything discovered), and the range of derived store ports.
#pragma once

#include <cstdint>

#include "common/environment.h"

namespace dlrun::discovery {

// What the user gave on the command line (or as PET_*); unset or false: not given.
struct UserFlags {
  bool nnodes = false;
  bool nodeRank = false;
  bool rdzvEndpoint = false;
  bool rdzvId = false;
  bool nprocAuto = false;  // --nproc-per-node=auto (Slurm alone reads it)
};

// The derived store port: kPortBase + a job key % kPortRange, i.e. 29400-31399 (torchrun's
// c10d port upward, below Linux's ephemeral ports). Every node of a job computes the same
// port, and jobs sharing a node differ unless their keys are equal modulo kPortRange.
inline constexpr uint16_t kPortBase = 29400;
inline constexpr int kPortRange = 2000;

inline uint16_t derivedPort(uint64_t jobKey) {
  return static_cast<uint16_t>(kPortBase + jobKey % kPortRange);
}

}  // namespace dlrun::discovery
