// The control plane's records in the store (control/state/control_state.h): they read back as
// written, and text another program wrote is a ProtocolError, never a crash.
#include "control/state/control_state.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::control {
namespace {

TEST(ControlState, KeysLiveUnderTheJobsRoot) {
  const Keys keys("job7");
  EXPECT_EQ(keys.node(2), "dlrun/job7/ctl/node/2");  // by agent: one host may run several
  EXPECT_EQ(keys.nodeAt(2), "dlrun/job7/ctl/nodes/2");
  EXPECT_EQ(keys.event(12), "dlrun/job7/ctl/ev/12");
  EXPECT_EQ(keys.signal(3), "dlrun/job7/ctl/signal/3");
  EXPECT_EQ(Keys::jobs(), "dlrun/jobs");
}

TEST(ControlState, RecordsRoundTrip) {
  const ControlMeta meta{
      .backend = "c10d", .minNodes = 2, .maxNodes = 3, .maxRestarts = 1, .tokenHash = "ab12"};
  const ControlMeta m = decodeMeta(encode(meta));
  EXPECT_EQ(m.backend, "c10d");
  EXPECT_EQ(m.maxNodes, 3);
  EXPECT_EQ(m.tokenHash, "ab12");

  NodeState node{.name = "n1",
                 .address = "10.0.0.2",
                 .groupRank = 1,
                 .state = "running",
                 .round = 2,
                 .logDir = "/logs",
                 .updated = 1.5,
                 .firstRound = 1};
  node.workers.push_back({.rank = 2,
                          .localRank = 0,
                          .pid = 99,
                          .state = "failed",
                          .exit = "exit code 3",
                          .step = 40,
                          .progressTime = 1.25});
  const NodeState n = decodeNodeState(encode(node));
  EXPECT_EQ(n.name, "n1");
  EXPECT_EQ(n.groupRank, 1);
  EXPECT_EQ(n.firstRound, 1);
  ASSERT_EQ(n.workers.size(), 1u);
  EXPECT_EQ(n.workers[0].pid, 99);
  EXPECT_EQ(n.workers[0].exit, "exit code 3");
  EXPECT_EQ(n.workers[0].step, 40);
  EXPECT_FALSE(n.sittingOut);  // nor in the records of agents that never wrote one

  const NodeState out = decodeNodeState(
      encode(NodeState{.name = "n2",
                       .state = kSittingOut,
                       .sittingOut = SittingOut{.cause = kHealthCheck, .reason = "no GPUs"}}));
  EXPECT_EQ(out.state, "sitting_out");
  ASSERT_TRUE(out.sittingOut);
  EXPECT_EQ(out.sittingOut->cause, "health_check");
  EXPECT_EQ(out.sittingOut->reason, "no GPUs");

  const JobEvent e = decodeEvent(encode(JobEvent{.seq = 5,
                                                 .time = 2.5,
                                                 .kind = "restart",
                                                 .node = "n0",
                                                 .round = 1,
                                                 .detail = "x",
                                                 .agent = 3}));
  EXPECT_EQ(e.seq, 5);
  EXPECT_EQ(e.kind, "restart");
  EXPECT_EQ(e.rank, -1);
  EXPECT_EQ(e.agent, 3);
}

TEST(ControlState, MalformedRecordsAreProtocolErrors) {
  EXPECT_THROW(decodeMeta("{}"), ProtocolError);
  EXPECT_THROW(decodeNodeState("[1]"), ProtocolError);
  EXPECT_THROW(decodeNodeState(R"({"name":"n","addr":"a","group":0,"state":"s","round":0,
               "logs":"","updated":0,"first":0,"workers":[7]})"),
               ProtocolError);
  EXPECT_THROW(decodeNodeState(R"({"name":"n","addr":"a","group":0,"state":"s","round":0,
               "logs":"","updated":0,"first":0,"workers":[],"out":"x"})"),
               ProtocolError);
  EXPECT_THROW(decodeEvent("not json"), ProtocolError);
}

TEST(ControlState, AppendedListsReadOnceEach) {
  EXPECT_EQ(lines("a\nb\na\n\nc"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(lines("").empty());
}

}  // namespace
}  // namespace dlrun::control
