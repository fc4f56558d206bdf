// `dlrun status|events|stop`'s flags and human output (launcher/control_cli.h), without a
// server: what the user typed becomes one request or one clear error.
#include "launcher/control_cli.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "common/error.h"
#include "dlrun/v1/control.pb.h"
#include "launcher/control_top.h"

namespace dlrun::launcher {
namespace {

using Env = std::map<std::string, std::string>;

ControlRequest parse(const std::vector<std::string>& args, const Env& env = {}) {
  return parseControlArgs(args, env).request;
}

std::string errorOf(const std::vector<std::string>& args, const Env& env = {}) {
  try {
    parse(args, env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(ControlCli, OnlyTheFourWordsAreCommands) {
  EXPECT_TRUE(isControlCommand({"status"}));
  EXPECT_TRUE(isControlCommand({"events", "--follow"}));
  EXPECT_TRUE(isControlCommand({"stop"}));
  EXPECT_TRUE(isControlCommand({"top"}));
  EXPECT_TRUE(isControlCommand({"logs", "3"}));
  EXPECT_FALSE(isControlCommand({"train"}));
  EXPECT_FALSE(isControlCommand({"./status"}));
  EXPECT_FALSE(isControlCommand({}));
}

TEST(ControlCli, FlagsBecomeARequest) {
  auto r = parse(
      {"events", "--rdzv-endpoint=10.0.0.1", "--rdzv_id", "job", "-f", "--since=7", "--json"});
  EXPECT_EQ(r.command, "events");
  EXPECT_EQ(r.store.host, "10.0.0.1");
  EXPECT_EQ(r.store.port, 29400);
  EXPECT_EQ(r.jobId, "job");
  EXPECT_TRUE(r.follow);
  EXPECT_EQ(r.since, 7);
  EXPECT_TRUE(r.json);
  r = parse({"stop", "--rdzv-endpoint=[::1]:3000", "--rdzv-id=j", "--signal", "usr1"},
            {{"DLRUN_TOKEN", "secret"}});
  EXPECT_EQ(r.store.host, "::1");
  EXPECT_EQ(r.store.port, 3000);
  EXPECT_EQ(r.signal, 10);
  EXPECT_EQ(r.token, "secret");
  r = parse({"stop", "--rdzv-endpoint=h:1", "--rdzv-id=j", "--exit-code=3", "--reason=done"});
  EXPECT_FALSE(r.signal);
  EXPECT_EQ(r.exitCode, 3);
}

TEST(ControlCli, InsideSlurmTheLaunchersEndpointAndId) {
  const Env slurm{{"SLURM_JOB_ID", "4242"}, {"SLURM_JOB_NODELIST", "node1"}, {"SLURM_NNODES", "1"}};
  const auto r = parse({"status"}, slurm);
  EXPECT_EQ(r.jobId, "4242");
  EXPECT_EQ(r.store.host, "node1");
  EXPECT_EQ(r.store.port, 29400 + 4242 % 2000);
}

TEST(ControlCli, BadInputIsOneLineNamingTheFlag) {
  EXPECT_NE(errorOf({"status", "--rdzv-id=j"}).find("--rdzv-endpoint is needed"),
            std::string::npos);
  EXPECT_NE(errorOf({"status", "--rdzv-endpoint=h"}).find("--rdzv-id is needed"),
            std::string::npos);
  EXPECT_NE(errorOf({"status", "--rdzv-endpoint=h:abc", "--rdzv-id=j"}).find("--rdzv-endpoint"),
            std::string::npos);
  EXPECT_NE(
      errorOf({"stop", "--rdzv-endpoint=h", "--rdzv-id=j", "--signal=FOO"}).find("--signal: 'FOO'"),
      std::string::npos);
  EXPECT_NE(errorOf({"status", "--follow"}).find("--follow"), std::string::npos);
  EXPECT_NE(errorOf({"status", "--rdzv-endpoint=h", "--rdzv-id=j", "--token-file=/nonexistent"})
                .find("--token-file"),
            std::string::npos);
}

TEST(ControlCli, HumanFormsNameNodesWorkersAndEvents) {
  v1::Job job;
  job.set_id("job");
  job.set_backend("c10d");
  job.set_state(v1::RUNNING);
  job.set_round(2);
  job.set_min_nodes(2);
  job.set_max_nodes(3);
  job.set_restarts_used(1);
  job.set_max_restarts(3);
  auto* node = job.add_nodes();
  node->set_name("n1");
  node->set_address("10.0.0.2");
  node->set_group_rank(1);
  node->set_state("running");
  node->set_agent(2);
  auto* worker = node->add_workers();
  worker->set_rank(2);
  worker->set_pid(4711);
  worker->set_state("running");
  worker->set_step(12);
  // Agent 1 of the same host was lost and came back as agent 2.
  auto* lost = job.add_nodes();
  *lost = *node;
  lost->set_agent(1);
  lost->set_replaced_by(2);
  lost->set_round(1);
  lost->mutable_workers(0)->set_pid(4242);
  job.mutable_nodes()->SwapElements(0, 1);
  const std::string text = formatJob(job);
  EXPECT_NE(text.find("job job (c10d): running, round 2, nodes 1 of 2:3, restarts 1 of 3"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("1     2     n1"), std::string::npos) << text;  // GROUP, AGENT, NODE
  EXPECT_NE(text.find("4711"), std::string::npos) << text;
  EXPECT_NE(text.find("step 12"), std::string::npos) << text;
  // Listed last, with no workers: they went with it.
  EXPECT_NE(text.find("-     1     n1"), std::string::npos) << text;
  const size_t replaced = text.find("replaced  by agent 2; last running in round 1 at ");
  ASSERT_NE(replaced, std::string::npos) << text;
  EXPECT_GT(replaced, text.find("4711")) << text;
  EXPECT_EQ(text.find("4242"), std::string::npos) << text;

  v1::Event event;
  event.set_seq(3);
  event.set_kind("worker_failed");
  event.set_round(1);
  event.set_node("n1");
  event.set_rank(2);
  event.set_detail("exit code 3");
  const std::string line = formatEvent(event);
  EXPECT_NE(line.find("worker_failed"), std::string::npos) << line;
  EXPECT_NE(line.find("rank 2: exit code 3"), std::string::npos) << line;
}

TEST(ControlCli, LogLinesSayTheirRanksWhereRanksMix) {
  v1::LogLine line;
  line.set_text("loss 0.5");
  line.add_ranks(3);
  line.add_nodes("n2");
  line.set_count(1);
  EXPECT_EQ(formatLogLine(line, false, false), "loss 0.5\n");
  EXPECT_EQ(formatLogLine(line, true, false), "[3]: loss 0.5\n");
  EXPECT_EQ(formatLogLine(line, true, true), "[3] n2: loss 0.5\n");
  v1::LogLine shared;
  shared.set_text("warning");
  for (int rank : {0, 1, 2, 3, 5}) shared.add_ranks(rank);
  for (const char* node : {"n1", "n2", "n3", "n4"}) shared.add_nodes(node);
  shared.set_count(10);
  EXPECT_EQ(formatLogLine(shared, true, true), "[0-3,5] 4 nodes, 10 times: warning\n");
}

TEST(ControlCli, LogsFlagsAreCheckedOnce) {
  auto logs = [](std::vector<std::string> args) {
    args.insert(args.begin(), "logs");
    args.push_back("--rdzv-endpoint=h:1");
    args.push_back("--rdzv-id=j");
    return parse(args);
  };
  const ControlRequest r = logs({"7", "--tail", "5", "--stream", "err", "--grep", "x"});
  EXPECT_EQ(r.logs.rank().value(), 7);
  EXPECT_EQ(r.logs.tail().value(), 5);
  EXPECT_EQ(r.logs.streams(), "err");
  EXPECT_FALSE(r.logs.has_attempt());
  EXPECT_THROW(logs({"--grouped", "-f"}), ConfigError);
  EXPECT_THROW(logs({"3", "--grouped"}), ConfigError);
  EXPECT_THROW(logs({"--stream", "all"}), ConfigError);
  EXPECT_THROW(logs({"--", "-1"}), ConfigError);
}

// A job of 3 nodes and 12 ranks, rank 7 slow.
v1::Job topJob() {
  v1::Job job;
  job.set_id("job-with-a-rather-long-identifier-0123456789abcdef-0123456789abcdef");
  job.set_backend("c10d");
  job.set_state(v1::RUNNING);
  job.set_round(1);
  job.set_min_nodes(2);
  job.set_max_nodes(4);
  job.set_restarts_used(1);
  job.set_max_restarts(3);
  job.set_time(3600 * 5 + 61);
  for (int n = 0; n < 3; ++n) {
    auto* node = job.add_nodes();
    node->set_name("node-with-a-long-name-" + std::to_string(n));
    node->set_agent(n + 1);
    node->set_state("running");
    for (int local = 0; local < 4; ++local) {
      auto* w = node->add_workers();
      const int rank = n * 4 + local;
      w->set_rank(rank);
      w->set_pid(1000 + rank);
      w->set_state("running");
      w->set_reported(true);
      w->set_step(rank == 7 ? 100 : 400);
      w->set_steps_per_second(rank == 7 ? 1 : 4);
      w->set_since_step(0.5);
      w->set_has_loss(true);
      w->set_loss(0.123456);
      w->set_straggler(rank == 7);
    }
  }
  auto* s = job.add_stragglers();
  s->set_rank(7);
  return job;
}

TEST(ControlTop, AFrameFitsEightyColumnsAndPutsStragglersFirst) {
  std::deque<v1::Event> events;
  v1::Event e;
  e.set_time(3600 * 5);
  e.set_kind("straggler");
  e.set_detail(
      "rank 7 on node-with-a-long-name-1 at 1.00 steps/s, 0.25 of the median 4.00, for 31 s");
  events.push_back(e);
  const std::string frame = formatTop(topJob(), events, 80, 40);
  std::istringstream lines(frame);
  std::vector<std::string> all;
  for (std::string line; std::getline(lines, line);) {
    EXPECT_LE(line.size(), 80u) << line;
    all.push_back(line);
  }
  EXPECT_NE(frame.find("05:01:01 UTC"), std::string::npos) << frame;
  EXPECT_NE(frame.find("running, round 1, restarts 1/3, nodes 3 (2:4), ranks 12"),
            std::string::npos)
      << frame;
  EXPECT_NE(frame.find("median pace 4.00 steps/s, stragglers 1"), std::string::npos) << frame;
  // The header, then rank 7 first, marked.
  size_t header = 0;
  while (header < all.size() && all[header].find("STEPS/S") == std::string::npos) ++header;
  ASSERT_LT(header + 1, all.size()) << frame;
  EXPECT_NE(all[header + 1].find(" 7 "), std::string::npos) << all[header + 1];
  EXPECT_NE(all[header + 1].find("SLOW"), std::string::npos) << all[header + 1];
  EXPECT_EQ(frame.find("SLOW", frame.find("SLOW") + 1), std::string::npos) << frame;  // once
  EXPECT_NE(frame.find("events:"), std::string::npos);
  EXPECT_NE(frame.find("straggler"), std::string::npos);
}

TEST(ControlTop, ASmallTerminalShowsTheStragglersAndCountsTheRest) {
  const std::string frame = formatTop(topJob(), {}, 80, 10);
  EXPECT_LE(std::count(frame.begin(), frame.end(), '\n'), 10) << frame;
  EXPECT_NE(frame.find("SLOW"), std::string::npos) << frame;
  EXPECT_NE(frame.find("more ranks (dlrun status lists all)"), std::string::npos) << frame;
}

// A node sitting out has no ranks: a line says which and why, in top and in status.
TEST(ControlTop, ANodeSittingOutIsNamedWithWhy) {
  v1::Job job = topJob();
  auto* out = job.add_nodes();
  out->set_name("n9");
  out->set_agent(4);
  out->set_group_rank(-1);
  out->set_state("sitting_out");
  out->set_sitting_out("--health-check 'x' failed (exit code 1): no GPUs");
  out->set_sitting_out_cause("health_check");
  const std::string frame = formatTop(job, {}, 120, 40);
  EXPECT_NE(frame.find("sits out: n9 (agent 4): --health-check 'x' failed (exit code 1): no GPUs"),
            std::string::npos)
      << frame;
  EXPECT_NE(frame.find("ranks 12"), std::string::npos) << frame;
  const std::string text = formatJob(job);
  EXPECT_NE(text.find("-     4     n9"), std::string::npos) << text;  // no group rank
  EXPECT_NE(text.find("sitting_out --health-check 'x' failed (exit code 1): no GPUs\n"),
            std::string::npos)
      << text;
}

TEST(ControlTop, HasFlagsOfItsOwn) {
  const auto parsed = parseControlArgs(
      {"top", "--rdzv-endpoint=h:1", "--rdzv-id=j", "--interval=2.5", "--once"}, {});
  EXPECT_TRUE(parsed.request.once);
  EXPECT_EQ(parsed.request.interval, std::chrono::milliseconds(2500));
  EXPECT_THROW(parseControlArgs({"top", "--rdzv-endpoint=h:1", "--rdzv-id=j", "--interval=0"}, {}),
               ConfigError);
  EXPECT_THROW(parseControlArgs({"top", "--rdzv-endpoint=h:1", "--rdzv-id=j", "--json"}, {}),
               ConfigError);
}

}  // namespace
}  // namespace dlrun::launcher
