// The step that turns "this node wants to run N workers" into a World. An agent calls next()
// before every attempt (the first start and each restart); a multi-node implementation blocks
// there until the round closes. Implementations: LocalRendezvous (one node).
#pragma once

#include "rendezvous/world.h"

namespace dlrun::rendezvous {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Blocks until the next round's world is known. Throws Error when it cannot be formed.
  virtual World next() = 0;
};

}  // namespace dlrun::rendezvous
