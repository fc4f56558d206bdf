// Slurm discovery: combinations of SLURM_* variables (as srun and sbatch set them) and the
// user's flags give the expected settings; malformed values are refused naming the variable.
#include "slurm/discovery.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::slurm {
namespace {

// What srun sets for the task of node `nodeId` in a step over node[1-4] of job 4242.
Environment step(int nodeId = 1) {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_JOB_NODELIST", "node[1-4]"},
          {"SLURM_STEP_NODELIST", "node[1-4]"},
          {"SLURM_NNODES", "4"},
          {"SLURM_STEP_NUM_NODES", "4"},
          {"SLURM_NODEID", std::to_string(nodeId)},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_NTASKS_PER_NODE", "1"},
          {"SLURM_CPUS_ON_NODE", "6"},
          {"SLURMD_NODENAME", "node" + std::to_string(nodeId + 1)}};
}

Environment with(Environment env, const Environment& changes) {
  for (const auto& [key, value] : changes) env[key] = value;
  return env;
}

Environment without(Environment env, const std::string& key) {
  env.erase(key);
  return env;
}

std::string errorOf(const Environment& env, const UserFlags& user = {}) {
  try {
    discover(env, user);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(SlurmDiscoveryTest, DetectedInsideAnAllocationUnlessSwitchedOff) {
  EXPECT_TRUE(detected(step()));
  EXPECT_FALSE(detected({}));
  EXPECT_FALSE(detected({{"SLURM_NODEID", "0"}}));
  EXPECT_FALSE(detected(with(step(), {{"DLRUN_SLURM", "0"}})));
  EXPECT_TRUE(detected(with(step(), {{"DLRUN_SLURM", "1"}})));
  EXPECT_THROW(detected(with(step(), {{"DLRUN_SLURM", "no"}})), ConfigError);
}

TEST(SlurmDiscoveryTest, AStepGivesEverythingAMultiNodeLaunchNeeds) {
  const Settings s = discover(step(2), {});
  EXPECT_EQ(s.rdzvId, "4242");
  EXPECT_EQ(s.endpoint.value().host, "node1");  // the first node of the step
  EXPECT_EQ(s.endpoint.value().port, discovery::kPortBase + 4242 % discovery::kPortRange);
  EXPECT_EQ(s.endpoint.value().port, 29642);
  EXPECT_EQ(s.nodeRank, 2);
  EXPECT_EQ(s.nnodes, 4);
  EXPECT_EQ(s.nodeName, "node3");
  EXPECT_EQ(s.servesStore, false);
  EXPECT_FALSE(s.nprocPerNode);  // only asked for with --nproc-per-node=auto
}

TEST(SlurmDiscoveryTest, TheFirstNodeServesTheStore) {
  EXPECT_EQ(discover(step(0), {}).servesStore, true);
  // By name where slurmd says it: node ids count from the step's first node.
  EXPECT_EQ(discover(with(step(3), {{"SLURMD_NODENAME", "node1"}}), {}).servesStore, true);
  EXPECT_EQ(discover(without(step(0), "SLURMD_NODENAME"), {}).servesStore, true);
  EXPECT_EQ(discover(without(step(1), "SLURMD_NODENAME"), {}).servesStore, false);
  EXPECT_FALSE(
      discover(without(without(step(0), "SLURMD_NODENAME"), "SLURM_NODEID"), {}).servesStore);
}

TEST(SlurmDiscoveryTest, TheStepsNodesWinOverTheJobs) {
  // srun -N2 --relative=2 inside a 4-node job: the step runs on node3 and node4.
  const auto env = with(step(0), {{"SLURM_STEP_NODELIST", "node[3-4]"},
                                  {"SLURM_STEP_NUM_NODES", "2"},
                                  {"SLURMD_NODENAME", "node3"}});
  const Settings s = discover(env, {});
  EXPECT_EQ(s.endpoint.value().host, "node3");
  EXPECT_EQ(s.nnodes, 2);
  EXPECT_EQ(s.servesStore, true);
  // Without the step's variables the job's are used.
  const Settings job =
      discover(without(without(step(0), "SLURM_STEP_NODELIST"), "SLURM_STEP_NUM_NODES"), {});
  EXPECT_EQ(job.endpoint.value().host, "node1");
  EXPECT_EQ(job.nnodes, 4);
}

TEST(SlurmDiscoveryTest, PortsDifferByJobAndStayBelowTheEphemeralRange) {
  EXPECT_EQ(discover(with(step(), {{"SLURM_JOB_ID", "1"}}), {}).endpoint.value().port, 29401);
  EXPECT_EQ(discover(with(step(), {{"SLURM_JOB_ID", "1999"}}), {}).endpoint.value().port, 31399);
  EXPECT_EQ(discover(with(step(), {{"SLURM_JOB_ID", "2000"}}), {}).endpoint.value().port, 29400);
}

TEST(SlurmDiscoveryTest, TheStepsReservedPortsGiveTheStoresPort) {
  EXPECT_EQ(
      discover(with(step(), {{"SLURM_STEP_RESV_PORTS", "12000-12003"}}), {}).endpoint.value().port,
      12000);
  EXPECT_EQ(
      discover(with(step(), {{"SLURM_STEP_RESV_PORTS", "12005,12007"}}), {}).endpoint.value().port,
      12005);
  EXPECT_EQ(discover(with(step(), {{"SLURM_STEP_RESV_PORTS", "12010"}}), {}).endpoint.value().port,
            12010);
  for (const char* bad : {"", "x-12", "0-3", "70000"}) {
    SCOPED_TRACE(bad);
    try {
      discover(with(step(), {{"SLURM_STEP_RESV_PORTS", bad}}), {});
      ADD_FAILURE() << "accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("SLURM_STEP_RESV_PORTS='"), std::string::npos);
    }
  }
}

TEST(SlurmDiscoveryTest, ExplicitFlagsWin) {
  const Settings s =
      discover(step(2), {.nnodes = true, .nodeRank = true, .rdzvEndpoint = true, .rdzvId = true});
  EXPECT_FALSE(s.nnodes);
  EXPECT_FALSE(s.nodeRank);
  EXPECT_FALSE(s.endpoint);
  EXPECT_FALSE(s.servesStore);
  EXPECT_FALSE(s.rdzvId);
  EXPECT_EQ(s.nodeName, "node3");  // no flag names the node
}

TEST(SlurmDiscoveryTest, AutoWorkersAreTheNodesGpusElseTasksElseCpus) {
  const UserFlags autoNproc{.nprocAuto = true};
  EXPECT_EQ(discover(step(), autoNproc).nprocPerNode, 6);  // one task per node: the CPUs
  EXPECT_EQ(discover(with(step(), {{"SLURM_GPUS_ON_NODE", "4"}}), autoNproc).nprocPerNode, 4);
  EXPECT_EQ(discover(with(step(), {{"SLURM_GPUS_ON_NODE", "0"}}), autoNproc).nprocPerNode, 6);
  EXPECT_EQ(discover(with(step(), {{"SLURM_NTASKS_PER_NODE", "3"}}), autoNproc).nprocPerNode, 3);
  EXPECT_EQ(discover(with(step(), {{"SLURM_NTASKS_PER_NODE", "3"}, {"SLURM_GPUS_ON_NODE", "2"}}),
                     autoNproc)
                .nprocPerNode,
            2);
  // Slurm says nothing: the launcher falls back to the machine's own count.
  EXPECT_FALSE(discover(without(step(), "SLURM_CPUS_ON_NODE"), autoNproc).nprocPerNode);
}

TEST(SlurmDiscoveryTest, ABatchScriptOfOneNodeIsAJobStepOfItsOwn) {
  const auto batch = Environment{{"SLURM_JOB_ID", "7"},
                                 {"SLURM_JOB_NODELIST", "gpu-01"},
                                 {"SLURM_NNODES", "1"},
                                 {"SLURM_NODEID", "0"},
                                 {"SLURM_CPUS_ON_NODE", "8"}};
  const Settings s = discover(batch, {.nprocAuto = true});
  EXPECT_EQ(s.nnodes, 1);
  EXPECT_EQ(s.nprocPerNode, 8);
  EXPECT_EQ(s.rdzvId, "7");
}

TEST(SlurmDiscoveryTest, SeveralNodesOutsideAJobStepAreRefused) {
  const auto batch = without(step(0), "SLURM_STEP_ID");
  EXPECT_EQ(errorOf(without(batch, "SLURM_STEP_NUM_NODES")),
            "this Slurm job has 4 nodes but dlrun runs outside a job step (SLURM_STEP_ID is "
            "unset): start one dlrun per node with srun --ntasks-per-node=1, or pass --nnodes");
  EXPECT_NO_THROW(discover(batch, {.nnodes = true}));
}

TEST(SlurmDiscoveryTest, MalformedVariablesAreNamed) {
  EXPECT_TRUE(contains(errorOf(with(step(), {{"SLURM_NODEID", "x"}})), "SLURM_NODEID='x'"));
  EXPECT_TRUE(contains(errorOf(with(step(), {{"SLURM_NODEID", "-1"}})), "SLURM_NODEID='-1'"));
  EXPECT_TRUE(contains(errorOf(with(step(), {{"SLURM_JOB_ID", "12a"}})), "SLURM_JOB_ID='12a'"));
  EXPECT_TRUE(
      contains(errorOf(with(step(), {{"SLURM_STEP_NUM_NODES", "0"}})), "SLURM_STEP_NUM_NODES='0'"));
  EXPECT_TRUE(contains(errorOf(with(step(), {{"SLURM_CPUS_ON_NODE", "many"}}), {.nprocAuto = true}),
                       "SLURM_CPUS_ON_NODE='many'"));
  EXPECT_TRUE(contains(errorOf(with(step(), {{"SLURM_STEP_NODELIST", "node[1-"}})),
                       "SLURM_STEP_NODELIST='node[1-' is not a Slurm hostlist"));
}

TEST(SlurmDiscoveryTest, AMissingNodeListAsksForAnEndpoint) {
  const auto env = without(without(step(), "SLURM_STEP_NODELIST"), "SLURM_JOB_NODELIST");
  EXPECT_TRUE(contains(errorOf(env), "pass --rdzv-endpoint"));
  EXPECT_NO_THROW(discover(env, {.rdzvEndpoint = true}));
}

TEST(SlurmDiscoveryTest, NoJobIdIsNoAllocation) {
  EXPECT_TRUE(contains(errorOf(without(step(), "SLURM_JOB_ID")), "SLURM_JOB_ID is not set"));
}

}  // namespace
}  // namespace dlrun::slurm
