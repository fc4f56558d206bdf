// The step that turns "this node wants to run N workers" into a World. An agent calls next()
// before every attempt (the first start and each restart); a multi-node implementation blocks
// there until the round closes. Implementations: LocalRendezvous (one node) and
// ElasticRendezvous (several nodes over a store).
#pragma once

#include <variant>

#include "rendezvous/round_end.h"
#include "rendezvous/world.h"

namespace dlrun::rendezvous {

// A World when this node is a member of the new round; a RoundEnd when the job ended (it
// finished, or failed for good) while this node waited to join.
using JoinResult = std::variant<World, RoundEnd>;

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Blocks until the next round's world is known. Throws Error when it cannot be formed.
  virtual JoinResult next() = 0;

  // Whether rounds also end from other nodes. Then the agent runs next() and awaitEnd() on a
  // thread of its own (they block on the network) and reports its workers' outcome; a single
  // node's rounds end only through its own workers, and none of the calls below is made.
  virtual bool multiNode() const { return false; }
  // Blocks until the current round ends, for whatever reason and on whichever node.
  virtual RoundEnd awaitEnd() { return {}; }
  // A worker of this node failed: ends the round for every node. Fills in the failure count
  // and whether the failure is final.
  virtual void reportFailure(RoundEnd failure) {}
  // Every worker of this node exited 0.
  virtual void reportSuccess() {}
  // Makes a blocked next()/awaitEnd() give up at once. Callable from any thread.
  virtual void interrupt() {}
};

}  // namespace dlrun::rendezvous
