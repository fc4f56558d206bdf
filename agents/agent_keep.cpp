// Keeping the workers through a re-rendezvous (--recovery=in-process, agent.md): a node lost,
// the survivors' agents offer their running workers to the next round, which keeps their places
// when a newcomer can take the lost node's (planRound); the newcomer's workers then join them in
// process. A round that cannot keep them restarts them with everyone's, as without the flag.
#include <signal.h>

#include <utility>

#include "agents/agent_impl.h"
#include "agents/recovery.h"
#include "common/host_port.h"
#include "common/log.h"
#include "store/tcp_store.h"

namespace dlrun::agents::detail {

// Why this node's workers cannot be kept through the next round, or empty: they can.
std::string AgentImpl::keepRefusal(const rendezvous::RoundEnd& end) const {
  if (!options_.inProcessRecovery) return "no --recovery=in-process";
  if (end.kind != rendezvous::RoundEnd::Kind::NodeLost) return "not a lost node";
  if (!options_.roles.empty()) return "--roles";
  if (starting_) return "its workers were still starting";
  if (world_.workerEndpoints.size() != static_cast<size_t>(world_.worldSize))
    return "the round's roster is unknown";
  for (const auto& w : workers_) {
    const auto mark = recovery::readMark(recoveryDir_, w->localRank());
    const std::string rank = "rank " + std::to_string(w->rank());
    if (!w->alive()) return rank + " has exited";
    if (!mark || mark->pid != w->pid()) return rank + " is not in dlrun.recovery's loop";
    if (mark->done) return rank + " has left dlrun.recovery's loop";
  }
  return "";
}

// A round that ended as a lost node: true when this node keeps its workers running into the
// next round, offered to it; false when they stop as without --recovery=in-process.
bool AgentImpl::keepThroughNextRound(const rendezvous::RoundEnd& end) {
  if (const std::string why = keepRefusal(end); !why.empty()) {
    if (options_.inProcessRecovery && end.kind == rendezvous::RoundEnd::Kind::NodeLost)
      log::info("this node's workers stop (" + why + "): " + end.describe());
    return false;
  }
  rendezvous::KeptWorkers kept{.spaceRound = world_.spaceRound,
                               .groupRank = world_.groupRank,
                               .groupWorldSize = world_.groupWorldSize,
                               .baseRank = world_.baseRank,
                               .worldSize = world_.worldSize};
  for (int local = 0; local < world_.localWorldSize; ++local)
    kept.workerPorts.push_back(
        parseHostPort(world_.workerEndpoints.at(world_.baseRank + local), 0).port);
  keptOffer_ = kept;
  log::info("keeping this node's workers through the re-rendezvous for an in-process recovery (" +
            end.describe() + "): the lost node's ranks may join them in process");
  rendezvous_.offerKept(kept);
  keeping_ = true;
  beginRound();
  return true;
}

// The round that followed a kept one: it kept this node's workers (they run on in it), or not
// (they stop, and the round's workers start anew).
void AgentImpl::afterKeeping(const rendezvous::World& world) {
  keeping_ = false;
  if (!world.keptWorkers) {
    log::info("round " + std::to_string(world.round) +
              " could not keep this node's workers: restarting them with every node's");
    pendingWorld_ = world;
    return stop(SIGTERM);
  }
  const int last = world.baseRank + world.localWorldSize - 1;
  const bool renumbered = world.baseRank != keptOffer_->baseRank;
  const std::string what =
      "round " + std::to_string(world.round) + " kept ranks " +
      std::to_string(keptOffer_->baseRank) + "-" +
      std::to_string(keptOffer_->baseRank + world.localWorldSize - 1) + " running" +
      (world.worldSize == keptOffer_->worldSize
           ? "; the lost node's ranks join them"
           : (renumbered
                  ? " as ranks " + std::to_string(world.baseRank) + "-" + std::to_string(last)
                  : std::string()) +
                 " of " + std::to_string(world.worldSize) + " (no node took the lost one's place)");
  if (renumbered) {
    renumbered_ = true;
    for (const auto& w : workers_) w->renumber(world.baseRank + w->localRank());
  }
  world_ = world;
  state_ = State::Running;
  log::info(what);
  publishEvent("kept", -1, what);
  for (const auto& w : workers_) {
    if (w->alive() || w->status().success()) continue;
    // It died while the round formed: a failure of the new round, restarting the group.
    publishEvent("worker_failed", w->rank(), w->status().describe());
    reportFailure(*w);
    return stop(SIGTERM);
  }
  if (hang_) watchForHangs();
  for (const auto& observer : observers_)
    observer->onRoundStarted(world_, static_cast<int>(workers_.size()), Clock::now());
  publishNode(stateName());
  if (liveEnding_ == 0) onSucceeded();
}

// On the rendezvous thread, before the round that kept this node's workers begins here: when it
// gave them other numbers (a smaller job), it tells them in their store, where their loops wait
// for the lost node's ranks. A store that does not answer leaves them to their deadline (the
// loop's fallback, a whole-group restart): it answered the space's opening a moment ago.
void AgentImpl::renumberKept(const rendezvous::World& world) {
  if (world.baseRank == keptOffer_->baseRank && world.worldSize == keptOffer_->worldSize) return;
  try {
    TcpStore store({.host = world.masterAddr,
                    .port = world.masterPort,
                    .timeout = std::chrono::seconds(5),
                    .connectTimeout = std::chrono::seconds(5),
                    .reconnect = false});
    const int generation =
        static_cast<int>(store.add(std::string(recovery::kGenerationKey), 0)) + 1;
    const auto keys = recovery::renumbering(generation, keptOffer_->baseRank, world.baseRank,
                                            world.localWorldSize, world.worldSize);
    for (const auto& [key, value] : keys) store.set(key, value);
    // A SET has no reply: one read after them, so that none is lost as the connection closes.
    store.check({keys.back().first});
  } catch (const Error& e) {
    log::info(std::string("cannot tell the kept workers their new ranks: ") + e.what());
  }
}

}  // namespace dlrun::agents::detail
