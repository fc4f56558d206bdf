// The in-process recovery model's shared parts, private to its two files: sim_recovery_workers.cpp
// (the workers' program: gloo's process groups and collectives, dlrun.recovery's meet, recovery
// and steps) and sim_recovery.cpp (the agent's side: it starts the node's workers, replaces one
// alone or stops them all, keeps them through a lost node's round).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/recovery.h"
#include "common/error.h"
#include "tests/sim/sim_recovery.h"

namespace dlrun::sim {

namespace rec = agents::recovery;

inline const std::string kKeys = "dlrun/recovery";            // recovery.py's KEYS
inline constexpr Duration kRecoveryTimeout{120'000};          // RECOVERY_TIMEOUT_S
inline constexpr Duration kGroupTimeout{60'000};              // Loop's timeout: gloo's collectives
inline constexpr Duration kStepLow{100}, kStepHigh{1'000};    // a step's compute
inline constexpr Duration kStartLow{300}, kStartHigh{5'000};  // a replacement's start-up
inline constexpr Duration kReduceLow{20}, kReduceHigh{800};   // a collective, once all entered
inline constexpr Duration kLookForming{500};                  // _group.py's LOOK_S
inline constexpr Duration kMoveWait{10'000};                  // recovery.py's MOVE_WAIT_S
inline constexpr uint64_t kFreshWeights = 0x5eed;             // every rank's initial weights

inline uint64_t mix(uint64_t weights, int step) {  // splitmix64 of the weights and the step
  uint64_t z = weights ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(step + 1));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline uint64_t chain(int steps) {  // the weights after `steps` steps of a fault-free run
  uint64_t w = kFreshWeights;
  for (int s = 0; s < steps; ++s) w = mix(w, s);
  return w;
}

// Whether a move counter's value (rec::kMoveBase) names a round later than `metIn`:
// recovery.py's _move_after.
inline bool movesOn(int64_t given, int metIn) {
  return given > 0 && given / rec::kMoveBase > metIn;
}

struct Gone {};      // the worker's process died: its task ends
struct Fallback {};  // the recovery cannot finish: exit 75

struct Proc;

// A survivor's group formation and its watch (_group.py's form): the move the watch found.
struct Forming {
  bool over = false;     // the formation ended, formed or not
  bool watching = true;  // the watch's look under way may still find the move
  std::optional<int64_t> moved;
};

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
  bool unseeing = false;    // kept after a lost node, killed as it never saw the failure
  bool afterKeep = false;   // DLRUN_RECOVERY_KEPT: replaces a rank a round kept
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
    bool kept = false;     // a round kept them (adopt): a replacement looks for its move
    Time keptSince{};
  };
  std::map<int, Node> nodes;
  std::map<int, RoundId> spaces;
  std::deque<Proc> procs;
  int nextPid = 1000;
  bool killFirstToLeave = false;                  // InProcess::killFirstToLeave
  std::function<void(int owner)> loseSourceNode;  // InProcess::loseSourceNode

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

  // The workers' program (sim_recovery_workers.cpp): gloo's groups, then dlrun.recovery's loop.
  bool join(Proc& p, Group& g, Time deadline, const Forming* forming = nullptr);
  void watchForming(Proc& p, RoundId id, const std::string& keys, int metIn,
                    const std::shared_ptr<Forming>& forming);
  std::optional<int64_t> awaitMove(Proc& p, const std::string& keys, int metIn, Time until);
  int moveTo(Proc& p, const std::string& keys, int64_t given);
  void formed(Group& g);
  bool collective(Proc& p, const std::string& what, int source = -1);
  void leave(Proc& p);
  std::optional<int> meet(Proc& p, const std::string& keys, const std::string& here, int metIn,
                          Time deadline, bool move);
  void recover(Proc& p, RoundId id);
  void mark(Proc& p);
  void body(Proc& p, const std::string& label, RoundId id);
  Proc& spawnProc(int owner, const std::string& label, int rank, int local, bool joining,
                  RoundId id, int world, Duration after);

  // The agent's side (sim_recovery.cpp).

  Outcome run(int owner, const std::string& label, const rendezvous::World& world, RoundId id,
              const std::function<bool()>& stopped);
  std::optional<rendezvous::KeptWorkers> keepable(int owner) const;
  void adopt(int owner, const std::string& label, const rendezvous::World& world, RoundId round);
};

}  // namespace dlrun::sim
