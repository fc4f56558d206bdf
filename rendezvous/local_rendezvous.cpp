#include "rendezvous/local_rendezvous.h"

#include "rendezvous/store/address.h"
#include "rendezvous/store/tcp_stream.h"

namespace dlrun::rendezvous {

JoinResult LocalRendezvous::next() {
  World world;
  world.runId = options_.runId;
  world.round = round_++;
  world.localWorldSize = options_.localWorldSize;
  world.worldSize = options_.localWorldSize;
  world.masterAddr = options_.storeAddr;
  world.masterPort = options_.storePort;
  for (uint16_t port : reserveFreePorts(options_.hostAddr, options_.localWorldSize))
    world.workerEndpoints.push_back(joinHostPort(options_.hostAddr, port));
  return world;
}

}  // namespace dlrun::rendezvous
