// The worker environment (ARCHITECTURE.md section 2) as a pure function: every variable, what a
// user set being kept, and TF_CONFIG.
#include "agents/worker_env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

namespace dlrun::agents {
namespace {

// Node 1 of 2, two workers per node: this node holds ranks 2 and 3 of 4.
rendezvous::World twoNodeWorld() {
  rendezvous::World world;
  world.runId = "job42";
  world.round = 3;
  world.groupRank = 1;
  world.groupWorldSize = 2;
  world.localWorldSize = 2;
  world.baseRank = 2;
  world.worldSize = 4;
  world.masterAddr = "10.0.0.1";
  world.masterPort = 29500;
  world.agentStore = true;
  world.workerEndpoints = {"10.0.0.1:4000", "10.0.0.1:4001", "10.0.0.2:5000", "10.0.0.2:5001"};
  return world;
}

WorkerSpec spec() { return WorkerSpec{"trainer", 3, 1, "/logs/job42/attempt_1/1/error.json"}; }

TEST(WorkerEnv, EveryVariable) {
  const Environment env = workerEnvironment({}, twoNodeWorld(), spec(), 1);
  const Environment expected = {
      {"RANK", "3"},
      {"LOCAL_RANK", "1"},
      {"WORLD_SIZE", "4"},
      {"LOCAL_WORLD_SIZE", "2"},
      {"GROUP_RANK", "1"},
      {"GROUP_WORLD_SIZE", "2"},
      {"ROLE_NAME", "trainer"},
      {"ROLE_RANK", "3"},
      {"ROLE_WORLD_SIZE", "4"},
      {"MASTER_ADDR", "10.0.0.1"},
      {"MASTER_PORT", "29500"},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {"TORCHELASTIC_RESTART_COUNT", "1"},
      {"TORCHELASTIC_MAX_RESTARTS", "3"},
      {"TORCHELASTIC_RUN_ID", "job42"},
      {"TORCHELASTIC_ERROR_FILE", "/logs/job42/attempt_1/1/error.json"},
      {"OMP_NUM_THREADS", "1"},
      {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
      {"NCCL_ASYNC_ERROR_HANDLING", "1"},
  };
  for (const auto& [key, value] : expected) {
    ASSERT_TRUE(env.contains(key)) << key;
    EXPECT_EQ(env.at(key), value) << key;
  }
  ASSERT_TRUE(env.contains("TF_CONFIG"));
  // Nothing beyond the documented variables when nothing was inherited.
  EXPECT_EQ(env.size(), expected.size() + 1);
}

TEST(WorkerEnv, RanksFollowTheLocalRank) {
  const auto world = twoNodeWorld();
  for (int local = 0; local < 2; ++local) {
    const Environment env = workerEnvironment({}, world, spec(), local);
    EXPECT_EQ(env.at("LOCAL_RANK"), std::to_string(local));
    EXPECT_EQ(env.at("RANK"), std::to_string(2 + local));
    EXPECT_EQ(env.at("ROLE_RANK"), std::to_string(2 + local));
  }
}

TEST(WorkerEnv, InheritedVariablesPassThroughAndStaleOnesAreReplaced) {
  const Environment inherited = {{"PATH", "/usr/bin"},
                                 {"HOME", "/home/u"},
                                 {"RANK", "99"},
                                 {"MASTER_PORT", "1"},
                                 {"TORCHELASTIC_RESTART_COUNT", "7"},
                                 {"TF_CONFIG", "{}"}};
  const Environment env = workerEnvironment(inherited, twoNodeWorld(), spec(), 0);
  EXPECT_EQ(env.at("PATH"), "/usr/bin");
  EXPECT_EQ(env.at("HOME"), "/home/u");
  EXPECT_EQ(env.at("RANK"), "2");
  EXPECT_EQ(env.at("MASTER_PORT"), "29500");
  EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_NE(env.at("TF_CONFIG"), "{}");
}

TEST(WorkerEnv, UserTuningIsKept) {
  const Environment inherited = {{"OMP_NUM_THREADS", "6"},
                                 {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"},
                                 {"NCCL_ASYNC_ERROR_HANDLING", "3"}};
  const Environment env = workerEnvironment(inherited, twoNodeWorld(), spec(), 0);
  EXPECT_EQ(env.at("OMP_NUM_THREADS"), "6");
  EXPECT_EQ(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "0");
  EXPECT_EQ(env.at("NCCL_ASYNC_ERROR_HANDLING"), "3");
}

TEST(WorkerEnv, OmpDefaultOnlyForSeveralWorkers) {
  auto world = twoNodeWorld();
  world.localWorldSize = 1;
  world.worldSize = 2;
  const Environment env = workerEnvironment({}, world, spec(), 0);
  EXPECT_FALSE(env.contains("OMP_NUM_THREADS"));
  // The NCCL pair does not depend on the worker count.
  EXPECT_EQ(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
  EXPECT_EQ(env.at("NCCL_ASYNC_ERROR_HANDLING"), "1");
}

TEST(WorkerEnv, ForeignStoreIsNotTheAgents) {
  auto world = twoNodeWorld();
  world.agentStore = false;
  EXPECT_EQ(workerEnvironment({}, world, spec(), 0).at("TORCHELASTIC_USE_AGENT_STORE"), "False");
}

TEST(WorkerEnv, TfConfig) {
  const auto world = twoNodeWorld();
  for (int local = 0; local < 2; ++local) {
    const int rank = 2 + local;
    const auto config =
        nlohmann::json::parse(workerEnvironment({}, world, spec(), local).at("TF_CONFIG"));
    const nlohmann::json expected = {
        {"cluster", {{"worker", world.workerEndpoints}}},
        {"task", {{"type", "worker"}, {"index", rank}}},
    };
    EXPECT_EQ(config, expected) << config.dump();
    EXPECT_TRUE(config["task"]["index"].is_number_integer());
  }
  EXPECT_EQ(nlohmann::json::parse(tfConfig(world, 0))["cluster"]["worker"][3], "10.0.0.2:5001");
}

TEST(WorkerEnv, TfConfigKeepsIpv6Endpoints) {
  auto world = twoNodeWorld();
  world.workerEndpoints = {"[::1]:4000", "[::1]:4001", "[fe80::2]:5000", "[fe80::2]:5001"};
  const auto config = nlohmann::json::parse(tfConfig(world, 1));
  EXPECT_EQ(config["cluster"]["worker"], world.workerEndpoints);
  EXPECT_EQ(config["task"]["index"], 1);
}

TEST(WorkerEnv, ToEnvpAndCurrentEnvironment) {
  const auto envp = toEnvp({{"A", "1"}, {"B", "x=y"}, {"EMPTY", ""}});
  EXPECT_EQ(envp, (std::vector<std::string>{"A=1", "B=x=y", "EMPTY="}));
  ::setenv("DLRUN_WORKER_ENV_TEST", "a=b", 1);
  const Environment current = currentEnvironment();
  ::unsetenv("DLRUN_WORKER_ENV_TEST");
  ASSERT_TRUE(current.contains("DLRUN_WORKER_ENV_TEST"));
  EXPECT_EQ(current.at("DLRUN_WORKER_ENV_TEST"), "a=b");
}

}  // namespace
}  // namespace dlrun::agents
