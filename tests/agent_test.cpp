// The agent's state machine on a scripted rendezvous, with /bin/sh workers: success, a failure
// that restarts, a final failure, a round ended by another node, and a rendezvous that fails
// with any kind of exception. The fake rendezvous counts restarts with the same rule as the
// real ones (RoundEnd::countFailure).
#include "agents/agent.h"

#include <gtest/gtest.h>

#include <signal.h>

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>

#include "common/error.h"

namespace dlrun::agents {
namespace {

using rendezvous::JoinResult;
using rendezvous::RoundEnd;
using Kind = RoundEnd::Kind;

class FakeRendezvous : public rendezvous::Rendezvous {
 public:
  int maxRestarts = 0;
  int nproc = 2;
  std::map<int, RoundEnd> elsewhere;  // ends that another node brings to a round
  std::map<int, RoundEnd> whileJoining;  // the job ended while this node waited to join
  std::function<void(int round)> beforeJoin;  // may throw, as a failing rendezvous does

  JoinResult next() override {
    std::lock_guard lock(mutex_);
    if (beforeJoin) beforeJoin(round_);
    end_.reset();
    if (auto it = whileJoining.find(round_); it != whileJoining.end()) {
      ++round_;
      return it->second;
    }
    rendezvous::World world;
    world.runId = "agent-test";
    world.round = round_++;
    world.localWorldSize = world.worldSize = nproc;
    world.failures = failuresUsed_;
    world.maxRestarts = maxRestarts;
    world.masterAddr = "127.0.0.1";
    world.masterPort = 1;
    if (auto it = elsewhere.find(world.round); it != elsewhere.end()) end_ = it->second;
    return world;
  }

  RoundEnd awaitEnd() override {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return end_ || interrupted_; });
    if (!end_) throw Error("interrupted");
    return *end_;
  }

  void reportFailure(RoundEnd failure) override {
    std::lock_guard lock(mutex_);
    failure.countFailure(failuresUsed_, maxRestarts);
    failuresUsed_ = failure.failures;
    failures.push_back(failure);
    end_ = failure;
    changed_.notify_all();
  }

  void reportSuccess() override {
    std::lock_guard lock(mutex_);
    ++successes;
    end_ = RoundEnd{.kind = Kind::Finished};
    changed_.notify_all();
  }

  RoundEnd reportStop(int signal) override {
    std::lock_guard lock(mutex_);
    stops.push_back(signal);
    return rendezvous::jobStopped(signal, "this-node");
  }

  void interrupt() override {
    std::lock_guard lock(mutex_);
    interrupted_ = true;
    changed_.notify_all();
  }

  int rounds() {
    std::lock_guard lock(mutex_);
    return round_;
  }

  std::vector<RoundEnd> failures;
  std::vector<int> stops;
  int successes = 0;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<RoundEnd> end_;
  bool interrupted_ = false;
  int round_ = 0;
  int failuresUsed_ = 0;
};

int runAgent(FakeRendezvous& rendezvous, const std::string& script) {
  Agent agent(
      {
          .command = {"/bin/sh", "-c", script},
          .nprocPerNode = rendezvous.nproc,
          .stopTimeout = std::chrono::seconds(5),
      },
      rendezvous);
  return agent.run();
}

TEST(AgentTest, WorkersThatSucceedFinishTheJob) {
  FakeRendezvous rendezvous;
  EXPECT_EQ(runAgent(rendezvous, "exit 0"), 0);
  EXPECT_EQ(rendezvous.rounds(), 1);
  EXPECT_EQ(rendezvous.successes, 1);
  EXPECT_TRUE(rendezvous.failures.empty());
}

TEST(AgentTest, AFailureRestartsTheGroupWhileRestartsRemain) {
  FakeRendezvous rendezvous;
  rendezvous.maxRestarts = 1;
  // Local rank 1 fails in the first round only.
  const int code = runAgent(rendezvous,
                            "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && "
                            "[ \"$LOCAL_RANK\" = 1 ] && exit 3; exit 0");
  EXPECT_EQ(code, 0);
  EXPECT_EQ(rendezvous.rounds(), 2);
  ASSERT_EQ(rendezvous.failures.size(), 1u);
  EXPECT_EQ(rendezvous.failures[0].rank, 1);
  EXPECT_EQ(rendezvous.failures[0].exitCode, 3);
  EXPECT_FALSE(rendezvous.failures[0].final);
  EXPECT_EQ(rendezvous.successes, 1);
}

