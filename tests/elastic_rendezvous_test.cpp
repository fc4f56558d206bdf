// The multi-node rendezvous against the real store server on loopback; each agent is an
// ElasticRendezvous driven from its own thread, as in dlrun.
#include "rendezvous/elastic_rendezvous.h"

#include <gtest/gtest.h>

#include <future>
#include <optional>
#include <set>

#include "common/asio.h"
#include "common/error.h"
#include "rendezvous/elastic_protocol.h"
#include "store/store_server.h"
#include "store/tcp_store.h"

namespace dlrun::rendezvous {
namespace {

using namespace std::chrono_literals;
using Kind = RoundEnd::Kind;

class ElasticRendezvousTest : public ::testing::Test {
 protected:
  ElasticOptions options(int minNodes, int maxNodes) {
    ElasticOptions o;
    o.runId = "job";
    o.minNodes = minNodes;
    o.maxNodes = maxNodes;
    o.restarts.maxRestarts = 1;
    o.store = HostPort{server_->address(), server_->port()};
    o.self.addr = "127.0.0.1";
    o.self.name = "agent";
    o.self.nproc = 2;
    o.lastCall = 200ms;
    o.joinTimeout = 20s;
    o.heartbeat = 100ms;
    o.leaseTtl = 300ms;
    return o;
  }

  std::vector<std::unique_ptr<ElasticRendezvous>> agents(int count, const ElasticOptions& o) {
    std::vector<std::unique_ptr<ElasticRendezvous>> out;
    for (int i = 0; i < count; ++i) out.push_back(std::make_unique<ElasticRendezvous>(o));
    return out;
  }

  // Runs next() on every agent at once, as separate nodes do.
  static std::vector<std::future<JoinResult>> joinAll(
      const std::vector<ElasticRendezvous*>& agents) {
    std::vector<std::future<JoinResult>> joins;
    for (auto* a : agents) joins.push_back(joinLater(*a));
    return joins;
  }

  static std::vector<World> worlds(std::vector<std::future<JoinResult>>& joins) {
    std::vector<World> out;
    for (auto& j : joins) out.push_back(std::get<World>(j.get()));
    return out;
  }

  // Every agent joins at once; returns their worlds.
  static std::vector<World> formRound(const std::vector<std::unique_ptr<ElasticRendezvous>>& v) {
    auto joins = joinAll(raw(v));
    return worlds(joins);
  }

  // One more agent joins in the background, as a node arriving later does.
  static std::future<JoinResult> joinLater(ElasticRendezvous& agent) {
    return std::async(std::launch::async, [&agent] { return agent.next(); });
  }

  static std::vector<ElasticRendezvous*> raw(
      const std::vector<std::unique_ptr<ElasticRendezvous>>& v) {
    std::vector<ElasticRendezvous*> out;
    for (const auto& a : v) out.push_back(a.get());
    return out;
  }

  // Two agents in round 0 with a store_outage_timeout of 1 s; then their store goes and its
  // port is held by a listener that accepts and never answers (no refusal, only silence) until
  // silent_ is reset.
  std::vector<std::unique_ptr<ElasticRendezvous>> roundThenSilence() {
    ElasticOptions o = options(2, 2);
    o.storeOutage = 1s;
    auto a = agents(2, o);
    formRound(a);
    const uint16_t port = server_->port();
    server_.reset();
    silent_.emplace(silentIo_, boost::asio::ip::tcp::endpoint(
                                   boost::asio::ip::make_address("127.0.0.1"), port));
    return a;
  }

