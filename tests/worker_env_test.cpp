// The worker environment (ARCHITECTURE.md section 2) as a pure function: every variable, what a
// user set being kept, and TF_CONFIG.
#include "agents/worker_env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <nlohmann/json.hpp>

#include "common/error.h"

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
  world.restarts = {.maxRestarts = 3};
  world.masterAddr = "10.0.0.1";
  world.masterPort = 29500;
  world.agentStore = true;
  world.workerEndpoints = {"10.0.0.1:4000", "10.0.0.1:4001", "10.0.0.2:5000", "10.0.0.2:5001"};
  return world;
}

WorkerSpec spec() { return WorkerSpec{"trainer", 1, "/logs/job42/attempt_1/1/error.json"}; }

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

TEST(WorkerEnv, ATorchWithoutLibuvMeetsAtRankZerosEndpointWithTheClassicStore) {
  auto world = twoNodeWorld();
  serveStoreAtRankZero(world);
  EXPECT_FALSE(world.agentStore);
  const Environment env = workerEnvironment({}, world, spec(), 1);
  EXPECT_EQ(env.at("MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(env.at("MASTER_PORT"), "4000");
  EXPECT_EQ(env.at("TORCHELASTIC_USE_AGENT_STORE"), "False");
  EXPECT_EQ(env.at("USE_LIBUV"), "0");
  // The user's own choice stays, whatever it is.
  EXPECT_EQ(workerEnvironment({{"USE_LIBUV", "1"}}, world, spec(), 0).at("USE_LIBUV"), "1");
  // The agent's store: USE_LIBUV is the user's alone.
  EXPECT_FALSE(workerEnvironment({}, twoNodeWorld(), spec(), 0).contains("USE_LIBUV"));

  auto v6 = twoNodeWorld();
  v6.workerEndpoints = {"[fe80::1]:4000", "[fe80::1]:4001", "[fe80::2]:5000", "[fe80::2]:5001"};
  serveStoreAtRankZero(v6);
  EXPECT_EQ(v6.masterAddr, "fe80::1");
  EXPECT_EQ(v6.masterPort, 4000);
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

// A world of `size` workers whose endpoints are as long as IPv4 loopback ones.
rendezvous::World largeWorld(int size) {
  auto world = twoNodeWorld();
  world.worldSize = size;
  world.workerEndpoints.clear();
  for (int rank = 0; rank < size; ++rank)
    world.workerEndpoints.push_back("127.0.0.1:" + std::to_string(20000 + rank % 40000));
  return world;
}

RoundSpec roundSpec(std::optional<std::string> tfCluster, bool inheritTfConfig = false) {
  return {.role = "trainer",
          .restartCount = 1,
          .tfCluster = std::move(tfCluster),
          .inheritTfConfig = inheritTfConfig};
}

TEST(WorkerEnv, TheNodesSharedPartHoldsAllButEachWorkersOwnFive) {
  const auto world = twoNodeWorld();
  const Environment inherited = {{"PATH", "/usr/bin"}, {"RANK", "99"}, {"TF_CONFIG", "{}"}};
  const NodeEnvironment node(inherited, world, roundSpec(tfConfigCluster(world)));
  for (const auto& entry : node.shared()) {
    for (const char* own :
         {"RANK=", "LOCAL_RANK=", "ROLE_RANK=", "TORCHELASTIC_ERROR_FILE=", "TF_CONFIG="})
      EXPECT_FALSE(entry.starts_with(own)) << entry;
  }
  const auto own = node.own(1, "/e.json");
  EXPECT_EQ(own,
            (std::vector<std::string>{"RANK=3", "LOCAL_RANK=1", "TORCHELASTIC_ERROR_FILE=/e.json",
                                      "ROLE_RANK=3", "TF_CONFIG=" + tfConfig(world, 3)}));
  // Together they are the one-worker environment.
  const WorkerSpec one{"trainer", 1, "/e.json"};
  EXPECT_EQ(node.forWorker(1, "/e.json"), workerEnvironment(inherited, world, one, 1));
}

TEST(WorkerEnv, ServicesAndHeartbeatFilesForHangWatching) {
  const auto world = twoNodeWorld();
  RoundSpec round;
  round.services = {{"DLRUN_PROGRESS_FILE", "/logs/progress"}, {"PYTHONPATH", "/hook:/mine"}};
  round.heartbeatDir = "/logs/heartbeat";
  const NodeEnvironment node({{"PYTHONPATH", "/mine"}}, world, round);
  const Environment env = node.forWorker(1, "/e.json");
  EXPECT_EQ(env.at("DLRUN_PROGRESS_FILE"), "/logs/progress");
  EXPECT_EQ(env.at("PYTHONPATH"), "/hook:/mine");  // a service's value wins
  EXPECT_EQ(env.at("DLRUN_HEARTBEAT_FILE"), "/logs/heartbeat/1");
  EXPECT_EQ(heartbeatFile("/logs/heartbeat", 1), "/logs/heartbeat/1");
  const ExecSizes sizes = node.sizes(1, "/e.json");
  ExecSizes expected;
  for (const auto& entry : node.shared()) expected.add(entry.size());
  for (const auto& entry : node.own(1, "/e.json")) expected.add(entry.size());
  EXPECT_EQ(sizes.bytes, expected.bytes);
  // Without a heartbeat directory nothing is set.
  EXPECT_FALSE(
      NodeEnvironment({}, world, RoundSpec{}).forWorker(0, "/e").contains("DLRUN_HEARTBEAT_FILE"));
}

TEST(WorkerEnv, AVirtualLocalRankIsZeroAndTheWorkersOwnDeviceIsItsOnlyOne) {
  const auto world = twoNodeWorld();
  RoundSpec round{.virtualLocalRank = true};
  // The inherited list's entry for the local rank, spaces trimmed, as torchrun does.
  const NodeEnvironment listed({{"CUDA_VISIBLE_DEVICES", "3, GPU-7f"}}, world, round);
  for (const auto& entry : listed.shared())
    EXPECT_FALSE(entry.starts_with("CUDA_VISIBLE_")) << entry;
  const Environment second = listed.forWorker(1, "/e.json");
  EXPECT_EQ(second.at("LOCAL_RANK"), "0");
  EXPECT_EQ(second.at("RANK"), "3");
  EXPECT_EQ(second.at("CUDA_VISIBLE_DEVICES"), "GPU-7f");
  EXPECT_EQ(listed.forWorker(0, "/e.json").at("CUDA_VISIBLE_DEVICES"), "3");
  // None inherited: the local rank's own number.
  const NodeEnvironment numbered({}, world, round);
  EXPECT_EQ(numbered.forWorker(1, "/e.json").at("CUDA_VISIBLE_DEVICES"), "1");
  EXPECT_EQ(numbered.forWorker(1, "/e.json").at("LOCAL_RANK"), "0");
  ExecSizes expected;
  for (const auto& entry : listed.shared()) expected.add(entry.size());
  for (const auto& entry : listed.own(1, "/e.json")) expected.add(entry.size());
  EXPECT_EQ(listed.sizes(1, "/e.json").bytes, expected.bytes);
  // Without the flag an inherited list is every worker's, and LOCAL_RANK is the local rank.
  const NodeEnvironment plain({{"CUDA_VISIBLE_DEVICES", "3,4"}}, world, RoundSpec{});
  EXPECT_EQ(plain.forWorker(1, "/e.json").at("CUDA_VISIBLE_DEVICES"), "3,4");
  EXPECT_EQ(plain.forWorker(1, "/e.json").at("LOCAL_RANK"), "1");
}

TEST(WorkerEnv, SizesAreWhatExecGetsWithoutBuildingTfConfig) {
  const auto world = largeWorld(500);
  const NodeEnvironment node({{"HOME", "/home/u"}}, world, roundSpec(tfConfigCluster(world)));
  for (int local : {0, 1}) {
    ExecSizes expected;
    for (const auto& entry : node.shared()) expected.add(entry.size());
    for (const auto& entry : node.own(local, "/logs/error.json")) expected.add(entry.size());
    const ExecSizes sizes = node.sizes(local, "/logs/error.json");
    EXPECT_EQ(sizes.count, expected.count);
    EXPECT_EQ(sizes.bytes, expected.bytes);
    EXPECT_EQ(sizes.longest, expected.longest);
  }
}

TEST(WorkerEnv, TfConfigIsTheSameTextAsOneJsonDocument) {
  const auto world = largeWorld(1000);
  const std::string cluster = tfConfigCluster(world);
  for (int rank : {0, 7, 999}) {
    const nlohmann::json whole = {
        {"cluster", {{"worker", world.workerEndpoints}}},
        {"task", {{"type", "worker"}, {"index", rank}}},
    };
    EXPECT_EQ(tfConfig(cluster, rank), whole.dump());
    EXPECT_EQ(tfConfigLength(cluster, rank), whole.dump().size());
  }
}

TEST(WorkerEnv, TfConfigIsLeftOutOrRefusedWhenOverTheKernelsLimit) {
  constexpr size_t kLimit = 128 * 1024;
  // About 144 KB for 8000 workers: no worker could be executed with it.
  const auto big = largeWorld(8000);
  const std::string cluster = tfConfigCluster(big);
  const size_t bytes = std::string("TF_CONFIG=").size() + tfConfigLength(cluster, 7999) + 1;
  ASSERT_GT(bytes, kLimit);
  const TfConfigChoice auto_ = chooseTfConfig(TfConfigMode::Auto, cluster, 8000, kLimit);
  EXPECT_FALSE(auto_.set);
  EXPECT_NE(auto_.warning.find(std::to_string(bytes) + " bytes"), std::string::npos)
      << auto_.warning;
  EXPECT_NE(auto_.warning.find("--tf-config"), std::string::npos) << auto_.warning;
  try {
    chooseTfConfig(TfConfigMode::Always, cluster, 8000, kLimit);
    FAIL() << "--tf-config=always accepted a TF_CONFIG over the limit";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--tf-config=always"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::to_string(kLimit)), std::string::npos) << e.what();
  }
  const TfConfigChoice never = chooseTfConfig(TfConfigMode::Never, "", 8000, kLimit);
  EXPECT_FALSE(never.set);
  EXPECT_TRUE(never.warning.empty());
  // Exactly at the limit it fits, one byte over it does not.
  for (auto mode : {TfConfigMode::Auto, TfConfigMode::Always}) {
    EXPECT_TRUE(chooseTfConfig(mode, cluster, 8000, bytes).set);
    EXPECT_TRUE(chooseTfConfig(mode, cluster, 8000, bytes).warning.empty());
  }
  EXPECT_FALSE(chooseTfConfig(TfConfigMode::Auto, cluster, 8000, bytes - 1).set);
}

TEST(WorkerEnv, AnInheritedTfConfigGoesUnlessNeverLeavesItAlone) {
  const Environment inherited = {{"TF_CONFIG", "{\"stale\":1}"}};
  const auto world = twoNodeWorld();
  // Left out (auto, over the limit): a stale one would describe another job.
  EXPECT_FALSE(NodeEnvironment(inherited, world, roundSpec(std::nullopt))
                   .forWorker(0, "/e")
                   .contains("TF_CONFIG"));
  // --tf-config=never: dlrun does not touch it, as torchrun does not.
  EXPECT_EQ(NodeEnvironment(inherited, world, roundSpec(std::nullopt, true))
                .forWorker(0, "/e")
                .at("TF_CONFIG"),
            "{\"stale\":1}");
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
