// What the schedulers' discovery (slurm/, mpi/) shares: the environment it reads, the flags
// the user gave (which win over anything discovered), the settings it hands the launcher (one
// type, so the launcher merges them in one place), and the range of derived store ports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/environment.h"
#include "common/host_port.h"

namespace dlrun::discovery {

// What the user gave on the command line (or as PET_*); unset or false: not given.
struct UserFlags {
  bool nnodes = false;
  bool nodeRank = false;
  bool rdzvEndpoint = false;
  bool rdzvId = false;
  bool nprocAuto = false;  // --nproc-per-node=auto (Slurm alone reads it)
};

// The settings a scheduler supplies; each is unset where the user's flag wins or the scheduler
// says nothing. mpirun gives only the first five.
struct Settings {
  std::optional<std::string> rdzvId;
  std::optional<HostPort> endpoint;     // the store, its host by name: the launch resolves it
  std::optional<int> nodeRank;          // the group-rank hint: ranks follow its order
  std::optional<int> nnodes;            // a fixed size
  std::optional<bool> servesStore;      // with a derived endpoint: whether this node serves it
  std::optional<int> nprocPerNode;      // --nproc-per-node=auto as the scheduler sizes the node
  std::optional<std::string> nodeName;  // the node's name in messages
  // The job's nodes by name, where the endpoint is derived: the hosts that store admits.
  std::vector<std::string> nodes;
  // The nodes are the scheduler's allocation: a lost node's place goes to a spare for good.
  bool refuseLostNodes = false;
  // Times the scheduler started this job again (Slurm's requeues; 0: the first run of a job it
  // may requeue; unset: none it would): the agent continues the log tree of the run before.
  std::optional<int> requeues;
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
