// Keeping the workers through a re-rendezvous (--recovery=in-process, agent.md): a node lost,
// the survivors' agents offer their running workers to the next round, which keeps their places
// when a newcomer can take the lost node's (planRound); the newcomer's workers then join them in
// process. A round that cannot keep them restarts them with everyone's, as without the flag.
#include <signal.h>

#include <algorithm>
#include <cstdio>
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
  // Its lease lapsed (a pause, a partition): the others go on without it.
  if (end.node == options_.nodeName) return "this node was the one lost";
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
// next round; false when they stop as without --recovery=in-process. They are kept at once,
// not once each saw the lost node's failure: a survivor sees it at its step's collective, after
// the step's compute, and the round that takes a spare in (the spare's workers' start) need not
// wait for that. watchKept stops those that never see it.
bool AgentImpl::keepThroughNextRound(const rendezvous::RoundEnd& end) {
  if (const std::string why = keepRefusal(end); !why.empty()) {
    if (options_.inProcessRecovery && end.kind == rendezvous::RoundEnd::Kind::NodeLost)
      log::info("this node's workers stop (" + why + "): " + end.describe());
    return false;
  }
  std::map<pid_t, int> kept;
  double slowestStep = 0;
  for (const auto& w : workers_) {
    const auto mark = recovery::readMark(recoveryDir_, w->localRank());
    kept[w->pid()] = mark->generation;
    slowestStep = std::max(slowestStep, mark->stepSeconds);
  }
  keep(end);
  const auto grace = recovery::keepGrace(slowestStep);
  watchKept(std::move(kept), Clock::now() + grace, grace);
  return true;
}

// A kept worker has seen the failure once its mark says it recovers, or names a later
// generation (it recovered since); one gone or replaced is another path's to handle.
std::map<pid_t, int> AgentImpl::unseeing(const std::map<pid_t, int>& kept) const {
  std::map<pid_t, int> left;
  for (const auto& w : workers_) {
    const auto it = kept.find(w->pid());
    if (it == kept.end() || !w->alive()) continue;
    const auto mark = recovery::readMark(recoveryDir_, w->localRank());
    if (mark && mark->pid == w->pid() && (mark->recovering || mark->generation > it->second))
      continue;
    left.insert(*it);
  }
  return left;
}

// One that has not by `deadline` (recovery::keepGrace: its step watch would have freed it from
// a node that is silent rather than gone) is stuck where nothing frees it, and would hold the
// others until its collective's timeout: it is killed, and its death fails the round that kept
// it (afterKeeping, or onWorkerExit once that round runs), which restarts the whole group.
void AgentImpl::watchKept(std::map<pid_t, int> kept, Clock::time_point deadline,
                          std::chrono::milliseconds grace) {
  kept = unseeing(kept);
  if (kept.empty()) return;
  if (Clock::now() < deadline) {
    keepTimer_.expires_after(kKeepLook);
    keepTimer_.async_wait([this, kept, deadline, grace](const boost::system::error_code& ec) {
      if (!ec) watchKept(kept, deadline, grace);
    });
    return;
  }
  char within[32];
  std::snprintf(within, sizeof within, "%.1f s", grace.count() / 1000.0);
  for (const auto& w : workers_) {
    if (!kept.contains(w->pid())) continue;
    log::info("rank " + std::to_string(w->rank()) + " did not see the lost node's failure within " +
              within + " (it may be stuck): it stops, and the whole group restarts");
    keptUnseeing_.insert(w->pid());
    w->signal(SIGKILL);
  }
}

void AgentImpl::keep(const rendezvous::RoundEnd& end) {
  std::vector<uint16_t> ports;
  for (int local = 0; local < world_.localWorldSize; ++local)
    ports.push_back(parseHostPort(world_.workerEndpoints.at(world_.baseRank + local), 0).port);
  const rendezvous::KeptWorkers kept = rendezvous::keptFrom(world_, std::move(ports));
  keptOffer_ = kept;
  log::info("keeping this node's workers through the re-rendezvous for an in-process recovery (" +
            end.describe() + "): the lost node's ranks may join them in process");
  rendezvous_.offerKept(kept, [this] { asio::post(io_, [this] { dropKept(); }); });
  keeping_ = true;
  beginRound();
}

