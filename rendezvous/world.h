// What one rendezvous round decides: who is in the job, which ranks this node's workers hold,
// where the store is, and every worker's TF_CONFIG address. Plain data; the agent turns it into
// worker environments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/host_port.h"
#include "rendezvous/round_end.h"

namespace dlrun::rendezvous {

struct World {
  std::string runId;
  int round = 0;           // rendezvous round that produced this world
  int groupRank = 0;       // this node's rank among nodes
  int groupWorldSize = 1;  // nodes in the job
  int localWorldSize = 1;  // workers on this node
  int baseRank = 0;        // RANK of this node's local rank 0
  int worldSize = 1;       // workers in the job
  int failures = 0;        // failure restarts used before this round
  RestartPolicy restarts;  // --max-restarts
  std::string masterAddr;  // numeric address of the store workers use
  // The port workers use: once the agent opened this attempt's key space on the store
  // (AgentOptions::attemptSpaces), the space's; until then the store's own.
  uint16_t masterPort = 0;
  uint16_t storePort = 0;  // the store's own port (its rendezvous, the agents' connections)
  // The round whose key space the workers use: this one's, or, where this round kept the
  // workers of an earlier one running (a node lost under --recovery=in-process), that one's.
  int spaceRound = 0;
  bool keptWorkers = false;    // this round kept this node's running workers
  bool joinInProcess = false;  // this node's new workers join kept ones (DLRUN_RECOVERY_JOIN)
  bool agentStore = true;      // the store is dlrun's own (torch then opens a client only)
  std::vector<std::string> workerEndpoints;  // "host:port" per worker, ordered by RANK
  // Each RANK's role name under --roles (agents/roles.h); empty: every worker has --role.
  std::vector<std::string> workerRoles;
};

// What stays the same for one node through every round of its job.
struct NodeJob {
  std::string runId;
  int localWorldSize = 1;
  RestartPolicy restarts;
  HostPort store;  // where the workers reach the store, unless a round's Placement names it
};

// Workers an agent keeps running into the next round (a node lost under --recovery=in-process),
// where they stand: the next round may keep their places, the lost node's going to a newcomer
// whose workers join them in process.
struct KeptWorkers {
  int spaceRound = 0;  // the round whose workers' key space they use
  int groupRank = 0;
  int groupWorldSize = 1;
  int baseRank = 0;
  int worldSize = 1;
  std::vector<uint16_t> workerPorts;  // theirs, for TF_CONFIG
  bool operator==(const KeptWorkers&) const = default;
};

// One node's place in a round, as the rendezvous decides it.
struct Placement {
  int groupRank = 0;
  int groupWorldSize = 1;
  int baseRank = 0;
  int worldSize = 1;
  int failures = 0;  // failure restarts used before this round
  // Where the workers' store is when the round decides it (etcd: served by the agent of group
  // rank 0); unset: NodeJob's store, the rendezvous store (c10d, static).
  std::optional<std::string> masterAddr;
  std::optional<uint16_t> masterPort;
  // Set where the round kept running workers: the round whose key space they use. A member
  // that `joins` starts workers that join them; the others keep theirs.
  std::optional<int> keptSpace;
  bool joins = false;
};

// What a node offers of its running workers of `world` (ports: theirs, for TF_CONFIG).
KeptWorkers keptFrom(const World& world, std::vector<uint16_t> workerPorts);

// The one way a World is made, for one node and for several.
World makeWorld(const NodeJob& job, int round, const Placement& place,
                std::vector<std::string> workerEndpoints);

}  // namespace dlrun::rendezvous
