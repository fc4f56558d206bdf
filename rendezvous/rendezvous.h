// The step that turns "this node wants to run N workers" into a World, and that says when and
// why each round ends. The agent calls next() before every round (the first start and each
// restart), then awaitEnd() until the round is over; both block, so the agent makes them on a
// thread of its own. The rendezvous, not the agent, counts failure restarts against
// --max-restarts and decides when a failure is final, for one node as for several.
// Implementations: LocalRendezvous (one node) and ElasticRendezvous (several nodes over a store).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "rendezvous/round_end.h"
#include "rendezvous/world.h"

namespace dlrun::rendezvous {

// A World when this node is a member of the new round; a RoundEnd when the job ended (it
// finished, or failed for good) while this node waited to join.
using JoinResult = std::variant<World, RoundEnd>;

// What a round's members tell each other (Rendezvous::shareWithRound).
enum class RoundTopic {
  Hang,          // a hang ended the round: each member's ranks' stacks (agents/hang_watcher.h)
  ProbeAddress,  // where each member's agent answers the network probe (agents/network_probe.h)
  Probe,         // what each member measured of its link to the next
  Failures,      // a final failure: each member's failed workers (agents/failure_summary.h)
};
inline constexpr RoundTopic kRoundTopics[] = {RoundTopic::Hang, RoundTopic::ProbeAddress,
                                              RoundTopic::Probe, RoundTopic::Failures};

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // Blocks until the next round's world is known. Throws Error when it cannot be formed.
  virtual JoinResult next() = 0;
  // Blocks until the current round ends, for whatever reason and on whichever node.
  virtual RoundEnd awaitEnd() = 0;

  // A worker of this node failed: ends the round for every node, counting the failure
  // (RoundEnd::countFailure) against the job's --max-restarts.
  virtual void reportFailure(RoundEnd failure) = 0;
  // Every worker of this node exited 0; the round ends as Finished once every node's did.
  virtual void reportSuccess() = 0;
  // A terminating signal reached this node's dlrun from its user (Ctrl-C, scancel, kill):
  // tells every node before this one stops its workers. Returns how the job ends for this
  // node: Stopped (every node stops and exits 128 + signal), or NodeLeft where only this node
  // leaves an elastic job that stays at or above its minimum (stop_policy=node).
  virtual RoundEnd reportStop(int signal) = 0;
  // The node serving this round's workers' store (`what` names it) is gone: the round ends as
  // NodeLost at once, without waiting for its lease to lapse.
  virtual void reportLost(const std::string& what) = 0;
  // What the members of a round tell each other beside the rendezvous (text the agent encodes),
  // one text a member and topic, for the round it is a member of: each member shares its own;
  // a member gathers every member's, waiting up to `timeout` for those still missing: one
  // entry a member in the round's order, empty for one that sent nothing in time. Both may
  // block: the agent calls them on a thread of its own.
  virtual void shareWithRound(RoundTopic topic, const std::string& text) = 0;
  virtual std::vector<std::string> gatherFromRound(RoundTopic topic,
                                                   std::chrono::milliseconds timeout) = 0;
  // The next next() offers this node's running workers (a node lost, --recovery=in-process):
  // the round keeps them where it can (World::keptWorkers). Called before that next(), on the
  // thread that then runs it or one that starts it; one node's rendezvous loses no node.
  // `dropped` is called (on next()'s thread) where that next() goes on without them: this node
  // came too late for the round, and waits as a spare; its workers must stop meanwhile.
  virtual void offerKept(const KeptWorkers& kept, std::function<void()> dropped) {
    (void)kept;
    (void)dropped;
  }
  // `waiting` is called (on next()'s thread) each time a next() begins to wait as a spare: the
  // job runs on its maximum of nodes (--ready-spares starts the workers ahead then). Called
  // before the first next(); one node's rendezvous has no spares.
  virtual void whenSpare(std::function<void()> waiting) { (void)waiting; }
  // Makes a blocked next()/awaitEnd() give up at once (they throw or report a lost store).
  // Callable from any thread.
  virtual void interrupt() = 0;
};

}  // namespace dlrun::rendezvous
