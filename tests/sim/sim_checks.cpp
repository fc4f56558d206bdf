// The invariants of issues 44 and 55, checked on what one schedule's agents did (sim_record.h).
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "tests/sim/sim_record.h"

namespace dlrun::sim {

namespace {

using rendezvous::RoundEnd;
using Kind = RoundEnd::Kind;

std::string name(const Record& r, int owner) { return r.agents[static_cast<size_t>(owner)].label; }

std::string roundName(const RoundId& id) {
  return "round " + std::to_string(id.second) +
         (id.first > 0 ? " (store life " + std::to_string(id.first) + ")" : "");
}

// Each round: node ranks 0..G-1 once each, every member agreeing on the round's size and
// failures, the ranks tiling 0..W-1, no node twice, never more than maxNodes (a spare never
// takes a rank in a full round), never fewer than minNodes.
std::optional<std::string> checkRounds(const Record& r) {
  for (const auto& [round, members] : r.worlds) {
    const std::string where = roundName(round) + ": ";
    const auto& first = members.front().second;
    std::set<int> ranks;
    std::map<int, int> bases;  // base rank -> workers
    std::set<int> nodes;
    for (const auto& [owner, w] : members) {
      if (w.groupWorldSize != first.groupWorldSize || w.worldSize != first.worldSize ||
          w.failures != first.failures)
        return where + name(r, owner) + " disagrees with " + name(r, members.front().first) +
               " on the round's size or failures";
      if (w.groupRank < 0 || w.groupRank >= w.groupWorldSize || !ranks.insert(w.groupRank).second)
        return where + "node rank " + std::to_string(w.groupRank) + " given twice or out of range";
      if (w.baseRank < 0 || w.baseRank + w.localWorldSize > w.worldSize ||
          !bases.emplace(w.baseRank, w.localWorldSize).second)
        return where + "ranks from " + std::to_string(w.baseRank) + " given twice or out of range";
      if (!nodes.insert(r.agents[static_cast<size_t>(owner)].node).second)
        return where + "node n" + std::to_string(r.agents[static_cast<size_t>(owner)].node) +
               " is a member twice";
    }
    if (first.groupWorldSize > r.shape.maxNodes || first.groupWorldSize < r.shape.minNodes)
      return where + std::to_string(first.groupWorldSize) + " members, outside --nnodes";
    if (static_cast<int>(members.size()) > first.groupWorldSize)
      return where + "more members than its size";
    if (first.worldSize != 2 * first.groupWorldSize)
      return where + "world size " + std::to_string(first.worldSize) + " for " +
             std::to_string(first.groupWorldSize) + " nodes of 2 workers";
    // Every member seen: their ranks follow one another from 0 to WORLD_SIZE-1, no gap.
    if (static_cast<int>(members.size()) == first.groupWorldSize) {
      int next = 0;
      for (const auto& [base, count] : bases) {
        if (base != next)
          return where + "the ranks do not tile 0.." + std::to_string(first.worldSize - 1) +
                 ": a node's start at " + std::to_string(base) + ", not " + std::to_string(next);
        next += count;
      }
    }
  }
  return std::nullopt;
}

std::string hostOf(const std::string& endpoint) { return endpoint.substr(0, endpoint.rfind(':')); }

// Each round's roster, as every member was told it: one endpoint per rank, the same list for
// every member; a member's own ranks at its own node's address and ports; the workers' store
// (MASTER_ADDR) at the node of rank 0, and the same for all.
std::optional<std::string> checkRosters(const Record& r) {
  for (const auto& [round, members] : r.worlds) {
    const std::string where = roundName(round) + ": ";
    const auto& [firstOwner, first] = members.front();
    const auto& roster = first.workerEndpoints;
    if (static_cast<int>(roster.size()) != first.worldSize)
      return where + name(r, firstOwner) + " was given " + std::to_string(roster.size()) +
             " worker endpoints for WORLD_SIZE " + std::to_string(first.worldSize);
    for (const auto& [owner, w] : members) {
      if (w.workerEndpoints != roster)
        return where + name(r, owner) + " and " + name(r, firstOwner) +
               " were given different rosters";
      if (w.masterAddr != hostOf(roster.front()) || w.masterPort != kStorePort)
        return where + name(r, owner) + " has MASTER_ADDR " + w.masterAddr + ":" +
               std::to_string(w.masterPort) + ", but rank 0 is at " + roster.front();
      const std::string addr = nodeAddress(r.agents[static_cast<size_t>(owner)].node);
      for (int local = 0; local < w.localWorldSize; ++local) {
        const std::string mine = addr + ":" + std::to_string(kFirstWorkerPort + local);
        const auto& listed = roster[static_cast<size_t>(w.baseRank + local)];
        if (listed != mine)
          return where + "rank " + std::to_string(w.baseRank + local) + " is " + name(r, owner) +
                 "'s worker at " + mine + ", but the roster lists " + listed;
      }
    }
  }
  return std::nullopt;
}

// With every node started within the join timeout of the first and no fault until a last call
// and the store's few round trips after the last of them, the job's first round forms: a join
// that times out then is a bug, not a good ending.
std::optional<std::string> checkFormed(const Record& r) {
  if (!r.worlds.empty() || r.starts.empty()) return std::nullopt;
  const auto [first, last] = std::minmax_element(r.starts.begin(), r.starts.end());
  const Duration settle = r.shape.lastCall + 2 * r.shape.heartbeat + Duration(5'000);
  if (*last + settle >= *first + r.shape.joinTimeout) return std::nullopt;
  if (r.firstFault && *r.firstFault < *last + settle) return std::nullopt;
  return "no round formed, although all " + std::to_string(r.starts.size()) +
         " nodes started within " +
         std::to_string(std::chrono::duration_cast<Duration>(*last - *first).count()) +
         " ms of each other and nothing failed before " +
         std::to_string(std::chrono::duration_cast<Duration>(*last + settle - Time{}).count()) +
         " ms";
}

// How a round ended, where the store said it (not an end a node concluded alone: its own loss
// or the store's): every member that read it read the same.
bool fromStore(const RoundEnd& end) {
  return end.kind == Kind::Finished || end.kind == Kind::WorkerFailed || end.kind == Kind::Stopped;
}

// Each round's end agreed on; a success counted once (Finished only once every member's workers
// finished); each failure counted once (a WorkerFailed end's count is the failed rounds before
// it plus one, and final exactly when no restart is left).
std::optional<std::string> checkEnds(const Record& r) {
  std::map<RoundId, RoundEnd> agreed;
  for (const auto& [round, seen] : r.ends) {
    const std::string where = roundName(round) + ": ";
    for (const auto& [owner, end] : seen) {
      if (!fromStore(end)) continue;
      auto [it, fresh] = agreed.emplace(round, end);
      if (!fresh && (it->second.kind != end.kind || it->second.failures != end.failures))
        return where + name(r, owner) + " saw it end as '" + end.describe() + "', another as '" +
               it->second.describe() + "'";
    }
  }
  for (const auto& [round, end] : agreed) {
    if (end.kind != Kind::Finished) continue;
    const auto worlds = r.worlds.find(round);
    const int members = worlds == r.worlds.end() ? 0 : worlds->second.front().second.groupWorldSize;
    const auto done = r.succeeded.find(round);
    const int succeeded = done == r.succeeded.end() ? 0 : static_cast<int>(done->second.size());
    if (succeeded != members)
      return roundName(round) + ": ended as Finished after " + std::to_string(succeeded) +
             " of its " + std::to_string(members) + " members' workers finished";
  }
  // The count lives in the store and in its members' records: a store restarted without its
  // keys keeps only what surviving members remember, so the count is checked while the store
  // never lost the job's keys (its first life). A round whose failure report went out but whose
  // end no member lived to read may have counted or not: it widens the range allowed. In
  // process, the ranks the reporting node replaced alone in the round count too (up to the most
  // any member replaced).
  auto lone = [&](const RoundId& round) {
    int most = 0;
    if (const auto it = r.loneRestarts.find(round); it != r.loneRestarts.end())
      for (const auto& [owner, count] : it->second) most = std::max(most, count);
    return most;
  };
  auto failuresBefore = [&](const RoundId& round) {
    std::pair<int, int> range{0, 0};
    for (const auto& [earlier, members] : r.worlds) {
      if (earlier.first > 0 || !(earlier < round)) continue;
      const auto seen = agreed.find(earlier);
      if (seen != agreed.end()) {
        const int counted = seen->second.kind == Kind::WorkerFailed ? 1 : 0;
        range.first += counted;
        range.second += counted * (1 + lone(earlier));
      } else if (r.failureReported.count(earlier)) {
        range.second += 1 + lone(earlier);
      }
    }
    return range;
  };
  for (const auto& [round, end] : agreed) {
    if (round.first > 0 || end.kind != Kind::WorkerFailed) continue;
    const std::string where = roundName(round) + ": ";
    const auto [low, high] = failuresBefore(round);
    if (end.failures < low + 1 || end.failures > high + 1 + lone(round))
      return where + "its failure counts as restart " + std::to_string(end.failures) +
             ", but it is the job's failure " + std::to_string(low + 1) +
             (high + lone(round) > low ? " to " + std::to_string(high + 1 + lone(round)) : "");
    if (end.final != !rendezvous::RestartPolicy{r.shape.maxRestarts}.allowsRestart(end.failures))
      return where + "failure " + std::to_string(end.failures) + " of max_restarts " +
             std::to_string(r.shape.maxRestarts) + (end.final ? " ended" : " did not end") +
             " the job";
  }
  for (const auto& [round, members] : r.worlds) {
    if (round.first > 0) continue;
    const auto [low, high] = failuresBefore(round);
    const int before = members.front().second.failures;
    if (before < low || before > high)
      return roundName(round) + ": " + std::to_string(before) + " failures before it, not " +
             std::to_string(low) + (high > low ? " to " + std::to_string(high) : "");
  }
  return std::nullopt;
}

bool everJoined(const Record& r, int owner) {
  for (const auto& [round, members] : r.worlds)
    for (const auto& member : members)
      if (member.first == owner) return true;
  return false;
}

// How each agent ended: a job's end, or an error the rendezvous names for what happened
// (too few nodes in time, the store gone); never an error of the protocol itself, never a
// node refused for being slow (Slurm's rule refuses only a node started again), and every
// agent alive agrees on how the job ended.
std::optional<std::string> checkOutcomes(const Record& r) {
  // Agents agree where they ended in one store life (that of their last reply, where they
  // learnt the end): a store restarted without its keys after the job ended holds a new job for
  // a node that comes only then, or for the members that had not read that end before the
  // restart.
  std::set<int> members;
  for (const auto& [round, world] : r.worlds)
    for (const auto& [owner, _] : world) members.insert(owner);
  std::map<int, RoundEnd> job;  // by store life
  for (const auto& a : r.agents) {
    // A node sent SIGTERM exits 128 + 15 however the job ends (a stop racing its end).
    if (a.killed || !a.ended || a.stopAsked) continue;
    if (!a.end) {
      if (a.errorKind == "Stopped" || a.errorKind == "NotStarted") continue;
      const bool refused = a.error.find("is not taken back") != std::string::npos;
      if (refused && a.life > 0 && r.shape.refuseLostNodes) continue;
      // A node's first contact with a store that says nothing names it as not a store, at once
      // (by design: a wrong endpoint is the likelier cause); never a node in the job already.
      const bool silent = a.error.find("sent nothing back") != std::string::npos;
      if (silent && a.errorKind == "ConfigError" && !everJoined(r, a.owner)) continue;
      if (a.errorKind != "TimeoutError" && a.errorKind != "NetworkError")
        return a.label + " ended with " + a.errorKind + ": " + a.error;
      continue;
    }
    if (!a.end->endsJob()) continue;           // left on purpose (stop_policy=node)
    if (!members.contains(a.owner)) continue;  // it read the job's end, in no round itself
    auto [agreed, fresh] = job.emplace(a.endLife, *a.end);
    if (!fresh && agreed->second.kind != a.end->kind)
      return a.label + " ended as '" + a.end->describe() + "', another agent as '" +
             agreed->second.describe() + "'";
  }
  return std::nullopt;
}

// A duration in seconds, for messages.
std::string secs(Duration d) {
  std::ostringstream out;
  out << d.count() / 1000.0 << " s";
  return out.str();
}

// No node runs workers of an older round long after another started a newer one: once a newer
// round's workers start, the old round's stop within a lease and two heartbeats (and a reply's
// timeout) of the time that node could run and reach the store.
std::optional<std::string> checkOverlap(const Record& r) {
  const Duration grace = r.shape.leaseTtl + 2 * r.shape.heartbeat + Duration(4'000) + 1s;
  auto overlapped = [](Time a0, Time a1, Time b0, Time b1) {
    const Time from = std::max(a0, b0), to = std::min(a1, b1);
    return to > from ? std::chrono::duration_cast<Duration>(to - from) : Duration(0);
  };
  for (const auto& newer : r.running) {
    for (const auto& old : r.running) {
      if (old.round >= newer.round || old.owner == newer.owner) continue;
      const Time stopped = old.to.value_or(r.agents[static_cast<size_t>(old.owner)].endedAt);
      if (stopped <= newer.from) continue;
      Duration excused(0);
      for (const auto& [owner, span] : r.paused)
        if (owner == old.owner) excused += overlapped(newer.from, stopped, span.first, span.second);
      for (const auto& span : r.storeAway)
        excused += overlapped(newer.from, stopped, span.first, span.second + r.shape.heartbeat);
      const auto late = std::chrono::duration_cast<Duration>(stopped - newer.from) - excused;
      if (late > grace)
        return name(r, old.owner) + " ran " + roundName(old.round) + "'s workers " + secs(late) +
               " after " + name(r, newer.owner) + " started " + roundName(newer.round) +
               "'s (grace " + secs(grace) + ")";
    }
  }
  return std::nullopt;
}

// In process (sim_recovery.h): what the model saw break as it ran (a step lost or taken twice,
// ranks' weights apart, two generations of a round at once), and a lone replacement that did
// not recover in time: with nothing else reaching its round's workers from a little before its
// start until kRecovers after (no other fault, no other recovery under way, no pause, no
// connection of the workers' store cut or reply lost), the survivors and it must meet well
// within that (a start-up takes at most 5 s, a meeting a few polls and collectives). So must
// the workers a round kept (a node lost) and its newcomers, or they alone renumbered.
std::optional<std::string> checkInProcess(const Record& r) {
  if (!r.modelBreaks.empty()) return r.modelBreaks.front();
  const Duration before(2'000), kRecovers(20'000);
  auto quiet = [&](const Replacement& x) {
    const Time from = x.at - before, to = x.at + kRecovers;
    if (r.workerStoreCut.count(x.space)) return false;
    bool own = false;  // the kill it replaces, once
    for (const Time t : r.workerFaults) {
      if (t < from || t > to) continue;
      if (t == x.failedAt && !own) {
        own = true;
        continue;
      }
      return false;
    }
    for (const auto& [owner, span] : r.paused)
      if (span.first <= to && span.second >= from) return false;
    Time began = x.at;  // the round's workers' start
    for (const auto& run : r.running)
      if (run.round == x.round) began = std::min(began, run.from);
    for (const auto& span : r.replyLoss)  // a connection that lost a reply stays broken
      if (span.first <= to && span.second >= began) return false;
    for (const auto& other : r.replacements)
      if (&other != &x && other.round == x.round && other.at <= to &&
          other.recovered.value_or(Time::max()) >= from)
        return false;
    for (const auto& kept : r.kept)  // a lost node's newcomers (or renumbering) under way
      if (kept.round == x.round && kept.at <= to && kept.recovered.value_or(Time::max()) >= from)
        return false;
    return true;
  };
  // A round that ended otherwise than by a failure (a node joined, or was lost) cut its
  // recoveries short: no worker's failure came of them.
  auto endedOtherwise = [&](const RoundId& round) {
    const auto seen = r.ends.find(round);
    if (seen == r.ends.end()) return false;
    return std::any_of(seen->second.begin(), seen->second.end(),
                       [](const auto& end) { return end.second.kind != Kind::WorkerFailed; });
  };
  // A round that kept running workers (a node lost): with no fault from when it began until
  // kRecovers after, nor a connection of their store cut or its replies lost, they meet their
  // newcomers, or each other renumbered, well within kRecovers, unless the round ended otherwise
  // first (a node joined). Not checked where a stopped agent's node ran again near it: that node,
  // lost, may come back before its agent stops its workers, which then fill a meeting that cannot
  // form (the recovery's deadline ends it: a whole-group restart).
  auto stoppedNear = [&](Time at) {
    return std::any_of(r.paused.begin(), r.paused.end(), [&](const auto& p) {
      return p.second.second >= at - kRecovers && p.second.first <= at + kRecovers;
    });
  };
  for (const auto& k : r.kept) {
    if ((k.recovered && *k.recovered - k.at <= kRecovers) ||
        std::any_of(r.faults.begin(), r.faults.end(),
                    [&](Time t) { return t >= k.at && t <= k.at + kRecovers; }) ||
        endedOtherwise(k.round) || stoppedNear(k.at) ||
        !k.meeting ||  // past their meeting when kept: their recovery fails, a fallback
        std::any_of(r.workerFaults.begin(), r.workerFaults.end(),
                    [&](Time t) { return t > k.since && t <= k.at + kRecovers; }) ||
        // kept again before an earlier keep of theirs recovered: that one answers for it
        std::any_of(r.kept.begin(), r.kept.end(),
                    [&](const Kept& e) {
                      return &e != &k && e.owner == k.owner && e.space == k.space && e.at < k.at &&
                             !e.recovered;
                    }) ||
        r.workerStoreCut.count(k.space) ||
        // replies lost from when the lost node's end was seen, as a worker's fault above: a
        // kept peer's recovery that lost one falls back while the round forms, failing it
        std::any_of(r.replyLoss.begin(), r.replyLoss.end(), [&](const auto& span) {
          return span.second >= std::min(k.since, k.at - before);
        }))
      continue;
    // A rank of their round that left the loop (its last barrier done just before its node, the
    // lost one, stopped its other ranks, cutting the barrier short for the rest) makes every later
    // meeting in their key space hopeless, a newcomer in its place or not: recovery.py's done
    // check falls back to the whole-group restart at its next look, as for a replacement (below).
    const auto left = r.leftLoop.find(k.space);
    if (left != r.leftLoop.end() && left->second <= k.at + kRecovers) {
      const auto fell = r.fellBack.find(k.space);
      if (fell != r.fellBack.end() && fell->second <= std::max(k.at, left->second) + kRecovers)
        continue;
      return roundName(k.round) + ": " + name(r, k.owner) + "'s workers, kept from " +
             roundName(k.space) +
             ", can meet no rank that left the loop, and the round did not "
             "fall back within " +
             secs(kRecovers);
    }
    return roundName(k.round) + ": " + name(r, k.owner) + "'s workers, kept from " +
           roundName(k.space) + " at " + secs(std::chrono::duration_cast<Duration>(k.at - Time{})) +
           ", formed no new generation within " + secs(kRecovers) +
           ", though no fault came in that time";
  }
  for (const auto& x : r.replacements) {
    if ((x.recovered && *x.recovered - x.at <= kRecovers) || !quiet(x) || endedOtherwise(x.round))
      continue;
    // A rank that left the loop (its last barrier done, as the worker died just past its own)
    // never meets the replacement: the round falls back to the whole-group restart, in time.
    const auto left = r.leftLoop.find(x.space);
    const auto fell = r.fellBack.find(x.space);
    if (left != r.leftLoop.end() && left->second <= x.at + kRecovers) {
      if (fell != r.fellBack.end() && fell->second <= std::max(x.at, left->second) + kRecovers)
        continue;
      return roundName(x.round) + ": rank " + std::to_string(x.rank) + "'s replacement (" +
             name(r, x.owner) +
             ") can meet no rank that left the loop, and the round did not "
             "fall back within " +
             secs(kRecovers);
    }
    return roundName(x.round) + ": rank " + std::to_string(x.rank) + "'s replacement (" +
           name(r, x.owner) + ", at " + secs(std::chrono::duration_cast<Duration>(x.at - Time{})) +
           ") did not recover within " + secs(kRecovers) +
           ", though nothing else reached the "
           "round's workers";
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> firstViolation(const Record& record, const Simulation&) {
  for (auto check : {checkRounds, checkRosters, checkFormed, checkEnds, checkOutcomes, checkOverlap,
                     checkInProcess})
    if (auto broken = check(record)) return broken;
  return std::nullopt;
}

}  // namespace dlrun::sim
