// The single-node rendezvous: the world is this node alone; the store is the agent's own.
#pragma once

#include <string>

#include "rendezvous/rendezvous.h"

namespace dlrun::rendezvous {

struct LocalRendezvousOptions {
  std::string runId;
  int localWorldSize = 1;
  std::string storeAddr;  // where workers reach the agent's store
  uint16_t storePort = 0;
  std::string hostAddr = "127.0.0.1";  // this node's address in TF_CONFIG
};

class LocalRendezvous : public Rendezvous {
 public:
  explicit LocalRendezvous(LocalRendezvousOptions options) : options_(std::move(options)) {}
  // Each round reserves a fresh free port per worker for TF_CONFIG.
  JoinResult next() override;

 private:
  const LocalRendezvousOptions options_;
  int round_ = 0;
};

}  // namespace dlrun::rendezvous
