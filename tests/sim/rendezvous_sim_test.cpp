// The simulation's own promises: a seed replays bit for bit, different seeds differ, and each
// kind of fault it injects, on dlrund and on etcd, happens within a modest range of seeds, and
// in-process recovery takes each of its ways there.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "tests/sim/sim_job.h"

namespace dlrun::sim {
namespace {

bool traceHas(const Verdict& v, const std::string& text) {
  return std::any_of(v.trace.begin(), v.trace.end(),
                     [&](const std::string& line) { return line.find(text) != std::string::npos; });
}

TEST(RendezvousSim, ASeedReplaysBitForBit) {
  for (uint64_t seed : {7u, 1234u, 99991u}) {
    const Verdict first = runSchedule(seed, true);
    const Verdict again = runSchedule(seed, true);
    EXPECT_EQ(first.digest, again.digest) << "seed " << seed;
    EXPECT_EQ(first.trace, again.trace) << "seed " << seed;
    EXPECT_EQ(first.digest, runSchedule(seed, false).digest) << "tracing changes nothing";
  }
}

TEST(RendezvousSim, SeedsMakeDifferentSchedules) {
  std::set<uint64_t> digests;
  for (uint64_t seed = 1; seed <= 50; ++seed) digests.insert(runSchedule(seed, false).digest);
  EXPECT_EQ(digests.size(), 50u);
}

TEST(RendezvousSim, EveryKindOfFaultIsInjectedAndTheJobsEndEveryWay) {
  const std::vector<std::string> wanted{"FAULT cut a connection",
                                        "(applied; reply lost)",
                                        "FAULT stop the store",
                                        "FAULT restart the store",
                                        "FAULT stop n",
                                        "FAULT kill n",
                                        "start it again",
                                        "FAULT SIGTERM",
                                        "'s worker fails",
                                        "waiting as a spare",
                                        "ends: every worker finished",
                                        "stopped answering",
                                        "granted etcd lease",
                                        "lapsed",
                                        "etcd answers again",
                                        "reply lost: the call is made again",
                                        "'s connection fails",
                                        "FAULT kill a worker of n",
                                        "replaced alone",
                                        "recovered in process, generation 2",
                                        "falls back to the whole-group restart",
                                        "no in-process recovery (it had left"};
  std::set<std::string> seen;
  for (uint64_t seed = 1; seed <= 400 && seen.size() < wanted.size(); ++seed) {
    const Verdict v = runSchedule(seed, true);
    for (const auto& text : wanted)
      if (traceHas(v, text)) seen.insert(text);
  }
  for (const auto& text : wanted) EXPECT_TRUE(seen.count(text)) << "never seen: " << text;
}

// Schedules the soak found breaking an invariant, kept once mended.
TEST(RendezvousSim, TheSoaksFindingsHold) {
  // The store restarted without the job's keys: n4 named round 3 anew while the others, members
  // of the old round 3, went on to round 4; n4 waited alone until its join timeout.
  // 1029590: the store stopped past a lease, n2 was taken for lost and stopped its workers as
  // one of them passed the last barrier (its ADD to done landed, its reply did not); the others'
  // kept workers fell back to the whole-group restart, as they must, which the checker took
  // for a kept round that never met (the model did not count the rank as out of the loop).
  // 1178605: replies lost as n4 was lost had n3's kept workers fall back while round 7 formed
  // (it failed, a whole-group restart); the checker looked for lost replies 2 s before n2's
  // keep only, not from the loss it kept its workers through.
  // 1029513: a failure's report wrote the round's end, its reply lost; it was made again only
  // once the round was forgotten, so the job's count of failures was never written, and the
  // next round, closed by the spare, counted 0 failures before it (every node that reads a
  // failure's end now raises the count). 1273085: the count raised before the end instead
  // counted a failure whose round a lost node ended: past --max-restarts, and the nodes that
  // lost the next round's final end to an outage went on. 1077293 (etcd): a spare saw a stop
  // and no end in its round yet, and ended as stopped; the round's last worker finished just
  // after and its node, with the stopper, ended as finished (a node that sees a stop now
  // writes it to the round's end itself, first writer wins). 1595103: n4, stopped past its lease
  // as its worker failed, came back once its round was forgotten; its late report wrote that
  // round an end before taking it back, and n4 read it: the round's failure for it alone (an
  // end of a forgotten round is no end now). 1638205: n4, its lease lost, was stopped between its
  // look at whether its round was forgotten and the start of its wait, and then waited for
  // that round's end for good (the wait's first piece now counts the stop). 1693467: a store
  // stopped 9 s past a lost node had n3's agent kill its kept workers (they never saw the loss),
  // which failed the next round as it formed; the checker took n2's kept workers, restarted with
  // everyone's, for a recovery that never came (the kill now counts as a worker's fault). 1055748:
  // n5 closed a round that kept its workers, never learnt its place (replies lost) and ended that
  // round; its kept workers ran on, waiting 45 s for a meeting that could never come, while the
  // others started the next rounds' (they stop now). 2125573: the last rank to arrive in a
  // recovery's meeting (a replacement) said it was complete and its node was lost before the
  // group formed: the survivors waited in the formation for its ranks until the recovery's
  // deadline, though the round that kept them had moved them (a watch now looks for the move
  // as the group forms). 2391677: the store restarted without its keys just after one node read
  // that every worker finished; the others, which had not, ended in the store's next life,
  // stopped: the checker compared them by the life of their last round, not of their end.
  // 2571612: n2's agent, stopped 10 s as it joined with kept workers, came back to a store that
  // had restarted without the job's keys, another node having written them again; its kept
  // workers ran on 40 s, waiting for a meeting whose keys were gone (a join an outage cut
  // short now drops them). 3241933 (etcd): n5, stopped as its round closed, learnt its place
  // there once the others had formed two rounds more and forgotten it, and waited for that
  // round's end for good (its first look at whether the round was forgotten was for members
  // slow to begin waiting only). Found by the soak; a schedule's replay moves with the
  // protocol's store operations.
  for (uint64_t seed : {1410683u, 1029590u, 1178605u, 1029513u, 1273085u, 1077293u, 1595103u,
                        1638205u, 1693467u, 1055748u, 2125573u, 2391677u, 2571612u, 3241933u}) {
    const Verdict v = runSchedule(seed, false);
    EXPECT_TRUE(v.ok) << "seed " << seed << ": " << v.violation;
  }
}

}  // namespace
}  // namespace dlrun::sim
