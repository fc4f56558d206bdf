#include "rendezvous/elastic_protocol.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::rendezvous::elastic {
namespace {

NodeRecord node(std::string addr, int nproc, std::optional<int> hint = std::nullopt) {
  NodeRecord r;
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
  const Plan plan = planRound({node("10.0.0.1", 1, 7), node("10.0.0.2", 1, 3), node("10.0.0.3", 1)});
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

  Plan plan = planRound({node("10.0.0.1", 1)});
  EXPECT_FALSE(decodePlan(encodePlan(plan)).byArrival[0].masterAddr);
  plan.byArrival[0].masterAddr = "fd00::1";
  plan.byArrival[0].masterPort = 40123;
  const Assignment back = decodePlan(encodePlan(plan)).byArrival[0];
  EXPECT_EQ(back.masterAddr, "fd00::1");
  EXPECT_EQ(back.masterPort, 40123);
  EXPECT_THROW(decodePlan(R"({"group_ranks":[0],"base_ranks":[0],"world_size":1,"failures":0,)"
                          R"("endpoints":["a:1"],"master_addr":"a"})"),
               ProtocolError);  // an address without its port
  EXPECT_THROW(decodeNodeRecord(R"({"addr":"a","name":"n","nproc":1,"ports":[1],"failures":0,)"
                                R"("store":70000})"),
               ProtocolError);  // not a port
}

TEST(Codecs, RecordsPlansAndEndsRoundTrip) {
  NodeRecord r = node("fd00::1", 2, 5);
  r.failures = 1;
  r.lastGroupRank = 3;
  const NodeRecord back = decodeNodeRecord(encode(r));
  EXPECT_EQ(back.addr, r.addr);
  EXPECT_EQ(back.rankHint, 5);
  EXPECT_EQ(back.lastGroupRank, 3);
  EXPECT_EQ(back.workerPorts, r.workerPorts);
  EXPECT_EQ(back.failures, 1);

  // Arrivals 1..3 with 4, 2 and 6 workers; the rank hints make arrival 3 group rank 0.
  const NodeRecord first = node("10.0.0.1", 4), third = node("10.0.0.3", 6, 0);
  NodeRecord second = node("10.0.0.2", 2);
  second.failures = 1;
  second.roles = {"ps", "ps"};
  const Plan plan = planRound({first, second, third});
  const Plan pb = decodePlan(encodePlan(plan));
  ASSERT_EQ(pb.byArrival.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(pb.byArrival[i].groupRank, plan.byArrival[i].groupRank);
    EXPECT_EQ(pb.byArrival[i].baseRank, plan.byArrival[i].baseRank);
    EXPECT_EQ(pb.byArrival[i].groupWorldSize, 3);
    EXPECT_EQ(pb.byArrival[i].worldSize, 12);
    EXPECT_EQ(pb.byArrival[i].failures, 1);  // the round's: the most any member saw
  }
  EXPECT_EQ(pb.byArrival[2].groupRank, 0);
  EXPECT_EQ(pb.byArrival[0].baseRank, 6);
  EXPECT_EQ(pb.roster.endpoints, plan.roster.endpoints);
  EXPECT_EQ(pb.roster.roles, plan.roster.roles);
  EXPECT_EQ(pb.roster.roles[6], "worker");  // arrival 1's first worker, after arrival 3's six
  EXPECT_EQ(pb.roster.roles[10], "ps");

  RoundEnd e{.kind = RoundEnd::Kind::WorkerFailed, .node = "n1 (10.0.0.2)", .rank = 5,
             .exitCode = 3, .failures = 2, .final = true, .report = "dlrun: line\n"};
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
  EXPECT_THROW(decodeNodeRecord(R"({"addr":"a","name":"n","nproc":2,"ports":[1],"failures":0})"),
               ProtocolError);  // two workers, one port
  EXPECT_THROW(decodePlan(R"({"group_ranks":"zero"})"), ProtocolError);
  const std::string plan = encodePlan(planRound({node("10.0.0.1", 1), node("10.0.0.2", 1)}));
  EXPECT_NO_THROW(decodePlan(plan));
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string text = plan;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  EXPECT_THROW(decodePlan(edited(R"("world_size":2)", R"("world_size":3)")), ProtocolError);
  EXPECT_THROW(decodePlan(edited(R"("base_ranks":[0,1])", R"("base_ranks":[0])")), ProtocolError);
  EXPECT_THROW(decodePlan(edited(R"("group_ranks":[0,1])", R"("group_ranks":[0,2])")),
               ProtocolError);  // no such group rank
  EXPECT_THROW(decodePlan(edited(R"("group_ranks":[0,1])", R"("group_ranks":[])")),
               ProtocolError);  // no member
  EXPECT_THROW(decodeRoundEnd(R"({"kind":"exploded","node":"x"})"), ProtocolError);
  EXPECT_THROW(decodeRoster("{}"), ProtocolError);
  EXPECT_THROW(decodeRoster(R"({"endpoints":["a:1"],"roles":[]})"), ProtocolError);
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

TEST(Keys, RoundsAndRunsDoNotShareKeys) {
  const Keys a("job"), b("job2");
  EXPECT_NE(a.closed(1), a.closed(11));
  EXPECT_NE(a.node(1, 2), a.node(12, 1));
  EXPECT_NE(a.current(), b.current());
  EXPECT_NE(a.plan(3), a.plan(31));
}

}  // namespace
}  // namespace dlrun::rendezvous::elastic
