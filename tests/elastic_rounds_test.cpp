// The round protocol on the in-memory store in virtual time: every agent is an
// ElasticRendezvous on a MemoryStore connection, each driven from a thread that takes part in
// the simulation, so lease lapses, last calls and timeouts happen at exact virtual instants
// with no sleep and no dependence on how fast the machine is (memory_store_server.h).
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <functional>
#include <future>
#include <set>

#include "common/error.h"
#include "common/text.h"
#include "rendezvous/elastic_rendezvous.h"
#include "store/memory_store.h"

namespace dlrun::rendezvous {
namespace {

using namespace std::chrono_literals;
using Kind = RoundEnd::Kind;

// What goes wrong on a FaultyStore's connections, shared by every connection of one agent.
struct Faults {
  std::atomic<int> unanswered{0};          // the next waits and reads fail, as with a store away
  std::atomic<bool> loseDoneReply{false};  // the next ADD to a round's done applies, unanswered
};

// A connection to the test's server that fails as a test says (Faults).
class FaultyStore : public MemoryStore {
 public:
  FaultyStore(std::shared_ptr<MemoryStoreServer> server, std::shared_ptr<Faults> faults)
      : MemoryStore(std::move(server)), faults_(std::move(faults)) {}
  int64_t add(const std::string& key, int64_t delta) override {
    const int64_t value = MemoryStore::add(key, delta);
    if (key.ends_with("/done") && faults_->loseDoneReply.exchange(false))
      throw NetworkError("the store's reply was lost");
    return value;
  }
  bool waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    away();
    return MemoryStore::waitFor(keys, timeout);
  }
  std::vector<std::string> peek(const std::vector<std::string>& keys) override {
    away();
    return MemoryStore::peek(keys);
  }

 private:
  void away() {
    for (int left = faults_->unanswered; left > 0;)
      if (faults_->unanswered.compare_exchange_weak(left, left - 1))
        throw NetworkError("the store does not answer");
  }
  std::shared_ptr<Faults> faults_;
};

class ElasticRoundsTest : public ::testing::Test {
 protected:
  ElasticOptions options(int minNodes, int maxNodes) {
    ElasticOptions o;
    o.runId = "job";
    o.minNodes = minNodes;
    o.maxNodes = maxNodes;
    o.restarts.maxRestarts = 1;
    o.self.addr = "127.0.0.1";
    o.self.nproc = 2;
    o.lastCall = 5s;
    o.joinTimeout = 10min;
    o.heartbeat = 1s;
    o.leaseTtl = 3s;
    o.store = StoreOpener{.name = "the memory store", .open = [server = server_] {
                            return std::make_unique<MemoryStore>(server);
                          }};
    return o;
  }

  // `o` on FaultyStore connections that fail as `faults` says.
  ElasticOptions faulty(ElasticOptions o, std::shared_ptr<Faults> faults) {
    o.store = StoreOpener{.name = "the memory store", .open = [server = server_, faults] {
                            return std::make_unique<FaultyStore>(server, faults);
                          }};
    return o;
  }

  std::unique_ptr<ElasticRendezvous> agent(ElasticOptions o, const std::string& name) {
    o.self.name = name;
    return std::make_unique<ElasticRendezvous>(std::move(o));
  }

  // Runs every body on a thread of its own, all counted in before any starts: otherwise the
  // first could wait alone and move time on before the others arrive.
  template <typename T>
  std::vector<std::future<T>> together(std::vector<std::function<T()>> bodies) {
    server_->addParticipants(static_cast<int>(bodies.size()));
    std::vector<std::future<T>> out;
    for (auto& body : bodies) {
      out.push_back(std::async(std::launch::async, [server = server_, body = std::move(body)] {
        struct Leave {
          MemoryStoreServer& server;
          ~Leave() { server.removeParticipant(); }
        } leave{*server};
        return body();
      }));
    }
    return out;
  }

  // Every agent joins at once; returns their worlds.
  std::vector<World> formRound(const std::vector<ElasticRendezvous*>& agents) {
    std::vector<std::function<JoinResult()>> joins;
    for (auto* a : agents) joins.push_back([a] { return a->next(); });
    std::vector<World> out;
    for (auto& join : together(std::move(joins))) out.push_back(std::get<World>(join.get()));
    return out;
  }

  Clock::duration elapsedSince(Clock::time_point start) { return server_->now() - start; }

