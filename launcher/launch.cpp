#include "launcher/launch.h"

#include <random>

#include "agents/agent.h"
#include "common/error.h"
#include "rendezvous/local_rendezvous.h"
#include "rendezvous/store_server.h"

namespace dlrun::launcher {

std::string newRunId() {
  std::random_device random;
  std::string id;
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) id += kHex[random() % 16];
  return id;
}

int launch(const LaunchConfig& config) {
  if (!config.singleNode())
    throw ConfigError("--nnodes=" + std::to_string(config.minNodes) + ":" +
                      std::to_string(config.maxNodes) +
                      ": multi-node rendezvous is not available in this version of dlrun");
  const std::string host = config.localAddr.value_or("127.0.0.1");
  // The store runs on its own thread: the agent's thread blocks in rendezvous rounds that
  // talk to this very store.
  rendezvous::StoreServerThread store(
      {.host = host, .port = config.masterPort.value_or(0)});
  rendezvous::LocalRendezvous rendezvous({
      .runId = config.standalone || config.rdzvId == "none" ? newRunId() : config.rdzvId,
      .localWorldSize = config.nprocPerNode,
      .storeAddr = store.address(),
      .storePort = store.port(),
      .hostAddr = store.address(),
  });
  agents::Agent agent(
      {
          .command = config.command,
          .nprocPerNode = config.nprocPerNode,
          .role = config.role,
          .maxRestarts = config.maxRestarts,
          .stopTimeout = config.stopTimeout,
          .logDir = config.logDir,
          .redirects = config.redirects,
          .tee = config.tee,
          .localRanksFilter = config.localRanksFilter,
          .logLinePrefixTemplate = config.logLinePrefixTemplate,
      },
      rendezvous);
  return agent.run();
}

}  // namespace dlrun::launcher
