// `dlrun status|events|stop`'s flags and human output (launcher/control_cli.h), without a
// server: what the user typed becomes one request or one clear error.
#include "launcher/control_cli.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "dlrun/v1/control.pb.h"

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

TEST(ControlCli, OnlyTheThreeWordsAreCommands) {
  EXPECT_TRUE(isControlCommand({"status"}));
  EXPECT_TRUE(isControlCommand({"events", "--follow"}));
  EXPECT_TRUE(isControlCommand({"stop"}));
  EXPECT_FALSE(isControlCommand({"train"}));
  EXPECT_FALSE(isControlCommand({"./status"}));
  EXPECT_FALSE(isControlCommand({}));
}

TEST(ControlCli, FlagsBecomeARequest) {
  auto r = parse(
      {"events", "--rdzv-endpoint=10.0.0.1", "--rdzv_id", "job", "-f", "--since=7", "--json"});
  EXPECT_EQ(r.command, "events");
  EXPECT_EQ(r.host, "10.0.0.1");
  EXPECT_EQ(r.port, 29400);
  EXPECT_EQ(r.jobId, "job");
  EXPECT_TRUE(r.follow);
  EXPECT_EQ(r.since, 7);
  EXPECT_TRUE(r.json);
  r = parse({"stop", "--rdzv-endpoint=[::1]:3000", "--rdzv-id=j", "--signal", "usr1"},
            {{"DLRUN_TOKEN", "secret"}});
  EXPECT_EQ(r.host, "::1");
  EXPECT_EQ(r.port, 3000);
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
  EXPECT_EQ(r.host, "node1");
  EXPECT_EQ(r.port, 29400 + 4242 % 2000);
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

}  // namespace
}  // namespace dlrun::launcher