// The join went on without the kept workers (this node came too late for the round, and waits
// as a spare; or the round formed with it and it never learnt its place): they stop now, not
// when it next becomes a member.
void AgentImpl::dropKept() {
  if (!keeping_ || state_ != State::Joining) return;
  keeping_ = false;
  log::info("the re-rendezvous went on without this node's kept workers: they stop");
  signalWorkers(SIGTERM);
  stopTimer_.expires_after(options_.stopTimeout);
  stopTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && state_ == State::Joining) signalWorkers(SIGKILL);
  });
}

// The round that followed a kept one: it kept this node's workers (they run on in it), or not
// (they stop, or have, and the round's workers start anew).
void AgentImpl::afterKeeping(const rendezvous::World& world) {
  const bool keeping = std::exchange(keeping_, false);
  if (!keeping || !world.keptWorkers) {
    log::info("round " + std::to_string(world.round) +
              " could not keep this node's workers: restarting them with every node's");
    pendingWorld_ = world;
    return stop(SIGTERM);
  }
  const bool renumbered =
      world.baseRank != keptOffer_->baseRank || world.worldSize != keptOffer_->worldSize;
  auto span = [&](int base) {
    return std::to_string(base) + "-" + std::to_string(base + world.localWorldSize - 1);
  };
  std::string what = "round " + std::to_string(world.round) + " kept ranks " +
                     span(keptOffer_->baseRank) + " running";
  if (world.worldSize == keptOffer_->worldSize)
    what += "; the lost node's ranks join them";
  else
    what += " as ranks " + span(world.baseRank) + " of " + std::to_string(world.worldSize) +
            " (no node took the lost one's place)";
  if (renumbered) {
    renumbered_ = true;
    for (const auto& w : workers_) w->renumber(world.baseRank + w->localRank());
  }
  world_ = world;
  kept_ = true;
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

// On the rendezvous thread, before it joins the round after a lost node's (`world`, that round,
// whose workers this node keeps): their step watches are told that their step cannot end (each
// rank's move key made, naming no round yet, and the next generation's arrivals), so they
// recover now, not once the next round formed (one computing its step once it reaches its
// collective), and wait in their meeting when their move comes. A store slow to answer is left to
// the move: this delays the join.
void AgentImpl::freeKept(const rendezvous::World& world) {
  try {
    TcpStore store({.at = {world.masterAddr, world.masterPort},
                    .timeout = std::chrono::milliseconds(500),
                    .connectTimeout = std::chrono::milliseconds(250),
                    .reconnect = false,
                    .handshakeTimeout = std::chrono::milliseconds(500)});
    const int generation =
        static_cast<int>(store.add(std::string(recovery::kGenerationKey), 0)) + 1;
    for (int local = 0; local < world.localWorldSize; ++local)
      store.add(recovery::moveKey(generation, world.baseRank + local), 0);
    store.add(recovery::arrivedKey(generation), 0);
  } catch (const Error& e) {
    log::debug(std::string("cannot free the kept workers before the round: ") + e.what());
  }
}

// On the rendezvous thread, before the round that kept this node's workers begins here: it
// tells them, in their store, where their loops wait for the lost node's ranks, to meet again
// under the round's own keys (with its newcomers, never with the lost node's workers should
// they come back), and their numbers in it. A store that does not answer leaves them to their
// deadline (the loop's fallback, a whole-group restart): it answered the space's opening a
// moment ago.
void AgentImpl::moveKept(const rendezvous::World& world) {
  try {
    TcpStore store({.at = {world.masterAddr, world.masterPort},
                    .timeout = std::chrono::seconds(5),
                    .connectTimeout = std::chrono::seconds(5),
                    .reconnect = false});
    const int generation =
        static_cast<int>(store.add(std::string(recovery::kGenerationKey), 0)) + 1;
    const auto keys = recovery::moving(generation, world.round, keptOffer_->baseRank,
                                       world.baseRank, world.localWorldSize, world.worldSize);
    for (const auto& [key, value] : keys) store.set(key, value);
    store.add(recovery::arrivedKey(generation), 0);  // frees them from a step that cannot end
    recovery::tellNews(store, recovery::newsKey(generation));
    // A SET has no reply: one read after them, so that none is lost as the connection closes.
    store.check({keys.back().first});
  } catch (const Error& e) {
    log::info(std::string("cannot tell the kept workers where to meet: ") + e.what());
  }
}

}  // namespace dlrun::agents::detail
