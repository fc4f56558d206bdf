#include "tests/sim/sim_recovery.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <vector>

#include "agents/recovery.h"
#include "common/error.h"
#include "rendezvous/round_end.h"

namespace dlrun::sim {

namespace {

namespace rec = agents::recovery;

const std::string kKeys = "dlrun/recovery";            // recovery.py's KEYS
constexpr Duration kRecoveryTimeout{120'000};          // RECOVERY_TIMEOUT_S
constexpr Duration kGroupTimeout{60'000};              // Loop's timeout: gloo's collectives
constexpr Duration kPoll{100};                         // POLL_S, coarser
constexpr Duration kStepLow{100}, kStepHigh{1'000};    // a step's compute
constexpr Duration kStartLow{300}, kStartHigh{5'000};  // a replacement's start-up
constexpr Duration kReduceLow{20}, kReduceHigh{800};   // a collective, once all entered
constexpr uint64_t kFreshWeights = 0x5eed;             // every rank's initial weights

uint64_t mix(uint64_t weights, int step) {  // splitmix64 of the weights and the step
  uint64_t z = weights ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(step + 1));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t chain(int steps) {  // the weights after `steps` steps of a fault-free run
  uint64_t w = kFreshWeights;
  for (int s = 0; s < steps; ++s) w = mix(w, s);
  return w;
}

struct Gone {};      // the worker's process died: its task ends
struct Fallback {};  // the recovery cannot finish: exit 75

}  // namespace

struct Proc;

// One collective of a group: every rank enters it; once all did, each completes at its own time.
struct Collective {
  std::string what;                 // "step 4", "broadcast", "barrier"
  std::map<int, uint64_t> weights;  // as each rank entered
  std::map<int, Time> done;
  int source = -1;  // a broadcast's
  int sentStep = 0;
  uint64_t sentWeights = 0;
};

// gloo's process group of one generation of one round (its store key space).
struct Group {
  RoundId round;
  int generation = 0;
  int world = 0;
  std::map<int, Proc*> members;  // by rank
  bool formed = false;
  std::optional<Time> brokenAt;  // a member died or left
  int breaker = -1;              // the first that did
  std::deque<Collective> collectives;
};

struct Proc {
  int pid = 0;
  int owner = 0;
  int rank = 0;
  int world = 0;  // WORLD_SIZE: a round that kept a smaller job's workers renumbers them
  int local = 0;
  bool joining = false;
  bool dead = false;
  bool exited = false;
  int exitCode = 0;
  Time exitedAt{};
  bool marked = false;
  bool done = false;        // past the loop's last barrier (its mark says so)
  bool recovering = false;  // a survivor in recovery (its mark says so)
  int joinRound = -1;       // DLRUN_RECOVERY_ROUND: in a lost node's place, the round's
  bool meeting = false;     // in a recovery's meeting (where a move reaches it)
  int generation = 0;
  int step = 0;
  int taken = 0;  // the steps this process took: a step under it is taken again
  uint64_t weights = 0;
  Group* group = nullptr;
  std::map<Group*, size_t> entered;  // collectives entered, by group
  std::unique_ptr<LeasingStore> store;
  std::optional<size_t> replacement;  // its index in record.replacements
};

struct InProcess::Impl {
  Simulation& sim;
  Record& record;
  NetworkShape network;
  std::map<RoundId, std::unique_ptr<SimStoreServer>> stores;  // the workers' store of a round
  std::map<RoundId, int> storeHost;
  std::map<std::pair<RoundId, std::string>, std::unique_ptr<Group>> groups;  // by generation keys
  // Each node's current workers (by local rank) and the world they run in, for the agent's
  // choice to keep them through a lost node's round; the key space their round opened, by round.
  struct Node {
    std::vector<Proc*> mine;
    RoundId space;
    RoundId round;  // the round they run in now
    rendezvous::World world;
    bool renumbered = false;
    int lone = 0;          // ranks replaced alone since they started (a kept round carries them)
    bool keeping = false;  // kept while the agent joins the next round: nothing is replaced
    Time keptSince{};
  };
  std::map<int, Node> nodes;
  std::map<int, RoundId> spaces;
  std::deque<Proc> procs;
  int nextPid = 1000;

  Impl(Simulation& s, Record& r, NetworkShape n) : sim(s), record(r), network(n) {}

  void broke(const std::string& what) {
    sim.note("MODEL BROKEN: " + what);
    record.modelBreaks.push_back(what);
  }

  SimStoreServer& storeOf(RoundId id) {
    auto& store = stores[id];
    if (!store) store = std::make_unique<SimStoreServer>(sim, network);
    return *store;
  }

  Group& groupOf(RoundId id, const std::string& keys, int generation, int world) {
    auto& g = groups[{id, keys}];
    if (!g) {
      g = std::make_unique<Group>();
      g->round = id;
      g->generation = generation;
      g->world = world;
    }
    return *g;
  }

  void breakGroup(Group& g, int rank) {
    if (g.brokenAt) return;
    g.brokenAt = sim.now();
    g.breaker = rank;
  }

  // Whether `c` fails for `rank` as its group broke: a rank that left or died had sent all its
  // part of a collective it completed, so only one it had not completed fails for the ranks not
  // yet done.
  static bool cutShort(const Group& g, const Collective& c, int rank) {
    if (!g.brokenAt) return false;
    const auto theirs = c.done.find(g.breaker);
    if (theirs != c.done.end() && theirs->second <= *g.brokenAt) return false;
    const auto mine = c.done.find(rank);
    return mine == c.done.end() || *g.brokenAt < mine->second;
  }

  void die(Proc& p, int code) {
    if (p.exited) return;
    p.dead = true;
    p.exited = true;
    p.exitCode = code;
    p.exitedAt = sim.now();
    if (p.group) breakGroup(*p.group, p.rank);
  }

  void alive(const Proc& p) const {
    if (p.dead) throw Gone{};
  }

  // Blocks the worker until `d` passed; a death ends it.
  void compute(Proc& p, Duration d) {
    sim.block([&p] { return p.dead; }, sim.now() + d);
    alive(p);
  }

  // A store call of the worker: its errors end a recovery (recovery.py: any exception there).
  template <typename F>
  auto call(Proc& p, F f) {
    try {
      auto result = f(*p.store);
      alive(p);
      return result;
    } catch (const Error&) {
      alive(p);
      throw Fallback{};
    }
  }

  // init_process_group in `g`: true once all its ranks joined; false when it broke or timed out.
  bool join(Proc& p, Group& g, Time deadline) {
    if (g.members.count(p.rank)) {
      sim.note("pid " + std::to_string(p.pid) + " joins generation " +
               std::to_string(g.generation) + " as rank " + std::to_string(p.rank) +
               ", which another process holds");
      breakGroup(g, p.rank);
      return false;
    }
    if (g.brokenAt) return false;
    g.members[p.rank] = &p;
    p.group = &g;
    if (static_cast<int>(g.members.size()) == g.world) formed(g);
    sim.block([&] { return p.dead || g.formed || g.brokenAt; }, deadline);
    alive(p);
    return g.formed && !g.brokenAt;
  }

  // No two generations of a round at once: a group forms only where no other one of its round
  // still runs with all its members alive.
  void formed(Group& g) {
    g.formed = true;
    sim.note("round " + std::to_string(g.round.second) + ": generation " +
             std::to_string(g.generation) + " formed");
    for (auto& kept : record.kept)
      if (kept.space == g.round && g.generation > kept.generation && !kept.recovered)
        kept.recovered = sim.now();
    for (const auto& [key, other] : groups) {
      if (other.get() == &g || key.first != g.round || !other->formed || other->brokenAt) continue;
      broke("round " + std::to_string(g.round.second) + ": generation " +
            std::to_string(g.generation) + " formed while generation " +
            std::to_string(other->generation) + " still runs");
    }
  }

  // One collective of `p` in its group: true once its part completed; false when a peer's
  // death or departure cut it short, or gloo's timeout passed.
  bool collective(Proc& p, const std::string& what, int source = -1) {
    Group& g = *p.group;
    const size_t index = p.entered[&g]++;
    while (g.collectives.size() <= index) g.collectives.emplace_back();
    Collective& c = g.collectives[index];
    if (c.weights.empty()) {
      c.what = what;
    } else if (c.what != what) {
      broke("generation " + std::to_string(g.generation) + ": rank " + std::to_string(p.rank) +
            " entered '" + what + "' where another rank entered '" + c.what + "'");
    }
    c.weights[p.rank] = p.weights;
    if (p.rank == source) {
      c.source = source;
      c.sentStep = p.step;
      c.sentWeights = p.weights;
    }
    if (static_cast<int>(c.weights.size()) == g.world) {
      for (const auto& [rank, w] : c.weights) {
        if (what.rfind("step", 0) == 0 && w != c.weights.begin()->second)
          broke("generation " + std::to_string(g.generation) + ": ranks " +
                std::to_string(c.weights.begin()->first) + " and " + std::to_string(rank) +
                " entered " + what + " with different weights");
        c.done[rank] = sim.now() + sim.between(kReduceLow, kReduceHigh);
      }
    }
    const Time timeout = sim.now() + kGroupTimeout;
    while (true) {
      alive(p);
      const auto mine = c.done.find(p.rank);
      if (cutShort(g, c, p.rank)) return false;
      if (mine != c.done.end() && sim.now() >= mine->second) return true;
      if (sim.now() >= timeout) return false;
      const bool hadDone = mine != c.done.end(), hadBroken = g.brokenAt.has_value();
      const Time wake = hadDone ? std::min(timeout, mine->second) : timeout;
      sim.block(
          [&] {
            return p.dead || (!hadBroken && g.brokenAt) || (!hadDone && c.done.count(p.rank));
          },
          wake);
    }
  }

  void leave(Proc& p) {
    if (p.group) breakGroup(*p.group, p.rank);  // its sockets close: a peer waiting fails
    p.group = nullptr;
  }

  // recovery.py's _meet: arrives in `here` and waits for every rank; where a round later than
  // `metIn` kept this rank meanwhile (its agent said so in `keys`' move counters, looked at
  // where `move`), that round's number, with the rank's number and world size there taken.
  std::optional<int> meet(Proc& p, const std::string& keys, const std::string& here, int metIn,
                          Time deadline, bool move) {
    call(p, [&](LeasingStore& s) {
      s.set(here + "/rank/" + std::to_string(p.rank),
            std::string(p.joining ? "r" : "s") + std::to_string(p.step));
      if (s.add(here + "/arrived", 1) == p.world) s.add(here + "/ready", 1);
      return 0;
    });
    const std::string mine = keys + "/move/" + std::to_string(p.rank);
    for (int poll = 1; call(p, [&](LeasingStore& s) { return s.add(here + "/ready", 0); }) < 1;
         ++poll) {
      if (move) {
        const int64_t given = call(p, [&](LeasingStore& s) { return s.add(mine, 0); });
        if (const int round = static_cast<int>(given / rec::kMoveBase);
            given > 0 && round > metIn) {
          const std::string there = keys + "/round" + std::to_string(round);
          p.world = static_cast<int>(
              call(p, [&](LeasingStore& s) { return s.add(there + "/world", 0); }));
          sim.note("pid " + std::to_string(p.pid) + ": rank " + std::to_string(p.rank) +
                   " is rank " + std::to_string(given % rec::kMoveBase - 1) + " of " +
                   std::to_string(p.world) + " in round " + std::to_string(round));
          p.rank = static_cast<int>(given % rec::kMoveBase - 1);
          return round;
        }
      }
      if (sim.now() >= deadline) throw Fallback{};
      if (poll % 10 == 0 && call(p, [&](LeasingStore& s) { return s.add(kKeys + "/done", 0); }) > 0)
        throw Fallback{};  // a rank left the loop: it never comes (each beat, in recovery.py)
      compute(p, kPoll);
    }
    return std::nullopt;
  }

  // recovery.py's _recover_within, over the round's store.
  void recover(Proc& p, RoundId id) {
    p.recovering = !p.joining;
    const Time deadline = sim.now() + kRecoveryTimeout;
    leave(p);
    const std::string counter = kKeys + "/generation";
    const int64_t committed = call(p, [&](LeasingStore& s) { return s.add(counter, 0); });
    const int generation = p.joining ? static_cast<int>(committed) + 1 : p.generation + 1;
    const std::string base = kKeys + "/" + std::to_string(generation);
    std::string keys = base;
    if (p.joining && p.joinRound >= 0) keys += "/round" + std::to_string(p.joinRound);
    int metIn = -1;
    p.meeting = true;
    while (auto moved = meet(p, base, keys, metIn, deadline, !p.joining)) {
      metIn = *moved;
      keys = base + "/round" + std::to_string(metIn);
    }
    p.meeting = false;
    const int world = p.world;
    if (!join(p, groupOf(id, keys, generation, world), deadline)) throw Fallback{};
    int source = -1, furthest = -1;
    for (int r = 0; r < world; ++r) {
      const std::string said =
          call(p, [&](LeasingStore& s) { return s.get(keys + "/rank/" + std::to_string(r)); });
      const int step = std::stoi(said.substr(1));
      if (said[0] == 's' && step > furthest) furthest = step, source = r;
    }
    if (source < 0) throw Fallback{};  // no survivor
    if (!collective(p, "broadcast", source)) throw Fallback{};
    const Collective& sent = p.group->collectives[p.entered[p.group] - 1];
    p.step = sent.sentStep;
    p.weights = sent.sentWeights;
    if (!collective(p, "barrier")) throw Fallback{};
    p.generation = generation;
    if (p.rank == source)
      call(p, [&](LeasingStore& s) { return s.add(counter, generation - committed); });
    p.recovering = false;
  }

  void mark(Proc& p) {
    p.marked = true;
    if (p.replacement) {
      record.replacements[*p.replacement].recovered = sim.now();
      sim.note("rank " + std::to_string(p.rank) + " recovered in process, generation " +
               std::to_string(p.generation));
    }
  }

  // A worker's process: the Loop's constructor, then its steps, recovering from a peer's loss.
  void body(Proc& p, const std::string& label, RoundId id) {
    try {
      try {
        p.store = storeOf(id).open(p.owner, label + " rank " + std::to_string(p.rank));
      } catch (const Error&) {
        return die(p, 1);  // the Loop's constructor raises: no loop, no mark
      }
      alive(p);
      if (p.joining) {
        try {
          recover(p, id);
        } catch (const Fallback&) {
          record.fellBack.emplace(id, sim.now());
          return die(p, rec::kFallbackCode);
        }
        p.joining = false;
        p.joinRound = -1;  // a survivor from now on, as recovery.py's later _recover calls
      } else if (!join(p, groupOf(id, kKeys + "/0", 0, p.world), sim.now() + kGroupTimeout)) {
        return die(p, 1);
      }
      mark(p);
      // The loop's steps, then its last barrier (no rank leaves while a peer may still fail in
      // the last step), each failure recovered.
      while (true) {
        if (p.step == record.shape.steps) {
          if (collective(p, "last barrier")) {
            // Out of the loop from here, whatever comes of its ADD: one stopped as it waits for
            // the reply (its node lost, its agent stopping it) has its ADD in the store all the
            // same, and the peers recovering fall back on it.
            record.leftLoop.emplace(id, sim.now());
            try {  // a hint only: without it, a peer recovering falls back at its deadline
              call(p, [&](LeasingStore& s) { return s.add(kKeys + "/done", 1); });
            } catch (const Fallback&) {
            }
            p.done = true;
            break;
          }
        } else {
          compute(p, sim.between(kStepLow, kStepHigh));
          if (p.step < p.taken)
            broke("rank " + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) +
                  ") takes step " + std::to_string(p.step) + " again, after " +
                  std::to_string(p.taken) + " steps");
          if (collective(p, "step " + std::to_string(p.step))) {
            p.weights = mix(p.weights, p.step);
            p.taken = ++p.step;
            continue;
          }
        }
        sim.note(label + " rank " + std::to_string(p.rank) + ": step " + std::to_string(p.step) +
                 " failed; recovering");
        try {
          recover(p, id);
        } catch (const Fallback&) {
          sim.note(label + " rank " + std::to_string(p.rank) +
                   ": recovery failed; falls back to the whole-group restart");
          record.fellBack.emplace(id, sim.now());
          return die(p, rec::kFallbackCode);
        }
      }
      if (p.weights != chain(record.shape.steps))
        broke("rank " + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) + ") ended its " +
              std::to_string(record.shape.steps) +
              " steps with weights a fault-free run does not have: a step lost or taken twice");
      leave(p);
      compute(p, sim.between(Duration(0), Duration(2'000)));  // what the program does after
      p.exited = true;
    } catch (const Gone&) {
    } catch (const Killed&) {
      die(p, -1);
      throw;
    }
  }

  Proc& spawnProc(int owner, const std::string& label, int rank, int local, bool joining,
                  RoundId id, int world, Duration after) {
    Proc& p = procs.emplace_back();
    p.pid = nextPid++;
    p.owner = owner;
    p.rank = rank;
    p.world = world;
    p.local = local;
    p.joining = joining;
    p.weights = joining ? mix(0xdead, p.pid) : kFreshWeights;  // a replacement holds nothing
    sim.spawn(owner, [this, &p, label, id, after] {
      try {
        compute(p, after);
      } catch (const Gone&) {
        return;
      }
      body(p, label, id);
    });
    return p;
  }

  Outcome run(int owner, const std::string& label, const rendezvous::World& world, RoundId id,
              const std::function<bool()>& stopped);
  std::optional<rendezvous::KeptWorkers> keepable(int owner, bool* notYet) const;
  void adopt(int owner, const std::string& label, const rendezvous::World& world, RoundId round);
};

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
    next.replacement = record.replacements.size();
    record.replacements.push_back(
        {node.round, space, owner, f.rank, sim.now(), f.exitedAt, std::nullopt});
    replaced[f.local] = next.pid;
    mine[static_cast<size_t>(f.local)] = &next;
    sim.note(label + ": rank " + std::to_string(f.rank) + " replaced alone (pid " +
             std::to_string(next.pid) + "); the other ranks keep running");
  }
}

std::optional<rendezvous::KeptWorkers> InProcess::Impl::keepable(int owner, bool* notYet) const {
  *notYet = false;
  const auto found = nodes.find(owner);
  if (found == nodes.end()) return std::nullopt;
  const Node& node = found->second;
  // As AgentImpl::keepRefusal: every worker alive and in the loop, its mark its own; and as
  // awaitRecovering: each in recovery (else not yet).
  for (const Proc* p : node.mine)
    if (p->exited || !p->marked || p->done) return std::nullopt;
  *notYet =
      std::any_of(node.mine.begin(), node.mine.end(), [](const Proc* p) { return !p->recovering; });
  if (*notYet) return std::nullopt;
  std::vector<uint16_t> ports;
  for (int local = 0; local < node.world.localWorldSize; ++local)
    ports.push_back(static_cast<uint16_t>(kFirstWorkerPort + local));
  return rendezvous::keptFrom(node.world, std::move(ports));
}

void InProcess::Impl::adopt(int owner, const std::string& label, const rendezvous::World& world,
                            RoundId round) {
  Node& node = nodes.at(owner);
  node.keeping = false;
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

std::optional<rendezvous::KeptWorkers> InProcess::keepable(int owner, bool* notYet) const {
  return impl_->keepable(owner, notYet);
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
