// A job's state from its rendezvous keys (control/job_state.h): every state the Control
// service reports, from the keys as the rounds leave them.
#include "control/job_state.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "rendezvous/elastic_protocol.h"

namespace dlrun::control {
namespace {

using rendezvous::RoundEnd;
using rendezvous::elastic::encode;

std::string failed(int failures, bool final, std::string report = "rank 1 failed") {
  return encode(RoundEnd{.kind = RoundEnd::Kind::WorkerFailed,
                         .node = "n1",
                         .rank = 1,
                         .exitCode = 3,
                         .failures = failures,
                         .final = final,
                         .report = std::move(report)});
}

std::string assignment(int failures) {
  return encode(rendezvous::elastic::Assignment{.failures = failures});
}

TEST(JobState, NoRoundYetIsForming) {
  const JobStatus s = jobStatus({});
  EXPECT_EQ(s.state, v1::FORMING);
  EXPECT_EQ(s.round, 0);
  EXPECT_FALSE(s.end);
  EXPECT_EQ(jobStatus({.current = "0"}).state, v1::FORMING);
}

TEST(JobState, AnAbortedFirstRoundIsStillForming) {
  EXPECT_EQ(jobStatus({.current = "1",
                       .previousClosed = "abort",
                       .previousEnd = encode(RoundEnd{.kind = RoundEnd::Kind::NodeLost})})
                .state,
            v1::FORMING);
}

TEST(JobState, AClosedRoundWithoutAnEndIsRunning) {
  const JobStatus s = jobStatus({.current = "2", .closed = "3", .assignment = assignment(1)});
  EXPECT_EQ(s.state, v1::RUNNING);
  EXPECT_EQ(s.round, 2);
  EXPECT_EQ(s.restartsUsed, 1);
}

TEST(JobState, ARecoverableEndIsRestartingUntilTheNextRoundCloses) {
  // The newest round ended, and no agent advanced `current` yet.
  const JobStatus ended = jobStatus({.current = "0", .closed = "2", .end = failed(1, false)});
  EXPECT_EQ(ended.state, v1::RESTARTING);
  EXPECT_EQ(ended.restartsUsed, 1);
  EXPECT_FALSE(ended.end);
  // The next round forms after one that ran.
  const JobStatus forming =
      jobStatus({.current = "1", .previousClosed = "2", .previousEnd = failed(1, false)});
  EXPECT_EQ(forming.state, v1::RESTARTING);
  EXPECT_EQ(forming.restartsUsed, 1);
  // A membership change counts no restart.
  const auto lost = encode(RoundEnd{.kind = RoundEnd::Kind::NodeLost, .node = "n2"});
  const JobStatus changed =
      jobStatus({.current = "4", .closed = "2", .end = lost, .assignment = assignment(2)});
  EXPECT_EQ(changed.state, v1::RESTARTING);
  EXPECT_EQ(changed.restartsUsed, 2);
  // An aborted round after old rounds were forgotten is a restart, not a first formation.
  EXPECT_EQ(
      jobStatus({.current = "7", .closed = "abort", .previousClosed = "abort", .forgotten = "4"})
          .state,
      v1::RESTARTING);
}

TEST(JobState, FinishedIsSucceeded) {
  const JobStatus s = jobStatus(
      {.current = "1", .closed = "2", .end = encode(RoundEnd{.kind = RoundEnd::Kind::Finished})});
  EXPECT_EQ(s.state, v1::SUCCEEDED);
  ASSERT_TRUE(s.end);
}

TEST(JobState, AFinalFailureIsFailedWithItsReport) {
  const JobStatus s = jobStatus(
      {.current = "3", .closed = "2", .end = failed(3, true, "rank 1 on n1 failed: exit code 3")});
  EXPECT_EQ(s.state, v1::FAILED);
  ASSERT_TRUE(s.end);
  EXPECT_EQ(s.end->report, "rank 1 on n1 failed: exit code 3");
  EXPECT_EQ(s.restartsUsed, 3);
}

TEST(JobState, AStopIsStoppedWhetherOrNotTheRoundsEndShowsItYet) {
  const auto stop = encode(rendezvous::jobStopped(15, "n1"));
  EXPECT_EQ(jobStatus({.stop = stop, .current = "0", .closed = "stop", .end = stop}).state,
            v1::STOPPED);
  const JobStatus written = jobStatus({.stop = stop, .current = "1", .closed = "2"});
  EXPECT_EQ(written.state, v1::STOPPED);
  ASSERT_TRUE(written.end);
  EXPECT_EQ(written.end->exitCode, 143);
}

TEST(JobState, AnEndThatAgentsActedOnWinsOverALaterStop) {
  // A stop written after the last round finished: agents exited 0, so the job succeeded.
  const auto stop = encode(rendezvous::jobStopped(15, "n1"));
  EXPECT_EQ(jobStatus({.stop = stop,
                       .current = "0",
                       .closed = "1",
                       .end = encode(RoundEnd{.kind = RoundEnd::Kind::Finished})})
                .state,
            v1::SUCCEEDED);
}

TEST(JobState, MalformedValuesAreProtocolErrors) {
  EXPECT_THROW(jobStatus({.current = "x"}), ProtocolError);
  EXPECT_THROW(jobStatus({.current = "0", .closed = "1", .end = "{"}), ProtocolError);
}

AgentRecord agent(int64_t id, const std::string& host, int firstRound, int round) {
  return {.id = id,
          .name = host,
          .state = control::NodeState{.name = host, .round = round, .firstRound = firstRound}};
}

// Agents that share a host side by side are each their own node, through restarts too.
TEST(JobState, AgentsSideBySideOnAHostReplaceNone) {
  EXPECT_EQ(replacedBy({agent(1, "h", 0, 0), agent(2, "h", 0, 0)}), (std::vector<int64_t>{0, 0}));
  // A restart that one of them published first.
  EXPECT_EQ(replacedBy({agent(1, "h", 0, 0), agent(2, "h", 0, 1)}), (std::vector<int64_t>{0, 0}));
}

// A new agent on a host after a loss joins a round the lost one never saw: it takes its place,
// on that host only; an agent without a record yet replaces nothing and is replaced by nothing.
TEST(JobState, AnAgentThatCameBackReplacesTheLostOneOnItsHost) {
  const std::vector<AgentRecord> agents{agent(1, "a", 0, 0),
                                        agent(2, "b", 0, 0),
                                        {.id = 3, .name = "a"},
                                        agent(4, "a", 1, 2),
                                        agent(5, "a", 3, 3)};
  EXPECT_EQ(replacedBy(agents), (std::vector<int64_t>{4, 0, 0, 5, 0}));
  EXPECT_EQ(replacedBy({agent(1, "a", 0, 0), agent(2, "b", 1, 1)}), (std::vector<int64_t>{0, 0}));
}

}  // namespace
}  // namespace dlrun::control