  // Restarted in place by the outage tests.
  std::unique_ptr<StoreServerThread> server_ =
      std::make_unique<StoreServerThread>(StoreServerOptions{.listen = {"127.0.0.1", 0}});
  boost::asio::io_context silentIo_;
  std::optional<boost::asio::ip::tcp::acceptor> silent_;
};

TEST_F(ElasticRendezvousTest, ThreeAgentsGetUniqueConsistentRanks) {
  auto a = agents(3, options(3, 3));
  const std::vector<World> w = formRound(a);
  std::set<int> groupRanks, baseRanks;
  for (const World& x : w) {
    groupRanks.insert(x.groupRank);
    baseRanks.insert(x.baseRank);
    EXPECT_EQ(x.groupWorldSize, 3);
    EXPECT_EQ(x.worldSize, 6);
    EXPECT_EQ(x.baseRank, 2 * x.groupRank);
    EXPECT_EQ(x.round, 0);
    EXPECT_EQ(x.workerEndpoints, w[0].workerEndpoints);
    EXPECT_EQ(x.masterPort, server_->port());
  }
  EXPECT_EQ(groupRanks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(w[0].workerEndpoints.size(), 6u);
}

TEST_F(ElasticRendezvousTest, ClosesAtOnceAtMaxWithoutWaitingForTheLastCall) {
  ElasticOptions o = options(2, 4);
  o.lastCall = 60s;  // were it waited for, the join below would outlast the test's timeout
  auto a = agents(4, o);
  const auto start = std::chrono::steady_clock::now();
  for (const World& x : formRound(a)) EXPECT_EQ(x.groupWorldSize, 4);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

TEST_F(ElasticRendezvousTest, ClosesAfterTheLastCallWithFewerThanMax) {
  auto a = agents(3, options(2, 4));
  for (const World& x : formRound(a)) EXPECT_EQ(x.groupWorldSize, 3);
}

TEST_F(ElasticRendezvousTest, JoinTimesOutWithTooFewNodes) {
  ElasticOptions o = options(2, 2);
  o.joinTimeout = 300ms;
  ElasticRendezvous alone(o);
  try {
    alone.next();
    FAIL() << "joined alone";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of at least 2"), std::string::npos) << e.what();
  }
}

TEST_F(ElasticRendezvousTest, AnotherJobShapeWithTheSameIdIsRefused) {
  ElasticRendezvous first(options(2, 3));
  try {
    ElasticRendezvous second(options(1, 4));
    FAIL() << "a second shape was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--nnodes=2:3"), std::string::npos) << e.what();
  }
}

TEST_F(ElasticRendezvousTest, ANodeOfAnotherProtocolIsRefusedInOneLine) {
  // The shape as a dlrun of rendezvous protocol 1 wrote it: no protocol in it.
  TcpStore older({.at = {server_->address(), server_->port()}});
  older.set(elastic::Keys("job").shape(), "2:3");
  try {
    ElasticRendezvous newer(options(2, 3));
    FAIL() << "a node of another protocol was accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "job 'job' was started by a dlrun that speaks rendezvous protocol 1, and this one "
              "speaks " +
                  std::to_string(elastic::kProtocolVersion) +
                  ": run the same dlrun version on every node of a job");
  }
}

TEST_F(ElasticRendezvousTest, ALostAgentEndsTheRoundForEveryoneAndTheRestGoOn) {
  ElasticOptions o = options(2, 3);
  o.lastCall = 60s;  // the survivors are all the next round expects: no last call
  auto a = agents(3, o);
  const auto start = std::chrono::steady_clock::now();
  formRound(a);
  a.pop_back();  // its connections close, as when the process is killed
  auto ends = std::vector<RoundEnd>{a[0]->awaitEnd(), a[1]->awaitEnd()};
  for (const RoundEnd& e : ends) EXPECT_EQ(e.kind, Kind::NodeLost) << e.describe();
  for (const World& x : formRound(a)) {
    EXPECT_EQ(x.round, 1);
    EXPECT_EQ(x.groupWorldSize, 2);
    EXPECT_EQ(x.worldSize, 4);
    EXPECT_EQ(x.failures, 0);  // a membership change is not a failure
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

TEST_F(ElasticRendezvousTest, AFailureEndsTheRoundForEveryoneAndCountsUntilFinal) {
  auto a = agents(2, options(2, 2));  // --max-restarts=1
  formRound(a);
  a[1]->reportFailure({.node = "n1", .rank = 3, .exitCode = 7, .report = "why"});
  RoundEnd first = a[0]->awaitEnd();
  EXPECT_EQ(first.kind, Kind::WorkerFailed);
  EXPECT_EQ(first.failures, 1);
  EXPECT_FALSE(first.final);
  EXPECT_EQ(a[1]->awaitEnd().rank, 3);

  for (const World& x : formRound(a)) EXPECT_EQ(x.failures, 1);
  a[0]->reportFailure({.node = "n0", .rank = 0, .exitCode = 9, .report = "root cause"});
  for (auto& agent : a) {
    RoundEnd last = agent->awaitEnd();
    EXPECT_TRUE(last.final);
    EXPECT_EQ(last.exitCode, 9);
    EXPECT_EQ(last.report, "root cause");
  }
}

TEST_F(ElasticRendezvousTest, TheRoundFinishesWhenEveryMemberSucceeded) {
  auto a = agents(2, options(2, 2));
  formRound(a);
  a[0]->reportSuccess();
  a[1]->reportSuccess();
  EXPECT_EQ(a[0]->awaitEnd().kind, Kind::Finished);
  EXPECT_EQ(a[1]->awaitEnd().kind, Kind::Finished);
}

TEST_F(ElasticRendezvousTest, ALateNodeIsAdmittedAtTheNextRound) {
  auto a = agents(2, options(2, 3));
  formRound(a);
  ElasticRendezvous late(options(2, 3));
  auto lateJoin = joinLater(late);
  for (auto& agent : a) EXPECT_EQ(agent->awaitEnd().kind, Kind::NodeJoined);
  const std::vector<World> w = formRound(a);
  const World l = std::get<World>(lateJoin.get());
  EXPECT_EQ(l.groupWorldSize, 3);
  EXPECT_EQ(l.round, 1);
  for (const World& x : w) EXPECT_EQ(x.groupWorldSize, 3);
}

TEST_F(ElasticRendezvousTest, ASpareTakesTheLostNodesPlace) {
  ElasticOptions o = options(1, 2);
  o.lastCall = 60s;  // the survivor and the spare fill the round: no last call
  auto a = agents(2, o);
  formRound(a);
  ElasticRendezvous spare(o);
  auto spareJoin = joinLater(spare);
  // The job runs at its maximum: the spare waits instead of ending the round.
  EXPECT_EQ(spareJoin.wait_for(300ms), std::future_status::timeout);
  a.pop_back();
  EXPECT_EQ(a[0]->awaitEnd().kind, Kind::NodeLost);
  EXPECT_EQ(formRound(a)[0].groupWorldSize, 2);
  EXPECT_EQ(std::get<World>(spareJoin.get()).groupWorldSize, 2);
}

TEST_F(ElasticRendezvousTest, ASpareLeavesWhenTheJobFinishes) {
  auto a = agents(1, options(1, 1));
  formRound(a);
  ElasticRendezvous spare(options(1, 1));
  auto spareJoin = joinLater(spare);
  a[0]->reportSuccess();
  const JoinResult result = spareJoin.get();
  ASSERT_TRUE(std::holds_alternative<RoundEnd>(result));
  EXPECT_EQ(std::get<RoundEnd>(result).kind, Kind::Finished);
}

TEST_F(ElasticRendezvousTest, ALostNodeIsRefusedWhereLostNodesAreNotTakenBack) {
  ElasticOptions o = options(1, 2);
  o.refuseLostNodes = true;
  o.self.name = "node7";
  auto gone = std::make_unique<ElasticRendezvous>(o);
  ElasticOptions other = o;
  other.self.name = "node8";
  ElasticRendezvous stays(other);
  auto joins = joinAll({gone.get(), &stays});
  worlds(joins);
  gone.reset();
  EXPECT_EQ(stays.awaitEnd().kind, Kind::NodeLost);
  try {
    ElasticRendezvous(o).next();
    FAIL() << "the lost node was taken back";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("node7 was lost"), std::string::npos) << e.what();
  }
}

TEST_F(ElasticRendezvousTest, AStoreRestartedWithoutItsKeysCostsOneRoundAndTheRoundsGoOn) {
  auto a = agents(2, options(2, 2));
  formRound(a);
  const uint16_t port = server_->port();
  server_.reset();  // every connection closes, every key is lost
  server_ = std::make_unique<StoreServerThread>(StoreServerOptions{.listen = {"127.0.0.1", port}});
  for (auto& agent : a) {
    const RoundEnd end = agent->awaitEnd();
    EXPECT_EQ(end.kind, Kind::StoreLost);
    EXPECT_NE(end.describe().find("came back without round 0 (it restarted and lost its keys)"),
              std::string::npos)
        << end.describe();
  }
  for (const World& x : formRound(a)) {
    EXPECT_EQ(x.round, 1);  // the job's rounds go on where they were
    EXPECT_EQ(x.groupWorldSize, 2);
    EXPECT_EQ(x.failures, 0);
  }
  // A node that arrives now finds the job's shape and round again.
  ElasticOptions o = options(2, 3);
  EXPECT_THROW(ElasticRendezvous{o}, ConfigError);  // another --nnodes: the shape is back
}

TEST_F(ElasticRendezvousTest, AStoreSilentPastTheOutageTimeoutEndsTheRoundAsLost) {
  auto a = roundThenSilence();
  const RoundEnd end = a[0]->awaitEnd();
  EXPECT_EQ(end.kind, Kind::StoreLost);
  EXPECT_NE(end.describe().find("(store_outage_timeout)"), std::string::npos) << end.describe();
}

// Back empty after the nodes gave up on it: they meet again and write the job's shape and
// newest round again, so that a node arriving later joins them, not a round 0 of its own.
TEST_F(ElasticRendezvousTest, AStoreBackEmptyAfterTheOutageTimeoutGetsTheJobsKeysAgain) {
  auto a = roundThenSilence();
  for (auto& agent : a) EXPECT_EQ(agent->awaitEnd().kind, Kind::StoreLost);
  const uint16_t port = silent_->local_endpoint().port();
  silent_.reset();
  server_ = std::make_unique<StoreServerThread>(StoreServerOptions{.listen = {"127.0.0.1", port}});
  for (const World& x : formRound(a)) EXPECT_EQ(x.round, 1);
  const elastic::Keys keys("job");
  TcpStore direct({.at = {"127.0.0.1", port}});
  ASSERT_TRUE(direct.check({keys.current(), keys.shape()}));
  EXPECT_EQ(direct.get(keys.current()), "1");
  EXPECT_THROW(ElasticRendezvous{options(2, 3)}, ConfigError);  // another --nnodes
}

// A store that refuses connections for a lease's life is gone: the round ends, and the line says
// what this node does then (it stops its workers and reconnects), not that the job is over.
TEST_F(ElasticRendezvousTest, AStoreGoneForGoodEndsTheRoundAndTheNodeSaysItReconnects) {
  auto a = agents(2, options(2, 2));
  formRound(a);
  server_.reset();  // nothing listens at its port any more
  const RoundEnd end = a[0]->awaitEnd();
  EXPECT_EQ(end.kind, Kind::StoreLost);
  const std::string line = end.describe();
  EXPECT_NE(line.find("is gone (connection refused)"), std::string::npos) << line;
  EXPECT_NE(line.find("reconnects"), std::string::npos) << line;
  EXPECT_EQ(line.find("cannot go on"), std::string::npos) << line;
}

TEST_F(ElasticRendezvousTest, InterruptUnblocksAWaitingJoin) {
  ElasticRendezvous alone(options(2, 2));
  auto join = joinLater(alone);
  alone.interrupt();
  EXPECT_THROW(join.get(), Error);
}

}  // namespace
}  // namespace dlrun::rendezvous