  std::shared_ptr<MemoryStoreServer> server_ =
      std::make_shared<MemoryStoreServer>(MemoryStoreServer::Time::Virtual);
};

TEST_F(ElasticRoundsTest, ASilentNodesLeaseLapsesAndTheOthersGoOnWithoutIt) {
  const ElasticOptions o = options(2, 3);
  auto a = agent(o, "n0"), b = agent(o, "n1"), c = agent(o, "n2");
  for (const World& w : formRound({a.get(), b.get(), c.get()})) EXPECT_EQ(w.groupWorldSize, 3);
  const auto start = server_->now();

  // n2 goes silent: still connected, but no thread makes a request on its connection.
  auto ends = together<RoundEnd>({[&] { return a->awaitEnd(); }, [&] { return b->awaitEnd(); }});
  for (auto& end : ends) {
    const RoundEnd e = end.get();
    EXPECT_EQ(e.kind, Kind::NodeLost) << e.describe();
    EXPECT_EQ(e.node, "n2 (127.0.0.1)");
  }
  // n2's last request was when the round formed: its lease lapsed exactly one TTL later.
  EXPECT_EQ(elapsedSince(start), o.leaseTtl);
  EXPECT_TRUE(MemoryStore(server_).check({elastic::Keys("job").lost("n2")}));

  for (const World& w : formRound({a.get(), b.get()})) {
    EXPECT_EQ(w.round, 1);
    EXPECT_EQ(w.groupWorldSize, 2);
    EXPECT_EQ(w.worldSize, 4);
    EXPECT_EQ(w.failures, 0);  // a membership change is not a failure
  }
  EXPECT_EQ(elapsedSince(start), o.leaseTtl);  // the survivors were all it expected: no last call
}

TEST_F(ElasticRoundsTest, TheLastCallClosesARoundBelowItsMaximum) {
  const ElasticOptions o = options(2, 4);
  auto a = agent(o, "n0"), b = agent(o, "n1"), c = agent(o, "n2");
  const auto start = server_->now();
  const std::vector<World> worlds = formRound({a.get(), b.get(), c.get()});
  std::set<int> groupRanks;
  for (const World& w : worlds) {
    EXPECT_EQ(w.round, 0);
    EXPECT_EQ(w.groupWorldSize, 3);
    EXPECT_EQ(w.worldSize, 6);
    groupRanks.insert(w.groupRank);
  }
  EXPECT_EQ(groupRanks, (std::set<int>{0, 1, 2}));
  // A fourth node might still have come until the last call; not a moment longer.
  EXPECT_EQ(elapsedSince(start), o.lastCall);
}

TEST_F(ElasticRoundsTest, ASpareTakesAKilledNodesPlace) {
  const ElasticOptions o = options(1, 2);
  auto a = agent(o, "n0"), b = agent(o, "n1"), spare = agent(o, "n2");
  formRound({a.get(), b.get()});
  const auto start = server_->now();

  auto runs = together<JoinResult>({
      [&] {
        EXPECT_EQ(a->awaitEnd().kind, Kind::NodeLost);
        return a->next();
      },
      [&] { return spare->next(); },
      [&]() -> JoinResult {
        // n1 is killed once the spare waits for a place: the job runs at its maximum.
        EXPECT_TRUE(MemoryStore(server_).waitFor({elastic::Keys("job").spares(0)}, 1h));
        b->interrupt();  // its connection drops, as a killed agent's does
        return RoundEnd{};
      },
  });
  const World survivor = std::get<World>(runs[0].get());
  const World replacement = std::get<World>(runs[1].get());
  runs[2].get();

  EXPECT_EQ(survivor.round, 1);
  EXPECT_EQ(replacement.round, 1);
  // The survivor keeps its place first (it has a last group rank, the spare has none).
  EXPECT_EQ(survivor.groupRank, 0);
  EXPECT_EQ(survivor.baseRank, 0);
  EXPECT_EQ(replacement.groupRank, 1);
  EXPECT_EQ(replacement.baseRank, 2);
  for (const World& w : {survivor, replacement}) {
    EXPECT_EQ(w.groupWorldSize, 2);
    EXPECT_EQ(w.worldSize, 4);
  }
  // The kill ended the round at once and the two filled the next one: no time passed.
  EXPECT_EQ(elapsedSince(start), 0s);
}

// Two nodes of a --nnodes=2 job with restarts to spare, whose rounds fail one after another,
// and a view of the store.
class TwoNodesFailing : public ElasticRoundsTest {
 protected:
  TwoNodesFailing() {
    ElasticOptions o = options(2, 2);
    o.restarts.maxRestarts = 10;
    a = agent(o, "n0");
    b = agent(o, "n1");
  }

