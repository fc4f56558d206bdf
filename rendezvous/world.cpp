#include "rendezvous/world.h"

namespace dlrun::rendezvous {

KeptWorkers keptFrom(const World& world, std::vector<uint16_t> workerPorts) {
  return KeptWorkers{.spaceRound = world.spaceRound,
                     .groupRank = world.groupRank,
                     .groupWorldSize = world.groupWorldSize,
                     .baseRank = world.baseRank,
                     .worldSize = world.worldSize,
                     .workerPorts = std::move(workerPorts)};
}

World makeWorld(const NodeJob& job, int round, const Placement& place,
                std::vector<std::string> workerEndpoints) {
  return World{
      .runId = job.runId,
      .round = round,
      .groupRank = place.groupRank,
      .groupWorldSize = place.groupWorldSize,
      .localWorldSize = job.localWorldSize,
      .baseRank = place.baseRank,
      .worldSize = place.worldSize,
      .failures = place.failures,
      .restarts = job.restarts,
      .masterAddr = place.masterAddr.value_or(job.store.host),
      .masterPort = place.masterPort.value_or(job.store.port),
      .storePort = place.masterPort.value_or(job.store.port),
      .spaceRound = place.keptSpace.value_or(round),
      .keptWorkers = place.keptSpace && !place.joins,
      .joinInProcess = place.keptSpace && place.joins,
      .agentStore = true,
      .workerEndpoints = std::move(workerEndpoints),
  };
}

}  // namespace dlrun::rendezvous
