#include "tests/sim/sim_recovery.h"

#include <algorithm>

#include "rendezvous/round_end.h"
#include "tests/sim/sim_recovery_model.h"

namespace dlrun::sim {

InProcess::Outcome InProcess::Impl::run(int owner, const std::string& label,
                                        const rendezvous::World& world, RoundId id,
                                        const std::function<bool()>& stopped) {
  // A newcomer to a round that kept running workers joins them in their key space (the last
  // round of that number: a store restarted without its keys may count rounds again).
  RoundId space = id;
  if (const auto kept = spaces.find(world.spaceRound); world.joinInProcess && kept != spaces.end())
    space = kept->second;
  if (!world.joinInProcess) {
    spaces[world.round] = id;
    if (world.groupRank == 0) storeHost[id] = owner;
  }
  Node& node = nodes[owner];
  node = Node{{}, space, id, world, false, 0};
  std::vector<Proc*>& mine = node.mine;  // by local rank, the current process
  for (int local = 0; local < world.localWorldSize; ++local) {
    mine.push_back(&spawnProc(
        owner, label, world.baseRank + local, local, world.joinInProcess, space, world.worldSize,
        world.joinInProcess ? sim.between(kStartLow, kStartHigh) : Duration(0)));
    if (world.joinInProcess) mine.back()->joinRound = world.round;
  }
  std::map<int, int> replaced;  // local rank -> its replacement's pid
  int& lone = node.lone;
  auto stopAll = [&] {
    for (Proc* p : mine) die(*p, -1);
  };
  while (true) {
    sim.block([&] {
      return stopped() ||
             std::any_of(mine.begin(), mine.end(),
                         [](Proc* p) { return p->exited && (p->dead || p->exitCode != 0); }) ||
             std::all_of(mine.begin(), mine.end(), [](Proc* p) { return p->exited; });
    });
    if (stopped()) {
      stopAll();
      return Outcome{.kind = Outcome::Kind::Stopped, .loneRestarts = lone};
    }
    auto failed = std::find_if(mine.begin(), mine.end(),
                               [](Proc* p) { return p->exited && (p->dead || p->exitCode != 0); });
    if (failed == mine.end()) return Outcome{.kind = Outcome::Kind::Finished, .loneRestarts = lone};
    Proc& f = **failed;
    // The agent's choice (AgentImpl::restartAlone), with the production rule.
    rec::Failure failure{.exitCode = f.exitCode,
                         .marked = f.marked,
                         .done = f.done,
                         .recoveringItself = f.marked && f.recovering};
    for (const auto& [local, pid] : replaced)
      if (local != f.local && mine[static_cast<size_t>(local)]->pid == pid &&
          !mine[static_cast<size_t>(local)]->marked)
        failure.recovering.push_back(local);
    // The agent replaces none while it rejoins (AgentImpl::onWorkerExit, not Running): the
    // round that keeps them sees the failure (afterKeeping).
    std::string why = node.keeping      ? "it failed while its node rejoined"
                      : node.renumbered ? "this node's ranks were renumbered in process"
                      : f.unseeing      ? "kept after a lost node, it never saw that node's failure"
                                        : rec::refusal(failure);
    if (why.empty() && !rendezvous::RestartPolicy{record.shape.maxRestarts}.allowsRestart(
                           node.world.failures + lone + 1))
      why = "no restart left";
    if (!why.empty()) {
      sim.note(label + ": rank " + std::to_string(f.rank) + " failed; no in-process recovery (" +
               why + "): the whole group restarts");
      stopAll();
      return Outcome{.kind = Outcome::Kind::Failed,
                     .rank = f.rank,
                     .exitCode = f.exitCode,
                     .loneRestarts = lone,
                     .why = why};
    }
    ++lone;
    record.loneRestarts[node.round][owner] = lone;
    Proc& next = spawnProc(owner, label, f.rank, f.local, true, space, f.world,
                           sim.between(kStartLow, kStartHigh));
    next.afterKeep = node.kept;
    next.replacement = record.replacements.size();
    record.replacements.push_back(
        {node.round, space, owner, f.rank, sim.now(), f.exitedAt, std::nullopt});
    replaced[f.local] = next.pid;
    mine[static_cast<size_t>(f.local)] = &next;
    sim.note(label + ": rank " + std::to_string(f.rank) + " replaced alone (pid " +
             std::to_string(next.pid) + "); the other ranks keep running");
  }
}

std::optional<rendezvous::KeptWorkers> InProcess::Impl::keepable(int owner) const {
  const auto found = nodes.find(owner);
  if (found == nodes.end()) return std::nullopt;
  const Node& node = found->second;
  // As AgentImpl::keepRefusal: every worker alive and in the loop, its mark its own (kept at
  // once, whether or not it saw the failure yet: watchKept).
  for (const Proc* p : node.mine)
    if (p->exited || !p->marked || p->done) return std::nullopt;
  std::vector<uint16_t> ports;
  for (int local = 0; local < node.world.localWorldSize; ++local)
    ports.push_back(static_cast<uint16_t>(kFirstWorkerPort + local));
  return rendezvous::keptFrom(node.world, std::move(ports));
}

void InProcess::Impl::adopt(int owner, const std::string& label, const rendezvous::World& world,
                            RoundId round) {
  Node& node = nodes.at(owner);
  node.keeping = false;
  node.kept = true;
  int generation = 0;
  for (const Proc* p : node.mine) generation = std::max(generation, p->generation);
  const bool meeting =
      std::all_of(node.mine.begin(), node.mine.end(), [](const Proc* p) { return p->meeting; });
  record.kept.push_back(
      {round, node.space, owner, generation, node.keptSince, sim.now(), meeting, std::nullopt});
  node.round = round;
  if (node.lone > 0) record.loneRestarts[round][owner] = node.lone;  // the agent's count goes on
  const int oldBase = node.world.baseRank;
  node.renumbered =
      node.renumbered || world.baseRank != oldBase || world.worldSize != node.world.worldSize;
  node.world = world;
  // AgentImpl::moveKept: the agent tells its workers where to meet, and their numbers there.
  try {
    auto store = storeOf(node.space).open(owner, label + " agent");
    const int64_t committed = store->add(kKeys + "/generation", 0);
    const auto keys = rec::moving(static_cast<int>(committed) + 1, world.round, oldBase,
                                  world.baseRank, world.localWorldSize, world.worldSize);
    for (const auto& [key, value] : keys)
      store->set(key.substr(1), value);  // the "/" is torch's client's; the model's names none
    store->add(rec::arrivedKey(static_cast<int>(committed) + 1).substr(1), 0);
    rec::tellNews(*store, rec::newsKey(static_cast<int>(committed) + 1).substr(1));
    store->check({keys.back().first.substr(1)});  // a SET has no reply: one read after them
  } catch (const Error& e) {
    sim.note(label + " cannot tell the kept workers where to meet: " + e.what());
  }
}

InProcess::InProcess(Simulation& sim, Record& record, NetworkShape network)
    : impl_(std::make_unique<Impl>(sim, record, network)) {}
InProcess::~InProcess() = default;

InProcess::Outcome InProcess::run(int owner, const std::string& label,
                                  const rendezvous::World& world, RoundId id,
                                  const std::function<bool()>& stopped) {
  return impl_->run(owner, label, world, id, stopped);
}

std::optional<rendezvous::KeptWorkers> InProcess::keepable(int owner) const {
  return impl_->keepable(owner);
}

std::map<int, int> InProcess::keptGenerations(int owner) const {
  std::map<int, int> kept;
  for (const Proc* p : impl_->nodes.at(owner).mine) kept[p->pid] = p->generation;
  return kept;
}

// As AgentImpl::unseeing: one that saw it recovers, or has recovered since (a later generation).
std::map<int, int> InProcess::unseeing(int owner, const std::map<int, int>& kept) const {
  std::map<int, int> left;
  for (const Proc* p : impl_->nodes.at(owner).mine) {
    const auto it = kept.find(p->pid);
    if (it != kept.end() && !p->exited && !p->recovering && p->generation <= it->second)
      left.insert(*it);
  }
  return left;
}

void InProcess::stopUnseeing(int owner, const std::map<int, int>& kept) {
  for (Proc* p : impl_->nodes.at(owner).mine) {
    if (!kept.contains(p->pid) || p->exited) continue;
    impl_->sim.note("pid " + std::to_string(p->pid) + " (rank " + std::to_string(p->rank) +
                    ") never saw the lost node's failure: killed");
    p->unseeing = true;
    // A failure of the round that kept it, for the checks as a worker's fault: the others it
    // kept restart with it (a store stopped past the keep's grace does this to live ranks).
    impl_->record.workerFaults.push_back(impl_->sim.now());
    impl_->die(*p, -1);
  }
}

void InProcess::keeping(int owner, Time since) {
  auto& node = impl_->nodes.at(owner);
  node.keeping = true;
  node.keptSince = since;
}

void InProcess::adopt(int owner, const std::string& label, const rendezvous::World& world,
                      RoundId round) {
  impl_->adopt(owner, label, world, round);
}

bool InProcess::killWorker(int owner) {
  std::vector<Proc*> running;
  for (auto& p : impl_->procs)
    if (p.owner == owner && !p.exited) running.push_back(&p);
  if (running.empty()) return false;
  Proc& victim = *running[static_cast<size_t>(
      impl_->sim.uniform(0, static_cast<int64_t>(running.size()) - 1))];
  impl_->sim.note("pid " + std::to_string(victim.pid) + " (rank " + std::to_string(victim.rank) +
                  ") killed");
  impl_->die(victim, -1);
  return true;
}

void InProcess::killFirstToLeave() { impl_->killFirstToLeave = true; }

void InProcess::loseSourceNode(std::function<void(int owner)> lose) {
  impl_->loseSourceNode = std::move(lose);
}

void InProcess::agentGone(int owner) {
  for (auto& p : impl_->procs)
    if (p.owner == owner) impl_->die(p, -1);
  for (auto& [id, store] : impl_->stores) {
    store->cutLinksOf(owner);
    const auto host = impl_->storeHost.find(id);
    if (host != impl_->storeHost.end() && host->second == owner)
      store->restart(Duration(24 * 3'600'000));  // its server went with its agent
  }
}

void InProcess::cutRandomLink() {
  if (impl_->stores.empty()) return;
  auto it = impl_->stores.begin();
  std::advance(it, impl_->sim.uniform(0, static_cast<int64_t>(impl_->stores.size()) - 1));
  it->second->cutRandomLink();
  impl_->record.workerStoreCut.insert(it->first);
}

void InProcess::loseReplies(double probability) {
  for (auto& [id, store] : impl_->stores) store->loseReplies(probability);
}

}  // namespace dlrun::sim