  void formRound(int round) {
    for (const World& w : ElasticRoundsTest::formRound({a.get(), b.get()}))
      EXPECT_EQ(w.round, round);
  }
  void fail() {
    a->reportFailure(RoundEnd{.kind = Kind::WorkerFailed, .node = "n0", .rank = 0, .exitCode = 1});
  }
  void awaitEnds() {
    auto ends = together<RoundEnd>({[&] { return a->awaitEnd(); }, [&] { return b->awaitEnd(); }});
    for (auto& end : ends) EXPECT_EQ(end.get().kind, Kind::WorkerFailed);
  }

  std::unique_ptr<ElasticRendezvous> a, b;
  const elastic::Keys keys{"job"};
  MemoryStore view{server_};
};

TEST_F(TwoNodesFailing, ALongJobKeepsTheKeysOfItsLastTwoRoundsOnly) {
  int64_t keysAtRound2 = 0;
  std::vector<std::vector<std::string>> members;  // each round's member ids, in arrival order
  for (int round = 0; round <= 5; ++round) {
    formRound(round);
    members.push_back(split(view.peek({keys.members(round)})[0], '\n'));
    members.back().pop_back();  // the list ends with a newline
    ASSERT_EQ(members.back().size(), 2u);
    fail();
    awaitEnds();
    if (round == 2) keysAtRound2 = view.numKeys();
  }
  for (int round = 0; round <= 3; ++round) {
    for (const auto& key : keys.ofRound(round, 2, members[round]))
      EXPECT_FALSE(view.check({key})) << key;
  }
  for (int round = 4; round <= 5; ++round) {
    EXPECT_TRUE(view.check(
        {keys.closed(round), keys.end(round), keys.assignment(round, members[round][1])}));
  }
  EXPECT_EQ(view.numKeys(), keysAtRound2);  // bounded, however many rounds the job runs
}

// Rounds that ended before anyone waited in them (they failed as they formed) leave their keys
// to a later closer, which deletes them key by key before it waits for its own round's end: it
// takes two at most, so that wait comes no later than a round's tidy-up (the rest go two a round).
TEST_F(TwoNodesFailing, ACloserForgetsABacklogOfRoundsTwoAtATime) {
  for (int round = 0; round <= 6; ++round) {
    formRound(round);
    fail();  // before any awaitEnd: no closer tidied up
  }
  awaitEnds();
  EXPECT_EQ(view.peek({keys.forgotten()})[0], "1");
  EXPECT_FALSE(view.check({keys.closed(1)}));
  for (int round = 2; round <= 6; ++round) EXPECT_TRUE(view.check({keys.closed(round)})) << round;
}

TEST_F(ElasticRoundsTest, AJoinAloneTimesOutAfterTheJoinTimeout) {
  const ElasticOptions o = options(2, 2);
  auto alone = agent(o, "n0");
  const auto start = server_->now();
  auto join = together<std::string>({[&]() -> std::string {
    try {
      alone->next();
      return "joined alone";
    } catch (const TimeoutError& e) {
      return e.what();
    }
  }});
  EXPECT_NE(join[0].get().find("1 of at least 2"), std::string::npos);
  EXPECT_EQ(elapsedSince(start), o.joinTimeout);  // ten minutes, in microseconds
}

TEST_F(ElasticRoundsTest, AStopReachesEveryMemberAndEveryLaterJoin) {
  const ElasticOptions o = options(3, 3);
  auto a = agent(o, "n0"), b = agent(o, "n1"), c = agent(o, "n2");
  formRound({a.get(), b.get(), c.get()});
  const RoundEnd stop = a->reportStop(SIGINT);
  EXPECT_EQ(stop.kind, Kind::Stopped);
  EXPECT_EQ(stop.exitCode, 128 + SIGINT);
  EXPECT_EQ(stop.report, "job stopped: SIGINT on node n0");
  // A second stop (scancel signals every node) does not replace the first.
  EXPECT_EQ(b->reportStop(SIGTERM).report, stop.report);
  auto ends = together<RoundEnd>({[&] { return b->awaitEnd(); }, [&] { return c->awaitEnd(); }});
  for (auto& end : ends) {
    const RoundEnd e = end.get();
    EXPECT_EQ(e.kind, Kind::Stopped);
    EXPECT_EQ(e.exitCode, 128 + SIGINT);
    EXPECT_EQ(e.report, stop.report);
  }
  auto again = together<JoinResult>({[&] { return c->next(); }});
  EXPECT_EQ(std::get<RoundEnd>(again[0].get()).report, stop.report);
}

TEST_F(ElasticRoundsTest, AStopWakesNodesWaitingForARoundToClose) {
  const ElasticOptions o = options(3, 3);
  auto a = agent(o, "n0"), b = agent(o, "n1"), stopper = agent(o, "n2");
  const auto start = server_->now();
  auto runs = together<JoinResult>({
      [&] { return a->next(); },
      [&] { return b->next(); },
      [&]() -> JoinResult {
        // Stopped before it joined, once the two others wait for a third.
        EXPECT_TRUE(MemoryStore(server_).waitFor({elastic::Keys("job").node(0, 2)}, 1h));
        return stopper->reportStop(SIGTERM);
      },
  });
  for (auto& run : runs) {
    const RoundEnd e = std::get<RoundEnd>(run.get());
    EXPECT_EQ(e.kind, Kind::Stopped);
    EXPECT_EQ(e.report, "job stopped: SIGTERM on node n2");
  }
  EXPECT_LT(elapsedSince(start), o.joinTimeout);
}

TEST_F(ElasticRoundsTest, UnderStopPolicyNodeAStoppedNodeLeavesWithoutAFailure) {
  ElasticOptions o = options(2, 3);
  o.stopOnlyNode = true;
  auto a = agent(o, "n0"), b = agent(o, "n1"), c = agent(o, "n2");
  formRound({a.get(), b.get(), c.get()});
  const auto start = server_->now();
  EXPECT_EQ(c->reportStop(SIGINT).kind, Kind::NodeLeft);
  auto ends = together<RoundEnd>({[&] { return a->awaitEnd(); }, [&] { return b->awaitEnd(); }});
  for (auto& end : ends) {
    const RoundEnd e = end.get();
    EXPECT_EQ(e.kind, Kind::NodeLeft);
    EXPECT_EQ(e.node, "n2 (127.0.0.1)");
  }
  for (const World& w : formRound({a.get(), b.get()})) {
    EXPECT_EQ(w.groupWorldSize, 2);
    EXPECT_EQ(w.failures, 0);
  }
  EXPECT_EQ(elapsedSince(start), 0s);  // the two were all it expected: no last call
}

TEST_F(ElasticRoundsTest, UnderStopPolicyNodeAStopAtTheMinimumStopsTheJob) {
  ElasticOptions o = options(2, 3);
  o.stopOnlyNode = true;
  auto a = agent(o, "n0"), b = agent(o, "n1");
  formRound({a.get(), b.get()});
  EXPECT_EQ(b->reportStop(SIGINT).kind, Kind::Stopped);
  auto ends = together<RoundEnd>({[&] { return a->awaitEnd(); }});
  EXPECT_EQ(ends[0].get().kind, Kind::Stopped);
}

TEST_F(ElasticRoundsTest, TheJoinTimeoutNamesTheNodesThatDidNotComeBack) {
  const ElasticOptions o = options(3, 3);
  auto a = agent(o, "n0"), b = agent(o, "n1"), c = agent(o, "n2");
  formRound({a.get(), b.get(), c.get()});
  c->interrupt();  // killed: its connection drops
  auto runs = together<std::string>({
      [&]() -> std::string {
        EXPECT_EQ(a->awaitEnd().kind, Kind::NodeLost);
        try {
          a->next();
          return "joined";
        } catch (const TimeoutError& e) {
          return e.what();
        }
      },
      [&]() -> std::string {
        EXPECT_EQ(b->awaitEnd().kind, Kind::NodeLost);
        try {
          b->next();
          return "joined";
        } catch (const TimeoutError& e) {
          return e.what();
        }
      },
  });
  for (auto& run : runs) {
    const std::string message = run.get();
    EXPECT_NE(message.find("2 of at least 3 nodes joined; nodes that did not come back: "
                           "n2 (127.0.0.1)"),
              std::string::npos)
        << message;
  }
}

// A success report whose reply was lost is made again: it counts once, so the round finishes
// when the last member's workers do, not while they still run.
TEST_F(ElasticRoundsTest, ASuccessReportMadeAgainAfterItsReplyWasLostCountsOnce) {
  const ElasticOptions o = options(3, 3);
  auto faults = std::make_shared<Faults>();
  auto a = agent(faulty(o, faults), "n0"), b = agent(o, "n1"), c = agent(o, "n2");
  formRound({a.get(), b.get(), c.get()});
  const auto start = server_->now();
  faults->loseDoneReply = true;
  a->reportSuccess();  // applied by the store, its reply lost: kept and made again
  b->reportSuccess();
  auto ends = together<RoundEnd>({
      [&] { return a->awaitEnd(); },
      [&] { return b->awaitEnd(); },
      [&] { return c->awaitEnd(); },
      [&] {
        // n2's workers run for a minute more.
        EXPECT_FALSE(MemoryStore(server_).waitFor({"n2's workers end"}, 1min));
        c->reportSuccess();
        return RoundEnd{};
      },
  });
  ends.back().get();
  ends.pop_back();
  for (auto& end : ends) {
    const RoundEnd e = end.get();
    EXPECT_EQ(e.kind, Kind::Finished);
    EXPECT_EQ(e.node, "n2");  // the last to finish ends the round
  }
  EXPECT_EQ(elapsedSince(start), 1min);
}

// A spare waits as long as the job runs, past its join timeout; a store outage then is ridden
// out, counted from the store's last answer, and the spare still learns how the job ended.
TEST_F(ElasticRoundsTest, ASparePastItsJoinTimeoutRidesOutAStoreOutage) {
  const ElasticOptions o = options(1, 2);
  auto faults = std::make_shared<Faults>();
  auto a = agent(o, "n0"), b = agent(o, "n1"), spare = agent(faulty(o, faults), "n2");
  formRound({a.get(), b.get()});
  auto runs = together<std::string>({
      [&] { return a->awaitEnd().describe(); },
      [&] { return b->awaitEnd().describe(); },
      [&]() -> std::string {
        try {
          const JoinResult result = spare->next();
          const auto* end = std::get_if<RoundEnd>(&result);
          return end ? end->describe() : "a place";
        } catch (const Error& e) {
          return e.what();
        }
      },
      [&]() -> std::string {
        MemoryStore view(server_);
        EXPECT_TRUE(view.waitFor({elastic::Keys("job").spares(0)}, 1h));
        EXPECT_FALSE(view.waitFor({"the spare's join timeout"}, o.joinTimeout + 1min));
        faults->unanswered = 3;  // the store stops answering the spare for three calls
        a->reportSuccess();
        b->reportSuccess();
        return "every worker finished";
      },
  });
  for (auto& run : runs) EXPECT_EQ(run.get(), "every worker finished");
}

// A store stalled past the lease TTL lapses every node's lease, and marks each node lost. Where
// lost nodes are not taken back (Slurm), the nodes, alive all along, still meet again: only a
// node that died is refused
// (ElasticRendezvousTest.ALostNodeIsRefusedWhereLostNodesAreNotTakenBack).
TEST_F(ElasticRoundsTest, AStallPastTheLeaseTtlRefusesNoLiveNodeWhereLostNodesAreNotTakenBack) {
  ElasticOptions o = options(2, 2);
  o.refuseLostNodes = true;
  auto a = agent(o, "n0"), b = agent(o, "n1");
  formRound({a.get(), b.get()});
  // Nobody's request is answered for two leases' lives, as through a stall of the store.
  auto stall = together<bool>(
      {[&] { return MemoryStore(server_).waitFor({"the stall's end"}, 2 * o.leaseTtl); }});
  EXPECT_FALSE(stall[0].get());
  const elastic::Keys keys("job");
  EXPECT_TRUE(MemoryStore(server_).check({keys.lost("n0"), keys.lost("n1")}));
  auto ends = together<RoundEnd>({[&] { return a->awaitEnd(); }, [&] { return b->awaitEnd(); }});
  for (auto& end : ends) EXPECT_EQ(end.get().kind, Kind::NodeLost);
  for (const World& w : formRound({a.get(), b.get()})) EXPECT_EQ(w.round, 1);
}

}  // namespace
}  // namespace dlrun::rendezvous
