#include <algorithm>

#include "tests/sim/sim_recovery_model.h"

namespace dlrun::sim {

// init_process_group in `g`: true once all its ranks joined; false when it broke or timed out,
// or `forming`'s watch found a move (the rank leaves the group, made or not).
bool InProcess::Impl::join(Proc& p, Group& g, Time deadline, const Forming* forming) {
  if (g.members.count(p.rank)) {
    sim.note("pid " + std::to_string(p.pid) + " joins generation " + std::to_string(g.generation) +
             " as rank " + std::to_string(p.rank) + ", which another process holds");
    breakGroup(g, p.rank);
    return false;
  }
  if (g.brokenAt) return false;
  g.members[p.rank] = &p;
  p.group = &g;
  if (static_cast<int>(g.members.size()) == g.world) formed(g);
  sim.block([&] { return p.dead || g.formed || g.brokenAt || (forming && forming->moved); },
            deadline);
  alive(p);
  if (forming && forming->moved) {
    leave(p);  // its connections close: a peer forming the group with it fails
    return false;
  }
  return g.formed && !g.brokenAt;
}

// _group.py's _watch_forming, for a survivor forming a group: every kLookForming, on a store
// connection of its own, a look at its move counter in the generation's `keys`; one naming a
// round later than `metIn` ends the formation (the rank's store connection shut down).
void InProcess::Impl::watchForming(Proc& p, RoundId id, const std::string& keys, int metIn,
                                   const std::shared_ptr<Forming>& forming) {
  const std::string counter = keys + "/move/" + std::to_string(p.rank);
  sim.spawn(p.owner, [this, &p, id, counter, metIn, forming] {
    struct Done {  // form joins the watch: its end, however it ends
      Forming& f;
      ~Done() { f.watching = false; }
    } done{*forming};
    std::unique_ptr<LeasingStore> store;
    while (true) {
      sim.block([&] { return forming->over || p.dead; }, sim.now() + kLookForming);
      if (forming->over || p.dead) return;
      try {
        if (!store) store = storeOf(id).open(p.owner, "pid " + std::to_string(p.pid) + " watch");
        const int64_t given = store->add(counter, 0);
        if (movesOn(given, metIn) && !p.dead) {
          forming->moved = given;  // as the formation ends too: the group made is left
          return;
        }
      } catch (const Error&) {
        store.reset();  // the store out of reach: the formation's own wait says so
      }
    }
  });
}

// recovery.py's _await_move: a survivor whose formation failed (a peer left it for the round
// that kept them) waits, as in a meet, for its own move counter in the generation's `keys` to
// name a round later than `metIn`, until `until`.
std::optional<int64_t> InProcess::Impl::awaitMove(Proc& p, const std::string& keys, int metIn,
                                                  Time until) {
  const std::string news = keys + "/news";
  const std::string counter = keys + "/move/" + std::to_string(p.rank);
  while (true) {
    const int64_t seen = call(p, [&](LeasingStore& s) { return s.add(news, 0); });
    const int64_t given = call(p, [&](LeasingStore& s) { return s.add(counter, 0); });
    if (movesOn(given, metIn)) return given;
    if (sim.now() >= until) return std::nullopt;
    call(p, [&](LeasingStore& s) {
      return s.waitFor({news + "/" + std::to_string(seen + 1)},
                       std::chrono::duration_cast<std::chrono::milliseconds>(until - sim.now()));
    });
  }
}

// recovery.py's _move: `p` in the round that kept it (`given`, its move counter in the
// generation's `keys`), its rank and world size there taken; the round's number.
int InProcess::Impl::moveTo(Proc& p, const std::string& keys, int64_t given) {
  const int round = static_cast<int>(given / rec::kMoveBase);
  const std::string there = keys + "/round" + std::to_string(round);
  p.world = static_cast<int>(call(p, [&](LeasingStore& s) { return s.add(there + "/world", 0); }));
  sim.note("pid " + std::to_string(p.pid) + ": rank " + std::to_string(p.rank) + " is rank " +
           std::to_string(given % rec::kMoveBase - 1) + " of " + std::to_string(p.world) +
           " in round " + std::to_string(round));
  p.rank = static_cast<int>(given % rec::kMoveBase - 1);
  return round;
}

// No two generations of a round at once: a group forms only where no other one of its round
// still runs with all its members alive.
void InProcess::Impl::formed(Group& g) {
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
bool InProcess::Impl::collective(Proc& p, const std::string& what, int source) {
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
        [&] { return p.dead || (!hadBroken && g.brokenAt) || (!hadDone && c.done.count(p.rank)); },
        wake);
  }
}

void InProcess::Impl::leave(Proc& p) {
  if (p.group) breakGroup(*p.group, p.rank);  // its sockets close: a peer waiting fails
  p.group = nullptr;
}