TEST(AgentTest, AFinalFailureExitsWithTheWorkersCode) {
  FakeRendezvous rendezvous;
  rendezvous.maxRestarts = 1;
  EXPECT_EQ(runAgent(rendezvous, "[ \"$LOCAL_RANK\" = 0 ] && exit 5; exec sleep 30"), 5);
  EXPECT_EQ(rendezvous.rounds(), 2);
  ASSERT_EQ(rendezvous.failures.size(), 2u);
  EXPECT_TRUE(rendezvous.failures[1].final);
  EXPECT_NE(rendezvous.failures[1].report.find("exit code 5"), std::string::npos)
      << rendezvous.failures[1].report;
}

TEST(AgentTest, ARoundEndedElsewhereStopsTheWorkersAndJoinsAgainWithoutAFailure) {
  FakeRendezvous rendezvous;
  rendezvous.elsewhere[0] = RoundEnd{.kind = Kind::NodeLost, .node = "other"};
  // Round 0's workers would sleep for ever; the lost node ends that round.
  EXPECT_EQ(runAgent(rendezvous,
                     "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exec sleep 30; exit 0"),
            0);
  EXPECT_EQ(rendezvous.rounds(), 2);
  EXPECT_TRUE(rendezvous.failures.empty());
}

TEST(AgentTest, AJobFinishedElsewhereStopsTheWorkersAndExits0) {
  FakeRendezvous rendezvous;
  rendezvous.elsewhere[0] = RoundEnd{.kind = Kind::Finished};
  EXPECT_EQ(runAgent(rendezvous, "exec sleep 30"), 0);
  EXPECT_EQ(rendezvous.rounds(), 1);
  EXPECT_EQ(rendezvous.successes, 0);
}

TEST(AgentTest, AJobThatEndedWhileJoiningStartsNoWorker) {
  FakeRendezvous rendezvous;
  rendezvous.maxRestarts = 1;
  rendezvous.whileJoining[1] = RoundEnd{
      .kind = Kind::WorkerFailed, .exitCode = 4, .final = true, .report = "dlrun: failed\n"};
  // Round 0 fails (not final); the job fails for good elsewhere before round 1 forms.
  EXPECT_EQ(runAgent(rendezvous, "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exit 3; exit 0"), 4);
  EXPECT_EQ(rendezvous.rounds(), 2);
  EXPECT_EQ(rendezvous.successes, 0);
}

TEST(AgentTest, ASignalToTheAgentIsReportedAndStopsTheJob) {
  FakeRendezvous rendezvous;
  // A worker sends SIGINT to its parent, the agent (this test process), as Ctrl-C would.
  EXPECT_EQ(runAgent(rendezvous, "[ \"$LOCAL_RANK\" = 0 ] && kill -INT $PPID; exec sleep 30"),
            128 + SIGINT);
  EXPECT_EQ(rendezvous.stops, std::vector<int>{SIGINT});
  EXPECT_TRUE(rendezvous.failures.empty());
  EXPECT_EQ(rendezvous.rounds(), 1);
}

TEST(AgentTest, AJobStoppedElsewhereExitsWithTheStoppersCode) {
  FakeRendezvous rendezvous;
  rendezvous.elsewhere[0] = rendezvous::jobStopped(SIGTERM, "other");
  EXPECT_EQ(runAgent(rendezvous, "exec sleep 30"), 128 + SIGTERM);
  EXPECT_TRUE(rendezvous.stops.empty());
  EXPECT_EQ(rendezvous.rounds(), 1);
}

TEST(AgentTest, ABadConfigurationInTheRendezvousExits2) {
  FakeRendezvous rendezvous;
  rendezvous.beforeJoin = [](int) -> void { throw ConfigError("shape conflict"); };
  EXPECT_EQ(runAgent(rendezvous, "exit 0"), 2);
}

TEST(AgentTest, AnyOtherExceptionInTheRendezvousExits1) {
  FakeRendezvous rendezvous;
  rendezvous.beforeJoin = [](int) -> void { throw std::runtime_error("not a dlrun::Error"); };
  EXPECT_EQ(runAgent(rendezvous, "exit 0"), 1);
  FakeRendezvous other;
  other.beforeJoin = [](int) -> void { throw 42; };
  EXPECT_EQ(runAgent(other, "exit 0"), 1);
}

TEST(AgentTest, ARendezvousFailureBetweenRoundsExits1) {
  FakeRendezvous rendezvous;
  rendezvous.maxRestarts = 1;
  rendezvous.beforeJoin = [](int round) {
    if (round == 1) throw NetworkError("the store is gone");
  };
  EXPECT_EQ(runAgent(rendezvous, "[ \"$LOCAL_RANK\" = 1 ] && exit 3; exec sleep 30"), 1);
  EXPECT_EQ(rendezvous.rounds(), 1);
}

}  // namespace
}  // namespace dlrun::agents
