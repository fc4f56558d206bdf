// In-process recovery in the simulation (issue 55): dlrun.recovery's generation protocol
// (python/dlrun/recovery.py), step for step over a simulated workers' store, and the agent's
// choice between a lone replacement and the whole-group restart (the production
// agents::recovery::refusal), for the workers of the rounds the production rendezvous forms.
//
// The model, where it differs from the real workers: a node's workers are tasks of its agent's
// owner (an agent killed or stopped takes them with it); gloo's process groups and collectives
// are kept in memory (a group per round and generation key space; a collective completes on
// each rank at its own time once every rank entered it, and a rank that dies breaks it for the
// ranks not yet done, as a ring all-reduce does); a training step is one all-reduce, applied at
// once (the optimizer's step); the weights are a hash chain of the steps taken, so a step lost
// or taken twice, or two ranks apart, shows. The recovery polls the store every 100 ms (10 ms in
// the program). Each round's workers' store is served by its group rank 0's agent and goes
// with it. A round that keeps running workers (a node lost) leaves them in the key space and
// store of the round they started in; a newcomer's workers join them there, and renumbered
// survivors learn their numbers there, as the program does.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "rendezvous/world.h"
#include "tests/sim/sim_record.h"
#include "tests/sim/sim_store.h"

namespace dlrun::sim {

class InProcess {
 public:
  InProcess(Simulation& sim, Record& record, NetworkShape network);
  ~InProcess();

  // How a node's workers of one round ended.
  struct Outcome {
    enum class Kind { Finished, Failed, Stopped } kind = Kind::Stopped;
    int rank = 0;          // Failed: the rank whose failure ends the round
    int exitCode = 0;      // and its exit code (-1: killed)
    int loneRestarts = 0;  // ranks of the node replaced alone in the round
    std::string why;       // Failed: why no lone replacement
  };
  // In the agent's worker task of `owner`: runs the node's workers of `world` until they all
  // finish, one fails in a way only the whole group's restart mends, or `stopped()`.
  Outcome run(int owner, const std::string& label, const rendezvous::World& world, RoundId id,
              const std::function<bool()>& stopped);

  // A lost node's round ended: where `owner`'s workers can be kept running into the next round,
  // what its agent offers it (AgentImpl::keepThroughNextRound), else nothing.
  std::optional<rendezvous::KeptWorkers> keepable(int owner) const;
  // Of `kept` (pid -> its generation when kept), the running ones that have not seen the lost
  // node's failure yet (AgentImpl::unseeing); those killed as never seeing it (watchKept), whose
  // failure restarts the whole group.
  std::map<int, int> keptGenerations(int owner) const;
  std::map<int, int> unseeing(int owner, const std::map<int, int>& kept) const;
  void stopUnseeing(int owner, const std::map<int, int>& kept);
  // Its agent offered them (it rejoins: it replaces no failed one meanwhile), the lost node's
  // round having ended at `since`.
  void keeping(int owner, Time since);
  // The next round (`round`) kept them: they run on in it, told their new ranks where it gave
  // them others (the run() under way goes on, in the new world).
  void adopt(int owner, const std::string& label, const rendezvous::World& world, RoundId round);

  // Faults. SIGKILL to a worker of `owner` that runs (false: none does).
  bool killWorker(int owner);
  // SIGKILL to the first worker to leave its loop, as it does (its failure, past the loop's
  // last barrier, restarts the whole group).
  void killFirstToLeave();
  // The node of a recovery's source lost (`lose(owner)`) as that recovery's last barrier
  // returns, before the source says the generation formed; once, the first time the source's
  // node does not serve the workers' store (it rarely does not: rank 0's does).
  void loseSourceNode(std::function<void(int owner)> lose);
  // `owner`'s process is gone: its workers die, and the workers' stores it served.
  void agentGone(int owner);
  void cutRandomLink();
  void loseReplies(double probability);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlrun::sim