// recovery.py's _meet: arrives in `here` and waits for every rank; where a round later than
// `metIn` kept this rank meanwhile (its agent said so in `keys`' move counters, looked at
// where `move`), that round's number, with the rank's number and world size there taken.
// Waits as recovery.py's _await: a look at each cause after the news count is read, then one
// wait for the next count's key (rec::newsKey).
std::optional<int> InProcess::Impl::meet(Proc& p, const std::string& keys, const std::string& here,
                                         int metIn, Time deadline, bool move) {
  const std::string news = keys + "/news";
  const bool last = call(p, [&](LeasingStore& s) {
    s.set(here + "/rank/" + std::to_string(p.rank),
          std::string(p.joining ? "r" : "s") + std::to_string(p.step));
    if (s.add(here + "/arrived", 1) != p.world) return false;
    s.add(here + "/ready", 1);
    rec::tellNews(s, news);
    return true;
  });
  if (last) return std::nullopt;  // met: a waiting rank's look finds the same first
  const std::string mine = keys + "/move/" + std::to_string(p.rank);
  while (true) {
    const int64_t seen = call(p, [&](LeasingStore& s) { return s.add(news, 0); });
    if (call(p, [&](LeasingStore& s) { return s.add(here + "/ready", 0); }) >= 1) break;
    if (move) {
      const int64_t given = call(p, [&](LeasingStore& s) { return s.add(mine, 0); });
      if (movesOn(given, metIn)) return moveTo(p, keys, given);
    }
    if (call(p, [&](LeasingStore& s) { return s.add(kKeys + "/done", 0); }) > 0)
      throw Fallback{};  // a rank left the loop: it never comes
    if (sim.now() >= deadline) throw Fallback{};
    call(p, [&](LeasingStore& s) {
      return s.waitFor({news + "/" + std::to_string(seen + 1)},
                       std::chrono::duration_cast<std::chrono::milliseconds>(deadline - sim.now()));
    });
  }
  return std::nullopt;
}

// recovery.py's _recover_within, over the round's store.
void InProcess::Impl::recover(Proc& p, RoundId id) {
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
  // A survivor its agent moved already meets in the round that kept it at once; so does a
  // replacement of a rank that failed once a round kept it.
  if ((!p.joining || p.afterKeep) && keys == base) {
    const int64_t given = call(
        p, [&](LeasingStore& s) { return s.add(base + "/move/" + std::to_string(p.rank), 0); });
    if (movesOn(given, metIn)) {
      metIn = moveTo(p, base, given);
      keys = base + "/round" + std::to_string(metIn);
    }
  }
  p.meeting = true;  // until its group formed: a move reaches it meanwhile
  while (true) {
    while (auto moved = meet(p, base, keys, metIn, deadline, !p.joining)) {
      metIn = *moved;
      keys = base + "/round" + std::to_string(metIn);
    }
    std::shared_ptr<Forming> forming;
    if (!p.joining) {  // a node lost as the group forms: its ranks never come
      forming = std::make_shared<Forming>();
      watchForming(p, id, base, metIn, forming);
    }
    bool made = join(p, groupOf(id, keys, generation, p.world), deadline, forming.get());
    if (forming) {  // form joins its watch, whose look under way may still find the move
      forming->over = true;
      sim.block([&] { return p.dead || !forming->watching; }, deadline);
      alive(p);
      made = made && !forming->moved;
    }
    if (made) break;
    leave(p);
    std::optional<int64_t> moved = forming ? forming->moved : std::nullopt;
    if (!moved && !p.joining)
      moved = awaitMove(p, base, metIn, std::min(deadline, sim.now() + kMoveWait));
    if (!moved) throw Fallback{};
    if (forming && forming->moved) {  // its store connection was shut down to end the formation
      try {
        p.store = storeOf(id).open(p.owner, "pid " + std::to_string(p.pid) + " again");
      } catch (const Error&) {
        throw Fallback{};
      }
    }
    metIn = moveTo(p, base, *moved);
    keys = base + "/round" + std::to_string(metIn);
  }
  p.meeting = false;
  const int world = p.world;
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
  // A fault aimed at the moment before the source's word, where its node's loss leaves the
  // workers' store (the survivors may then go on in process).
  const auto host = storeHost.find(id);
  if (p.rank == source && loseSourceNode && (host == storeHost.end() || host->second != p.owner)) {
    sim.note("pid " + std::to_string(p.pid) + " (rank " + std::to_string(p.rank) +
             ", the source) passed generation " + std::to_string(generation) + "'s barrier");
    std::exchange(loseSourceNode, nullptr)(p.owner);
    throw Killed{};
  }
  // Every rank commits it (recovery.py: the source alone could die before its word).
  call(p, [&](LeasingStore& s) {
    return s.compareSet(counter, std::to_string(generation - 1), std::to_string(generation));
  });
  p.recovering = false;
}

void InProcess::Impl::mark(Proc& p) {
  p.marked = true;
  if (p.replacement) {
    record.replacements[*p.replacement].recovered = sim.now();
    sim.note("rank " + std::to_string(p.rank) + " recovered in process, generation " +
             std::to_string(p.generation));
  }
}

// A worker's process: the Loop's constructor, then its steps, recovering from a peer's loss.
void InProcess::Impl::body(Proc& p, const std::string& label, RoundId id) {
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
            call(p, [&](LeasingStore& s) {
              s.add(kKeys + "/done", 1);
              rec::tellNews(s, kKeys + "/" + std::to_string(p.generation + 1) + "/news");
              return 0;
            });
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
    if (std::exchange(killFirstToLeave, false)) {  // a fault aimed at the moment after the loop
      sim.note("FAULT kill pid " + std::to_string(p.pid) + " (rank " + std::to_string(p.rank) +
               ") past its loop's last barrier");
      record.workerFaults.push_back(sim.now());
      record.faults.push_back(sim.now());
      ++record.injectedFailures;
      return die(p, -1);
    }
    compute(p, sim.between(Duration(0), Duration(2'000)));  // what the program does after
    p.exited = true;
  } catch (const Gone&) {
  } catch (const Killed&) {
    die(p, -1);
    throw;
  }
}

Proc& InProcess::Impl::spawnProc(int owner, const std::string& label, int rank, int local,
                                 bool joining, RoundId id, int world, Duration after) {
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

}  // namespace dlrun::sim
