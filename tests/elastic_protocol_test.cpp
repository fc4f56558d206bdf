#include "rendezvous/elastic_protocol.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>

#include "common/error.h"

namespace dlrun::rendezvous::elastic {
namespace {

NodeRecord node(std::string addr, int nproc, std::optional<int> hint = std::nullopt) {
  NodeRecord r;
  r.id = "id-" + addr;
  r.addr = std::move(addr);
  r.name = "host-" + r.addr;
  r.nproc = nproc;
  r.rankHint = hint;
  for (int i = 0; i < nproc; ++i) r.workerPorts.push_back(static_cast<uint16_t>(5000 + i));
  return r;
}

TEST(PlanRound, GroupRanksFollowNumericAddressesNotText) {
  const Plan plan = planRound({node("10.0.0.10", 1), node("10.0.0.9", 1), node("10.0.0.100", 1)});
  EXPECT_EQ(plan.byArrival[0].groupRank, 1);
  EXPECT_EQ(plan.byArrival[1].groupRank, 0);
  EXPECT_EQ(plan.byArrival[2].groupRank, 2);
  EXPECT_EQ(plan.roster.endpoints,
            (std::vector<std::string>{"10.0.0.9:5000", "10.0.0.10:5000", "10.0.0.100:5000"}));
}

TEST(PlanRound, RankHintsComeFirstAndGapsAreClosed) {
  const Plan plan =
      planRound({node("10.0.0.1", 1, 7), node("10.0.0.2", 1, 3), node("10.0.0.3", 1)});
  EXPECT_EQ(plan.byArrival[1].groupRank, 0);
  EXPECT_EQ(plan.byArrival[0].groupRank, 1);
  EXPECT_EQ(plan.byArrival[2].groupRank, 2);  // no hint: after every hinted node
}

TEST(PlanRound, BaseRanksArePrefixSumsOfDifferentWorkerCounts) {
  const Plan plan = planRound({node("10.0.0.3", 1), node("10.0.0.1", 4), node("10.0.0.2", 2)});
  EXPECT_EQ(plan.byArrival[1].baseRank, 0);
  EXPECT_EQ(plan.byArrival[2].baseRank, 4);
  EXPECT_EQ(plan.byArrival[0].baseRank, 6);
  for (const Assignment& a : plan.byArrival) {
    EXPECT_EQ(a.worldSize, 7);
    EXPECT_EQ(a.groupWorldSize, 3);
  }
  ASSERT_EQ(plan.roster.endpoints.size(), 7u);
  EXPECT_EQ(plan.roster.endpoints[4], "10.0.0.2:5000");
  EXPECT_EQ(plan.roster.endpoints[6], "10.0.0.3:5000");
}

TEST(PlanRound, SameAddressKeepsLastRoundsOrderThenArrival) {
  NodeRecord a = node("127.0.0.1", 1), b = node("127.0.0.1", 1), c = node("127.0.0.1", 1);
  a.lastGroupRank = 1;
  b.lastGroupRank = 0;
  const Plan plan = planRound({a, b, c});  // c is new: after the survivors
  EXPECT_EQ(plan.byArrival[0].groupRank, 1);
  EXPECT_EQ(plan.byArrival[1].groupRank, 0);
  EXPECT_EQ(plan.byArrival[2].groupRank, 2);
}

TEST(PlanRound, Ipv6RosterEntriesAreBracketed) {
  const Plan plan = planRound({node("fd00::2", 1), node("10.0.0.1", 1)});
  EXPECT_EQ(plan.roster.endpoints, (std::vector<std::string>{"10.0.0.1:5000", "[fd00::2]:5000"}));
}

TEST(PlanRound, RolesFollowRanksAndANodeWithoutRolesRunsWorkers) {
  NodeRecord ps = node("10.0.0.1", 2), plain = node("10.0.0.2", 1);
  ps.roles = {"ps", "worker"};
  const Plan plan = planRound({plain, ps});
  EXPECT_EQ(plan.roster.roles, (std::vector<std::string>{"ps", "worker", "worker"}));
  EXPECT_EQ(decodeNodeRecord(encode(ps)).roles, ps.roles);
  EXPECT_TRUE(planRound({plain}).roster.roles.empty());
}

TEST(PlanRound, FailureCountIsTheHighestAnyMemberSaw) {
  NodeRecord a = node("10.0.0.1", 1), b = node("10.0.0.2", 1);
  a.failures = 2;  // b is a spare that never saw the failures
  for (const Assignment& x : planRound({a, b}).byArrival) EXPECT_EQ(x.failures, 2);
}

TEST(PlanRound, WithoutAWorkersStoreAssignmentsNameNone) {
  // c10d: the workers use the rendezvous store, so the round names no other.
  for (const Assignment& x : planRound({node("10.0.0.1", 1), node("10.0.0.2", 1)}).byArrival) {
    EXPECT_FALSE(x.masterAddr);
    EXPECT_FALSE(x.masterPort);
  }
}

TEST(PlanRound, GroupRankZerosWorkersStoreIsEveryMembersMaster) {
  // etcd: every agent serves a store; the one of group rank 0 (10.0.0.2 here, by address)
  // serves the round's workers, whoever arrived first.
  NodeRecord a = node("10.0.0.3", 1), b = node("10.0.0.2", 2), c = node("10.0.0.4", 1);
  a.storePort = 4003;
  b.storePort = 4002;
  c.storePort = 4004;
  const Plan plan = planRound({a, b, c});
  for (const Assignment& x : plan.byArrival) {
    EXPECT_EQ(x.masterAddr, "10.0.0.2");
    EXPECT_EQ(x.masterPort, 4002);
  }
  EXPECT_EQ(plan.byArrival[1].groupRank, 0);

  // The next round without 10.0.0.2: 10.0.0.3 is group rank 0 and serves.
  const Plan after = planRound({a, c});
  for (const Assignment& x : after.byArrival) {
    EXPECT_EQ(x.masterAddr, "10.0.0.3");
    EXPECT_EQ(x.masterPort, 4003);
  }
}

// A survivor of round `space` that keeps its workers: group rank `groupRank` of `nodes`, its
// ranks from `baseRank`, `worldSize` in all.
NodeRecord keeper(std::string addr, int nproc, int groupRank, int nodes, int baseRank,
                  int worldSize, int space = 4) {
  NodeRecord r = node(std::move(addr), nproc);
  r.lastGroupRank = groupRank;
  r.kept = KeptWorkers{space, groupRank, nodes, baseRank, worldSize, r.workerPorts};
  return r;
}

TEST(PlanRound, KeepersKeepTheirPlacesAndANewcomerTakesTheLostOnes) {
  // Three nodes of 2 workers; 10.0.0.2 (group rank 1, ranks 2-3) was lost and a spare came,
  // whose address sorts first: it takes group rank 1, not 0.
  const NodeRecord a = keeper("10.0.0.1", 2, 0, 3, 0, 6), c = keeper("10.0.0.3", 2, 2, 3, 4, 6);
  const NodeRecord spare = node("10.0.0.0", 2);
  const Plan plan = planRound({c, spare, a});
  EXPECT_EQ(plan.byArrival[2].groupRank, 0);
  EXPECT_EQ(plan.byArrival[1].groupRank, 1);
  EXPECT_EQ(plan.byArrival[0].groupRank, 2);
  EXPECT_EQ(plan.byArrival[1].baseRank, 2);
  for (const Assignment& x : plan.byArrival) {
    EXPECT_EQ(x.keptSpace, 4);  // every worker stays in round 4's key space
    EXPECT_EQ(x.worldSize, 6);
    EXPECT_EQ(x.groupWorldSize, 3);
  }
  EXPECT_TRUE(plan.byArrival[1].joins);
  EXPECT_FALSE(plan.byArrival[0].joins);
  EXPECT_FALSE(plan.byArrival[2].joins);
  EXPECT_EQ(plan.roster.endpoints[2], "10.0.0.0:5000");
  const Assignment back = decodeAssignment(encode(plan.byArrival[1]));
  EXPECT_EQ(back.keptSpace, 4);
  EXPECT_TRUE(back.joins);
  const NodeJob job{"run", 2, 0, "10.0.0.9", 29400};
  const World joiner = makeWorld(job, 6, plan.byArrival[1], {});
  EXPECT_EQ(joiner.spaceRound, 4);
  EXPECT_TRUE(joiner.joinInProcess);
  EXPECT_FALSE(joiner.keptWorkers);
  const World kept = makeWorld(job, 6, plan.byArrival[0], {});
  EXPECT_TRUE(kept.keptWorkers);
  // What it offers if another node is lost: still round 4's key space.
  EXPECT_EQ(keptFrom(kept, {5000, 5001}), (KeptWorkers{4, 2, 3, 4, 6, {5000, 5001}}));
  EXPECT_EQ(makeWorld(job, 6, planRound({node("10.0.0.1", 2)}).byArrival[0], {}).spaceRound, 6);
}

TEST(PlanRound, KeepersAloneInASmallerRoundAreRenumberedInTheirOldOrder) {
  // Three nodes of 2 workers; group rank 0 (ranks 0-1) was lost, no spare came.
  const NodeRecord b = keeper("10.0.0.2", 2, 1, 3, 2, 6), c = keeper("10.0.0.0", 2, 2, 3, 4, 6);
  const Plan plan = planRound({c, b});  // c's address sorts first: the old order wins
  EXPECT_EQ(plan.byArrival[1].groupRank, 0);
  EXPECT_EQ(plan.byArrival[1].baseRank, 0);
  EXPECT_EQ(plan.byArrival[0].groupRank, 1);
  EXPECT_EQ(plan.byArrival[0].baseRank, 2);
  for (const Assignment& x : plan.byArrival) {
    EXPECT_EQ(x.worldSize, 4);
    EXPECT_EQ(x.groupWorldSize, 2);
    EXPECT_EQ(x.keptSpace, 4);
    EXPECT_FALSE(x.joins);
  }
  EXPECT_EQ(plan.roster.endpoints, (std::vector<std::string>{"10.0.0.2:5000", "10.0.0.2:5001",
                                                             "10.0.0.0:5000", "10.0.0.0:5001"}));
  // etcd: the lost group rank 0 served the workers' store: nothing to keep.
  NodeRecord bs = b, cs = c;
  bs.storePort = 4002;
  cs.storePort = 4000;
  EXPECT_FALSE(planRound({cs, bs}).byArrival[0].keptSpace);
}

TEST(PlanRound, KeptWorkersThatCannotBeKeptRestartWithEveryones) {
  const NodeRecord a = keeper("10.0.0.1", 2, 0, 2, 0, 4);
  auto usual = [](const Plan& plan) {
    return std::none_of(plan.byArrival.begin(), plan.byArrival.end(),
                        [](const Assignment& x) { return x.keptSpace || x.joins; });
  };
  // Fewer nodes, one of them new: neither refilled nor kept alone.
  EXPECT_TRUE(usual(planRound({keeper("10.0.0.1", 2, 0, 3, 0, 6), node("10.0.0.5", 2)})));
  EXPECT_TRUE(usual(planRound({a, node("10.0.0.2", 1)})));  // a newcomer of another size
  EXPECT_TRUE(usual(planRound({a, keeper("10.0.0.2", 2, 1, 2, 2, 4, 3)})));  // another round's
  EXPECT_TRUE(usual(planRound({a, keeper("10.0.0.2", 2, 0, 2, 0, 4)})));     // one place twice
  NodeRecord withRoles = node("10.0.0.2", 2);
  withRoles.roles = {"ps", "worker"};
  EXPECT_TRUE(usual(planRound({a, withRoles})));
  // etcd: group rank 0's node served the workers' store, and it is the one lost.
  NodeRecord b = keeper("10.0.0.2", 2, 1, 2, 2, 4), spare = node("10.0.0.3", 2);
  b.storePort = 4002;
  spare.storePort = 4003;
  EXPECT_TRUE(usual(planRound({b, spare})));
  NodeRecord zero = a;
  zero.storePort = 4001;
  const Plan kept = planRound({zero, spare});  // its server survived: kept, and named
  EXPECT_FALSE(usual(kept));
  EXPECT_EQ(kept.byArrival[1].masterPort, 4001);
  // A plan's places as the usual one would give them, whoever kept.
  EXPECT_EQ(planRound({a, node("10.0.0.2", 1)}).byArrival[1].baseRank, 2);
}

TEST(Codecs, AKeptRecordRoundTripsAndOneThatCannotBeIsAProtocolError) {
  const NodeRecord a = keeper("10.0.0.1", 2, 1, 3, 2, 6);
  EXPECT_EQ(decodeNodeRecord(encode(a)).kept, a.kept);
  NodeRecord bad = a;
  bad.kept->baseRank = 5;  // ranks 5-6 of 6
  EXPECT_THROW(decodeNodeRecord(encode(bad)), ProtocolError);
  bad = a;
  bad.kept->workerPorts = {1, 2};  // not the ports it offers
  EXPECT_THROW(decodeNodeRecord(encode(bad)), ProtocolError);
  EXPECT_THROW(decodeAssignment(R"({"group_rank":0,"group_world_size":1,"base_rank":0,)"
                                R"("world_size":1,"failures":0,"joins":true})"),
               ProtocolError);  // joins workers no round kept
}

TEST(MakeWorld, TheRoundsWorkersStoreWinsOverTheJobsOne) {
  const NodeJob job{"run", 2, 0, "10.0.0.9", 29400};
  Assignment a{1, 2, 2, 4, 0};
  World w = makeWorld(job, 3, a, {});
  EXPECT_EQ(w.masterAddr, "10.0.0.9");  // c10d: the rendezvous store
  EXPECT_EQ(w.masterPort, 29400);
  a.masterAddr = "10.0.0.2";
  a.masterPort = 40123;
  w = makeWorld(job, 3, a, {});
  EXPECT_EQ(w.masterAddr, "10.0.0.2");  // etcd: group rank 0's
  EXPECT_EQ(w.masterPort, 40123);
  EXPECT_TRUE(w.agentStore);
}

TEST(Codecs, StorePortAndMasterRoundTripAndStayOptional) {
  NodeRecord r = node("10.0.0.1", 1);
  EXPECT_FALSE(decodeNodeRecord(encode(r)).storePort);
  r.storePort = 40123;
  EXPECT_EQ(decodeNodeRecord(encode(r)).storePort, 40123);

  Assignment a{0, 2, 0, 4, 0};
  EXPECT_FALSE(decodeAssignment(encode(a)).masterAddr);
  a.masterAddr = "fd00::1";
  a.masterPort = 40123;
  const Assignment back = decodeAssignment(encode(a));
  EXPECT_EQ(back.masterAddr, "fd00::1");
  EXPECT_EQ(back.masterPort, 40123);
  EXPECT_THROW(decodeAssignment(R"({"group_rank":0,"group_world_size":1,"base_rank":0,)"
                                R"("world_size":1,"failures":0,"master_addr":"a"})"),
               ProtocolError);  // an address without its port
  EXPECT_THROW(decodeNodeRecord(R"({"id":"x","addr":"a","name":"n","nproc":1,"ports":[1],)"
                                R"("failures":0,"store":70000})"),
               ProtocolError);  // not a port
}

TEST(Codecs, RecordsAssignmentsAndEndsRoundTrip) {
  NodeRecord r = node("fd00::1", 2, 5);
  r.failures = 1;
  r.lastGroupRank = 3;
  const NodeRecord back = decodeNodeRecord(encode(r));
  EXPECT_EQ(back.id, r.id);
  EXPECT_EQ(back.addr, r.addr);
  EXPECT_EQ(back.rankHint, 5);
  EXPECT_EQ(back.lastGroupRank, 3);
  EXPECT_EQ(back.workerPorts, r.workerPorts);
  EXPECT_EQ(back.failures, 1);

  const Assignment a{2, 3, 8, 12, 1};
  const Assignment ab = decodeAssignment(encode(a));
  EXPECT_EQ(ab.groupRank, 2);
  EXPECT_EQ(ab.baseRank, 8);
  EXPECT_EQ(ab.worldSize, 12);

  RoundEnd e{.kind = RoundEnd::Kind::WorkerFailed,
             .node = "n1 (10.0.0.2)",
             .rank = 5,
             .exitCode = 3,
             .failures = 2,
             .final = true,
             .report = "dlrun: line\n"};
  const RoundEnd eb = decodeRoundEnd(encode(e));
  EXPECT_EQ(eb.kind, RoundEnd::Kind::WorkerFailed);
  EXPECT_EQ(eb.rank, 5);
  EXPECT_EQ(eb.exitCode, 3);
  EXPECT_TRUE(eb.final);
  EXPECT_EQ(eb.report, e.report);
  EXPECT_EQ(decodeRoundEnd(encode(RoundEnd{.kind = RoundEnd::Kind::NodeLost, .node = "x"})).kind,
            RoundEnd::Kind::NodeLost);
  EXPECT_EQ(decodeRoster(encodeRoster({{"a:1", "b:2"}, {}})).endpoints,
            (std::vector<std::string>{"a:1", "b:2"}));
  const Roster roles = decodeRoster(encodeRoster({{"a:1", "b:2"}, {"ps", "worker"}}));
  EXPECT_EQ(roles.endpoints, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(roles.roles, (std::vector<std::string>{"ps", "worker"}));
}

TEST(Codecs, MalformedValuesAreProtocolErrors) {
  EXPECT_THROW(decodeNodeRecord("not json"), ProtocolError);
  EXPECT_THROW(
      decodeNodeRecord(R"({"id":"x","addr":"a","name":"n","nproc":2,"ports":[1],"failures":0})"),
      ProtocolError);  // two workers, one port
  EXPECT_THROW(decodeNodeRecord(R"({"addr":"a","name":"n","nproc":1,"ports":[1],"failures":0})"),
               ProtocolError);  // no id: its assignment would have no key
  EXPECT_THROW(
      decodeNodeRecord(R"({"id":"../x","addr":"a","name":"n","nproc":1,"ports":[1],"failures":0})"),
      ProtocolError);  // an id that is a path
  EXPECT_THROW(decodeAssignment(R"({"group_rank":"zero"})"), ProtocolError);
  EXPECT_THROW(decodeRoundEnd(R"({"kind":"exploded","node":"x"})"), ProtocolError);
  EXPECT_THROW(decodeRoster("{}"), ProtocolError);
  EXPECT_THROW(decodeRoster(R"({"endpoints":["a:1"],"roles":[]})"), ProtocolError);
}

TEST(Codecs, ShapesCarryTheProtocolAndProtocol1sAreRead) {
  const Shape shape{.minNodes = 2, .maxNodes = 3};
  EXPECT_EQ(encodeShape(shape), "2:3/p" + std::to_string(kProtocolVersion));
  EXPECT_EQ(decodeShape(encodeShape(shape)), shape);
  EXPECT_EQ(decodeShape("1:4"), (Shape{.minNodes = 1, .maxNodes = 4, .protocol = 1}));
  for (const char* bad : {"", "2", "a:3", "2:3/p", "2:3/px", "2:-1", "2:3/p2x", ":3"})
    EXPECT_THROW(decodeShape(bad), ProtocolError) << bad;
}

TEST(Codecs, MembersAreIdsInArrivalOrder) {
  const std::vector<std::string> ids{"node-b.12", "node-a.7", "node-c.3"};
  EXPECT_EQ(encodeMembers(ids), "node-b.12\nnode-a.7\nnode-c.3\n");
  EXPECT_EQ(decodeMembers(encodeMembers(ids)), ids);
  EXPECT_EQ(decodeMembers("x\ny"), (std::vector<std::string>{"x", "y"}));  // no final newline
  EXPECT_TRUE(decodeMembers("").empty());                                  // the round never closed
}

TEST(EndedJob, AStopOrAFinalRoundEndEndsTheJobAnythingElseDoesNot) {
  EXPECT_FALSE(endedJob("", ""));  // never started
  using Kind = RoundEnd::Kind;
  EXPECT_FALSE(endedJob("", encode(RoundEnd{.kind = Kind::NodeLost, .node = "n"})));
  RoundEnd failed{.kind = Kind::WorkerFailed, .node = "n", .rank = 1, .exitCode = 3};
  EXPECT_FALSE(endedJob("", encode(failed)));  // a restart is left
  failed.final = true;
  EXPECT_EQ(endedJob("", encode(failed))->kind, Kind::WorkerFailed);
  EXPECT_EQ(endedJob("", encode(RoundEnd{.kind = Kind::Finished, .node = "n"}))->kind,
            Kind::Finished);
  const std::string stop = encode(jobStopped(2, "n"));
  EXPECT_EQ(endedJob(stop, "")->kind, Kind::Stopped);
  EXPECT_THROW(endedJob("", "garbage"), ProtocolError);
}

TEST(Codecs, AnExpiryRoundTripsAndMalformedTextIsNone) {
  const Expiry expiry{.endedAt = 1'700'000'000, .ttl = 3600};
  EXPECT_EQ(encode(expiry), "1700000000 3600");
  EXPECT_EQ(decodeExpiry(encode(expiry)), expiry);
  for (const char* text : {"", "1700000000", "1 x", "x 1", "1 -5", "1  2", "1 2 "})
    EXPECT_FALSE(decodeExpiry(text)) << text;
}

TEST(Codecs, AnExpirySaysWhenTheJobEndedAndWhenItsKeysGo) {
  const Expiry expiry{.endedAt = 1'700'000'000, .ttl = 90};  // 2023-11-14 22:13:20 UTC
  setenv("TZ", "UTC", 1);                                    // local time, for the test: UTC
  tzset();
  EXPECT_EQ(describe(expiry, expiry.endedAt + 30, "every worker finished"),
            "ended at 22:13:20 (every worker finished); its keys expire at 22:14:50, in 60 s "
            "(--rdzv-conf job_ttl=90)");
  EXPECT_NE(describe(expiry, expiry.endedAt + 500, "x").find(", in 0 s"), std::string::npos);
}

TEST(Keys, EveryKeyOfAJobIsUnderItsRoot) {
  const Keys keys("job7");
  EXPECT_EQ(keys.root(), "dlrun/job7/");
  for (const auto& key : {keys.current(), keys.shape(), keys.stop(), keys.expiry(),
                          keys.forgotten(), keys.lost("n"), keys.end(3)})
    EXPECT_TRUE(key.starts_with(keys.root())) << key;
}

TEST(Keys, RoundsAndRunsDoNotShareKeys) {
  const Keys a("job"), b("job2");
  EXPECT_NE(a.closed(1), a.closed(11));
  EXPECT_NE(a.node(1, 2), a.node(12, 1));
  EXPECT_NE(a.current(), b.current());
  EXPECT_NE(a.assignment(3, "1"), a.assignment(31, "1"));
  EXPECT_NE(a.assignment(3, "a"), a.assignment(3, "b"));
  const auto forgotten = a.ofRound(3, 2, {"a", "b"});
  for (const auto& key : {a.node(3, 2), a.assignment(3, "b"), a.members(3), a.closed(3)})
    EXPECT_NE(std::find(forgotten.begin(), forgotten.end(), key), forgotten.end()) << key;
}

}  // namespace
}  // namespace dlrun::rendezvous::elastic
