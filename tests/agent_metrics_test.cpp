// AgentView: what an agent's --metrics-port shows, from the changes the agent reports.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "agents/agent_metrics.h"

namespace dlrun::agents {
namespace {

using Kind = rendezvous::RoundEnd::Kind;

rendezvous::World world(int round, int nodes, int workers) {
  rendezvous::World w{
      .runId = "job", .round = round, .groupWorldSize = nodes, .worldSize = workers};
  for (int rank = 0; rank < workers; ++rank)
    w.workerEndpoints.push_back("10.0.0." + std::to_string(rank / 2 + 1) + ":100" +
                                std::to_string(rank));
  return w;
}

bool has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(AgentView, RoundsRestartsWorkersAndRecovery) {
  AgentView view("node-a");
  const auto t0 = Clock::now();
  view.roundStarted(world(0, 2, 4), 2, t0);
  view.workerExited(137);
  view.roundEnded({.kind = Kind::NodeLost, .node = "b"}, t0 + std::chrono::seconds(1));
  view.restarting({.kind = Kind::NodeLost});
  view.workerExited(143);
  view.roundStarted(world(1, 1, 2), 2, t0 + std::chrono::milliseconds(1040));
  view.restarting({.kind = Kind::WorkerFailed, .hang = true});
  const std::string text = view.metricsText(std::nullopt);
  EXPECT_TRUE(has(text, "dlrun_rendezvous_rounds_total 2")) << text;
  EXPECT_TRUE(has(text, "dlrun_rendezvous_restarts_total{cause=\"node_lost\"} 1")) << text;
  EXPECT_TRUE(has(text, "dlrun_rendezvous_restarts_total{cause=\"hang\"} 1")) << text;
  EXPECT_TRUE(has(text, "dlrun_rendezvous_restarts_total{cause=\"failure\"} 0")) << text;
  EXPECT_TRUE(has(text, "dlrun_worker_exits_total{code=\"137\"} 1")) << text;
  EXPECT_TRUE(has(text, "dlrun_workers_up 2")) << text;
  EXPECT_TRUE(has(text, "dlrun_rendezvous_node_loss_recovery_seconds_bucket{le=\"0.025\"} 0"));
  EXPECT_TRUE(has(text, "dlrun_rendezvous_node_loss_recovery_seconds_bucket{le=\"0.05\"} 1"));
  EXPECT_TRUE(has(text, "dlrun_rendezvous_node_loss_recovery_seconds_count 1"));
  EXPECT_EQ(text.find("dlrun_progress_"), std::string::npos);  // nothing reported
  EXPECT_EQ(text.find("dlrun_store_"), std::string::npos);     // no store served
}

TEST(AgentView, ProgressMakesCurvePointsAndRates) {
  AgentView view("node-a");
  view.roundStarted(world(0, 1, 2), 2, Clock::now());
  ProgressReading a{.beats = 1, .step = 1, .results = kReportedLoss, .loss = 2.0, .samples = 10};
  ProgressReading b = a;
  view.progress({a, b}, 100.0);
  a.step = b.step = 5;
  a.loss = 1.0;
  a.samples = b.samples = 60;
  view.progress({a, b}, 100.5);
  view.progress({a, b}, 101.0);  // no new step: no point
  ASSERT_EQ(view.curve().size(), 2u);
  EXPECT_EQ(view.curve()[1].step, 5);
  EXPECT_EQ(*view.curve()[1].loss, 1.0);
  EXPECT_FALSE(view.curve()[1].accuracy);
  EXPECT_DOUBLE_EQ(view.curve()[1].samplesPerSecond, 200.0);  // (120 - 20) / 0.5 s
  const std::string text = view.metricsText(std::nullopt);
  EXPECT_TRUE(has(text, "dlrun_progress_step 5")) << text;
  EXPECT_TRUE(has(text, "dlrun_progress_loss 1")) << text;
  EXPECT_TRUE(has(text, "dlrun_progress_samples_total 100")) << text;
  EXPECT_EQ(text.find("dlrun_progress_test_accuracy_ratio"), std::string::npos);
}

TEST(AgentView, TheCurveStaysBoundedAndKeepsTheNewest) {
  AgentView view("node-a");
  for (int64_t step = 1; step <= 5000; ++step)
    view.progress({{.beats = 1, .step = step}}, static_cast<double>(step));
  EXPECT_LE(view.curve().size(), AgentView::kMaxCurve);
  EXPECT_EQ(view.curve().front().step, 1);
  EXPECT_EQ(view.curve().back().step, 5000);
}

TEST(AgentView, StateJsonGroupsRanksIntoNodes) {
  AgentView view("node-a");
  view.roundStarted(world(3, 2, 4), 2, Clock::now());
  view.event(
      {.time = 1, .kind = "round_ended", .node = "node-a", .round = 3, .detail = "node lost: b"});
  const auto state = nlohmann::json::parse(view.stateJson(std::nullopt, 5));
  EXPECT_EQ(state["kind"], "agent");
  EXPECT_EQ(state["round"], 3);
  EXPECT_EQ(state["world_size"], 4);
  ASSERT_EQ(state["job_nodes"].size(), 2u);
  EXPECT_EQ(state["job_nodes"][1]["host"], "10.0.0.2");
  EXPECT_EQ(state["job_nodes"][1]["first_rank"], 2);
  EXPECT_EQ(state["job_nodes"][1]["last_rank"], 3);
  EXPECT_EQ(state["events"][0]["detail"], "node lost: b");
  EXPECT_FALSE(state.contains("store"));
}

TEST(AgentView, RestartCauses) {
  EXPECT_EQ(restartCause({.kind = Kind::WorkerFailed}), "failure");
  EXPECT_EQ(restartCause({.kind = Kind::WorkerFailed, .hang = true}), "hang");
  EXPECT_EQ(restartCause({.kind = Kind::NodeJoined}), "scale_up");
  EXPECT_EQ(restartCause({.kind = Kind::StoreLost}), "store_lost");
}

TEST(AgentView, StragglersAreCountedAndEachOnesPaceShown) {
  AgentView view("n1");
  EXPECT_NE(view.metricsText(std::nullopt).find("\ndlrun_stragglers 0\n"), std::string::npos);
  view.stragglers({{5, {.rank = 5, .node = "n3", .stepsPerSecond = 1, .median = 4}}});
  const std::string text = view.metricsText(std::nullopt);
  EXPECT_NE(text.find("\ndlrun_stragglers 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dlrun_straggler_pace_ratio{rank=\"5\",node=\"n3\"} 0.25"), std::string::npos)
      << text;
  view.stragglers({});
  EXPECT_EQ(view.metricsText(std::nullopt).find("dlrun_straggler_pace_ratio{"), std::string::npos);
}

// A series per cause from the start; the node's own state says whether it sits out, and why.
TEST(AgentView, ANodeSittingOutIsOneAndSaysWhy) {
  AgentView view("n1");
  const std::string none = view.metricsText(std::nullopt);
  EXPECT_TRUE(has(none, "dlrun_node_sitting_out{cause=\"health_check\"} 0")) << none;
  EXPECT_TRUE(has(none, "dlrun_node_sitting_out{cause=\"quarantine\"} 0")) << none;
  view.node(
      {.name = "n1",
       .state = control::kSittingOut,
       .sittingOut = control::SittingOut{.cause = control::kHealthCheck, .reason = "no GPU"}});
  const std::string out = view.metricsText(std::nullopt);
  EXPECT_TRUE(has(out, "dlrun_node_sitting_out{cause=\"health_check\"} 1")) << out;
  EXPECT_TRUE(has(out, "dlrun_node_sitting_out{cause=\"quarantine\"} 0")) << out;
  const auto state = nlohmann::json::parse(view.stateJson(std::nullopt, 1));
  EXPECT_EQ(state["this_node"]["sitting_out"], "no GPU");
  view.node({.name = "n1", .state = "joining"});  // it passed
  const std::string back = view.metricsText(std::nullopt);
  EXPECT_TRUE(has(back, "dlrun_node_sitting_out{cause=\"health_check\"} 0")) << back;
  EXPECT_TRUE(
      nlohmann::json::parse(view.stateJson(std::nullopt, 1))["this_node"]["sitting_out"].is_null());
}

}  // namespace
}  // namespace dlrun::agents
