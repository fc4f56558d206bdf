// The dlrun command line where the job runs: inside a Slurm allocation, under mpirun, over
// --hostfile/--hosts, in a Kubernetes pod, and the settings the environment gives (PET_ and
// torch's variables, CUDA_VISIBLE_DEVICES, a venv's interpreter); with the fake HostProbe of
// launch_cli_testing.h.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "launcher/launch_cli.h"
#include "tests/launch_cli_testing.h"

namespace dlrun::launcher {
namespace {

// --- Kubernetes ----------------------------------------------------------------------

// A pod's SIGTERM is its deletion: in an elastic job that node leaves, unless stop_policy says.
TEST(Kubernetes, InAPodAnElasticJobsStoppedNodeOnlyLeaves) {
  HostProbe pod = fakeHost();
  pod.env["KUBERNETES_SERVICE_HOST"] = "10.96.0.1";
  const Args elastic = {"--nnodes=2:3", "--rdzv-endpoint=job-worker-0:23456", "script.py"};
  EXPECT_TRUE(parse(elastic, pod).rdzv.stopOnlyNode);
  EXPECT_FALSE(parse(elastic).rdzv.stopOnlyNode);  // not in a pod
  EXPECT_FALSE(parse({"--nnodes=2:3", "--rdzv-endpoint=job-worker-0:23456",
                      "--rdzv-conf=stop_policy=job", "script.py"},
                     pod)
                   .rdzv.stopOnlyNode);
  // Its workers get 25 s between SIGTERM and SIGKILL, under the pod's 30 s of grace.
  EXPECT_EQ(parse(elastic, pod).agent.stopTimeout, std::chrono::seconds(25));
  EXPECT_EQ(parse(elastic).agent.stopTimeout, std::chrono::seconds(30));
  Args given = elastic;
  given.insert(given.begin(), "--stop-timeout=40");
  EXPECT_EQ(parse(given, pod).agent.stopTimeout, std::chrono::seconds(40));
  // A static job cannot go on without the node: it stops as a whole.
  EXPECT_FALSE(parse({"--nnodes=3", "--rdzv-endpoint=job-worker-0:23456", "script.py"}, pod)
                   .rdzv.stopOnlyNode);
}

// --- inside a Slurm allocation -----------------------------------------------------------

// The task of node `nodeId` in a step over node[1-4] of job 4242 (srun --ntasks-per-node=1).
HostProbe slurmHost(int nodeId, Environment extra = {}) {
  HostProbe host = fakeHost();
  host.env = {{"SLURM_JOB_ID", "4242"},
              {"SLURM_JOB_NODELIST", "node[1-4]"},
              {"SLURM_STEP_NODELIST", "node[1-4]"},
              {"SLURM_NNODES", "4"},
              {"SLURM_STEP_NUM_NODES", "4"},
              {"SLURM_NODEID", std::to_string(nodeId)},
              {"SLURM_STEP_ID", "0"},
              {"SLURM_CPUS_ON_NODE", "3"},
              {"SLURMD_NODENAME", "node" + std::to_string(nodeId + 1)}};
  for (auto& [key, value] : extra) host.env[key] = value;
  return host;
}

// A node put out names itself beside the batch script, where a requeued one reads the names.
TEST(ParseDlrunArgsInSlurm, TheNodesPutOutAreWrittenBesideTheBatchScript) {
  const auto file = [](Args args, HostProbe host) {
    return parse(std::move(args), std::move(host)).agent.quarantine.file;
  };
  EXPECT_EQ(file({"env"}, slurmHost(1, {{"SLURM_SUBMIT_DIR", "/home/ada/run"}})),
            std::filesystem::path("/home/ada/run/dlrun-exclude-4242"));
  EXPECT_EQ(file({"env"}, slurmHost(1)), std::filesystem::path("./dlrun-exclude-4242"));
  EXPECT_EQ(file({"--quarantine-file=/shared/bad", "env"}, slurmHost(1)),
            std::filesystem::path("/shared/bad"));
  EXPECT_EQ(file({"--no-slurm", "env"}, slurmHost(1)), std::nullopt);
  EXPECT_EQ(file({"env"}, fakeHost()), std::nullopt);  // outside Slurm, only where asked
  EXPECT_EQ(file({"--quarantine-file=bad-nodes", "env"}, fakeHost()),
            std::filesystem::path("bad-nodes"));
}

TEST(ParseDlrunArgsInSlurm, AStepNeedsNoOtherFlag) {
  const auto c = parse({"--nproc-per-node=4", "env"}, slurmHost(2));
  EXPECT_EQ(c.rdzvBackend, RdzvBackend::C10d);
  EXPECT_EQ(c.minNodes, 4);
  EXPECT_EQ(c.maxNodes, 4);
  EXPECT_EQ(c.rdzvId, "4242");
  EXPECT_EQ(c.rdzvEndpoint.text, "node1:29642");
  EXPECT_EQ(c.rdzvEndpoint.store(), (HostPort{"node1", 29642}));
  EXPECT_EQ(c.nodeRank, 2);
  EXPECT_EQ(c.nodeName, "node3");
  EXPECT_EQ(c.rdzv.isHost, false);
  EXPECT_EQ(c.agent.nprocPerNode, 4);
  EXPECT_TRUE(c.refuseLostNodes);  // a lost node's place goes to a spare for good
  // The store node 1 serves admits the step's nodes (and, with them, nobody else).
  EXPECT_EQ(c.jobHosts, (Args{"node1", "node2", "node3", "node4"}));
  EXPECT_TRUE(parse({"--rdzv-endpoint=store:29400", "env"}, slurmHost(2)).jobHosts.empty());
  EXPECT_EQ(parse({"env"}, slurmHost(0)).rdzv.isHost, true);
  EXPECT_FALSE(parse({"--no-slurm", "env"}, slurmHost(0)).refuseLostNodes);
}

TEST(ParseDlrunArgsInSlurm, AutoWorkersComeFromTheAllocation) {
  EXPECT_EQ(parse({"--nproc-per-node=auto", "env"}, slurmHost(0)).agent.nprocPerNode, 3);
  EXPECT_EQ(parse({"--nproc-per-node=auto", "env"}, slurmHost(0, {{"SLURM_GPUS_ON_NODE", "2"}}))
                .agent.nprocPerNode,
            2);
  // cpu: the machine's CPUs
  EXPECT_EQ(parse({"--nproc-per-node=cpu", "env"}, slurmHost(0)).agent.nprocPerNode, 8);
}

TEST(ParseDlrunArgsInSlurm, FlagsWin) {
  const auto c = parse({"--nnodes=2:3", "--rdzv-endpoint=store:5", "--rdzv-id=mine",
                        "--rdzv-conf=is_host=true", "env"},
                       slurmHost(3));
  EXPECT_EQ(c.minNodes, 2);
  EXPECT_EQ(c.maxNodes, 3);
  EXPECT_EQ(c.rdzvEndpoint.text, "store:5");
  EXPECT_EQ(c.rdzvId, "mine");
  EXPECT_EQ(c.rdzv.isHost, true);
  EXPECT_EQ(c.nodeRank, 3);  // a spare's hint may exceed the maximum
  EXPECT_EQ(parse({"--node-rank=1", "env"}, slurmHost(3)).nodeRank, 1);
  {
    ScopedEnv nnodes("PET_NNODES", "1:2");  // a PET_ variable counts as given
    EXPECT_EQ(parse({"env"}, slurmHost(3)).maxNodes, 2);
  }
  const std::string message = configError([] {
    parse({"--nnodes=2", "--node-rank=3", "env"}, slurmHost(3));
  });
  EXPECT_TRUE(contains(message, "--node-rank 3")) << message;
}

// Under etcd Slurm gives the job id, the node count and the node order, but no store to serve.
TEST(ParseDlrunArgsInSlurm, EtcdKeepsSlurmsJobNodesAndOrder) {
  for (const bool fromEnv : {false, true}) {
    SCOPED_TRACE(fromEnv);
    HostProbe host = slurmHost(2);
    Args args = {"--rdzv-backend=etcd", "env"};
    if (fromEnv)
      host.env["DLRUN_ETCD_ENDPOINTS"] = "etcd1:2379,etcd2";
    else
      args.insert(args.begin(), "--rdzv-endpoint=etcd1:2379,etcd2");
    const auto c = parse(args, host);
    EXPECT_EQ(c.rdzvBackend, RdzvBackend::Etcd);
    EXPECT_EQ(c.rdzvEndpoint.etcd().size(), 2u);
    EXPECT_EQ(c.rdzvId, "4242");
    EXPECT_EQ(c.minNodes, 4);
    EXPECT_EQ(c.maxNodes, 4);
    EXPECT_EQ(c.nodeRank, 2);  // the group-rank hint: ranks follow Slurm's node order
    EXPECT_EQ(c.nodeName, "node3");
    EXPECT_FALSE(c.rdzv.isHost);  // nobody serves the rendezvous
    EXPECT_TRUE(c.refuseLostNodes);
  }
  const std::string none = configError([] { parse({"--rdzv-backend=etcd", "env"}, slurmHost(0)); });
  EXPECT_TRUE(contains(none, "DLRUN_ETCD_ENDPOINTS")) << none;
}

TEST(ParseDlrunArgsInSlurm, StaticFlagsKeepTheirStoreAndTakeTheRank) {
  const auto c = parse({"--master-addr=head", "--master-port=5", "env"}, slurmHost(2));
  EXPECT_EQ(c.rdzvBackend, RdzvBackend::Static);
  EXPECT_EQ(c.masterAddr, "head");
  EXPECT_TRUE(c.rdzvEndpoint.text.empty());
  EXPECT_EQ(c.nodeRank, 2);
  EXPECT_EQ(c.maxNodes, 4);
}

TEST(ParseDlrunArgsInSlurm, SwitchedOffByFlagEnvironmentOrStandalone) {
  for (const auto& [args, host] :
       std::vector<std::pair<Args, HostProbe>>{{{"--no-slurm", "env"}, slurmHost(1)},
                                               {{"env"}, slurmHost(1, {{"DLRUN_SLURM", "0"}})},
                                               {{"--standalone", "env"}, slurmHost(1)}}) {
    SCOPED_TRACE(args.front());
    const auto c = parse(args, host);
    EXPECT_TRUE(c.singleNode());
    EXPECT_EQ(c.rdzvId, "none");
    EXPECT_FALSE(c.nodeRank);
    EXPECT_FALSE(c.nodeName);
  }
}

TEST(ParseDlrunArgsInSlurm, TheSlurmBackendRequiresAnAllocation) {
  const auto c = parse({"--rdzv-backend=slurm", "env"}, slurmHost(1, {{"DLRUN_SLURM", "0"}}));
  EXPECT_EQ(c.rdzvBackend, RdzvBackend::C10d);
  EXPECT_EQ(c.rdzvEndpoint.text, "node1:29642");
  // "slurm" is c10d from the allocation even beside the static flags, which it then ignores.
  const auto withStatic =
      parse({"--rdzv-backend=slurm", "--master-addr=head", "env"}, slurmHost(1));
  EXPECT_EQ(withStatic.rdzvBackend, RdzvBackend::C10d);
  EXPECT_EQ(withStatic.rdzvEndpoint.text, "node1:29642");
  for (const auto& [args, host, mention] : std::vector<std::tuple<Args, HostProbe, std::string>>{
           {{"--rdzv-backend=slurm", "env"}, fakeHost(), "SLURM_JOB_ID is unset"},
           {{"--rdzv-backend=slurm", "--no-slurm", "env"}, slurmHost(1), "--no-slurm"},
           {{"--rdzv-backend=slurm", "--standalone", "env"}, slurmHost(1), "--standalone"}}) {
    const std::string message = configError([&] { parse(args, host); });
    EXPECT_TRUE(contains(message, mention)) << message;
  }
}

TEST(ParseDlrunArgsInSlurm, MalformedVariablesAreConfigErrors) {
  const std::string message = configError([] {
    parse({"env"}, slurmHost(1, {{"SLURM_STEP_NODELIST", "node[3-1]"}}));
  });
  EXPECT_TRUE(contains(message, "SLURM_STEP_NODELIST='node[3-1]'")) << message;
}

// --- under mpirun ------------------------------------------------------------------------

// What mpirun -np 3 -x MASTER_ADDR=node1 sets for process `rank` (slurmHost's Open MPI twin).
HostProbe mpiHost(int rank, std::map<std::string, std::string> extra = {}) {
  HostProbe host = fakeHost();
  host.env = {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
              {"OMPI_COMM_WORLD_SIZE", "3"},
              {"OMPI_MCA_ess_base_jobid", "77"},
              {"PMIX_RANK", std::to_string(rank)},
              {"MASTER_ADDR", "node1"},
              {"MASTER_PORT", "29555"}};
  for (auto& [key, value] : extra) host.env[key] = value;
  return host;
}

TEST(ParseDlrunArgsUnderMpirun, TheWorldFromOpenMpiFlagsWin) {
  auto c = parse({"--nproc-per-node=4", "env"}, mpiHost(2));
  EXPECT_EQ(c.minNodes, 3);
  EXPECT_EQ(c.maxNodes, 3);
  EXPECT_EQ(c.nodeRank, 2);
  EXPECT_EQ(c.rdzvId, "mpi-77");
  EXPECT_EQ(c.rdzvEndpoint.text, "node1:29555");
  c = parse({"--nnodes=2", "--node-rank=0", "--rdzv-endpoint=store:5", "--rdzv-id=mine", "env"},
            mpiHost(2));
  EXPECT_EQ(c.maxNodes, 2);
  EXPECT_EQ(c.nodeRank, 0);
  EXPECT_EQ(c.rdzvId, "mine");
  EXPECT_EQ(c.rdzvEndpoint.text, "store:5");
  // mpirun inside a Slurm allocation: mpirun's world, not the allocation's.
  c = parse({"env"}, mpiHost(1, {{"SLURM_JOB_ID", "9"}, {"SLURM_NNODES", "8"}}));
  EXPECT_EQ(c.maxNodes, 3);
  EXPECT_EQ(
      parse({"env"}, mpiHost(1, {{"DLRUN_MPI", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}})).maxNodes, 1);
}

// --- --hostfile and --hosts --------------------------------------------------------------

TEST(ParseDlrunArgsHostfile, HostsFlagsAndConflicts) {
  auto c = parse({"--hosts=a:2,b", "--max-restarts=1", "--export", "X", "--ssh-port=2222",
                  "--ssh-command", "ssh -i k", "/jobs/train.py", "--lr", "1"});
  ASSERT_TRUE(c.hostLaunch);
  const HostLaunch& h = *c.hostLaunch;
  EXPECT_EQ(h.hosts.size(), 2u);
  EXPECT_EQ(c.maxNodes, 2);
  EXPECT_EQ(h.sshCommand, (Args{"ssh", "-i", "k"}));
  EXPECT_EQ(h.sshPort, 2222);
  EXPECT_EQ(h.exports, Args{"X"});
  EXPECT_EQ(h.agentFlags, Args{"--max-restarts=1"});
  EXPECT_EQ(h.nproc, "");  // each host's slots
  EXPECT_EQ(h.entry, (Args{"/jobs/train.py", "--lr", "1"}));
  EXPECT_EQ(h.addresses, (Args{"192.0.2.1", "192.0.2.1"}));  // resolved by the parser
  // A host that does not resolve is refused while parsing, not when the launch starts.
  EXPECT_EQ(configError([] {
              parse({"--hosts=a,me@b.invalid", "env"});
            }),
            "--hosts entry 2 'me@b.invalid': unknown host 'b.invalid'");
  EXPECT_EQ(parse({"--hosts=a", "--nproc-per-node=gpu", "env"}, fakeHost(2)).hostLaunch->nproc,
            "gpu");
  EXPECT_TRUE(contains(configError([] {
                         parse({"--hosts=a,b", "--nnodes=2", "env"});
                       }),
                       "--hostfile/--hosts and --nnodes conflict"));
  EXPECT_TRUE(contains(configError([] {
                         parse({"--hosts=a", "--standalone", "env"});
                       }),
                       "--standalone"));
  EXPECT_TRUE(contains(configError([] {
                         parse({"--hosts=a", "--hostfile=f", "env"});
                       }),
                       "give one of them"));
  EXPECT_TRUE(contains(configError([] {
                         parse({"--hosts=a:2", "--roles=ps:1,worker:1", "env"});
                       }),
                       "--roles does not work with --hostfile/--hosts yet"));
  EXPECT_EQ(configError([] {
              parse({"--hostfile=/no/such/file", "env"});
            }),
            "--hostfile: cannot read /no/such/file");
}

// --- settings from the environment -------------------------------------------------------

TEST(ParseDlrunArgs, ThePrefixTemplatesVariableIsItsDefault) {
  HostProbe host = fakeHost();
  host.env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] = "${role_name}${local_rank}:";
  EXPECT_EQ(parse({"env"}, host).agent.logLinePrefixTemplate, "${role_name}${local_rank}:");
  EXPECT_EQ(
      parse({"--log-line-prefix-template=<${rank}>", "env"}, host).agent.logLinePrefixTemplate,
      "<${rank}>");
}

TEST(ParseDlrunArgs, ShutdownTimeoutIsTheStopTimeoutAndItsVariableTheDefault) {
  EXPECT_EQ(parse({"--shutdown-timeout=3", "env"}).agent.stopTimeout, std::chrono::seconds(3));
  EXPECT_EQ(parse({"--shutdown_timeout", "4", "env"}).agent.stopTimeout, std::chrono::seconds(4));
  HostProbe host = fakeHost();
  host.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "7";
  EXPECT_EQ(parse({"env"}, host).agent.stopTimeout, std::chrono::seconds(7));
  EXPECT_EQ(parse({"--stop-timeout=2", "env"}, host).agent.stopTimeout, std::chrono::seconds(2));
  EXPECT_EQ(parse({"--shutdown-timeout=1", "env"}, host).agent.stopTimeout,
            std::chrono::seconds(1));
  host.env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "soon";
  const std::string bad = configError([&] { parse({"env"}, host); });
  EXPECT_TRUE(contains(bad, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT") && contains(bad, "soon")) << bad;
  const std::string both = configError([] {
    parse({"--stop-timeout=1", "--shutdown-timeout=2", "env"});
  });
  EXPECT_TRUE(contains(both, "--stop-timeout") && contains(both, "--shutdown-timeout")) << both;
}

TEST(ParseDlrunArgs, VirtualLocalRankNeedsADeviceForEachWorker) {
  EXPECT_FALSE(parse({"env"}).agent.virtualLocalRank);
  EXPECT_TRUE(parse({"--virtual-local-rank", "--nproc-per-node=4", "env"}).agent.virtualLocalRank);
  HostProbe host = fakeHost();
  host.env["CUDA_VISIBLE_DEVICES"] = "2,5";
  EXPECT_TRUE(
      parse({"--virtual_local_rank", "--nproc-per-node=2", "env"}, host).agent.virtualLocalRank);
  const std::string message = configError([&] {
    parse({"--virtual-local-rank", "--nproc-per-node=3", "env"}, host);
  });
  EXPECT_TRUE(contains(message, "--virtual-local-rank") && contains(message, "'2,5'") &&
              contains(message, "3 workers"))
      << message;
}

TEST(ParseDlrunArgs, PetVariablesAreDefaults) {
  ScopedEnv nproc("PET_NPROC_PER_NODE", "5");
  ScopedEnv restarts("PET_MAX_RESTARTS", "3");
  ScopedEnv role("PET_ROLE", "fromenv");
  ScopedEnv standalone("PET_STANDALONE", "1");
  auto c = parse({"env"});
  EXPECT_EQ(c.agent.nprocPerNode, 5);
  EXPECT_EQ(c.restarts.maxRestarts, 3);
  EXPECT_EQ(c.agent.role, "fromenv");
  EXPECT_TRUE(c.standalone);
  // The flag wins, in either spelling.
  EXPECT_EQ(parse({"--nproc-per-node", "2", "env"}).agent.nprocPerNode, 2);
  EXPECT_EQ(parse({"--nproc_per_node=2", "env"}).agent.nprocPerNode, 2);
  EXPECT_EQ(parse({"--max-restarts=0", "env"}).restarts.maxRestarts, 0);
}

TEST(ParseDlrunArgs, PetVariableWithABadValueIsAnError) {
  ScopedEnv nproc("PET_NPROC_PER_NODE", "0");
  const std::string message = configError([] { parse({"env"}); });
  EXPECT_TRUE(contains(message, "nproc")) << message;
}

TEST(ParseDlrunArgs, TfConfigInEverySpellingAndFromPet) {
  EXPECT_EQ(parse({"env"}).agent.tfConfig, agents::TfConfigMode::Auto);
  EXPECT_EQ(parse({"--tf-config=always", "env"}).agent.tfConfig, agents::TfConfigMode::Always);
  EXPECT_EQ(parse({"--tf_config", "never", "env"}).agent.tfConfig, agents::TfConfigMode::Never);
  ScopedEnv tf("PET_TF_CONFIG", "never");
  EXPECT_EQ(parse({"env"}).agent.tfConfig, agents::TfConfigMode::Never);
  EXPECT_EQ(parse({"--tf-config=auto", "env"}).agent.tfConfig, agents::TfConfigMode::Auto);
}

TEST(ParseDlrunArgs, TfConfigRejectsOtherValuesNamingTheFlag) {
  for (const char* bad : {"--tf-config=yes", "--tf-config=AUTO", "--tf_config=1"}) {
    const std::string message = configError([&] { parse({bad, "env"}); });
    EXPECT_TRUE(contains(message, "--tf-config")) << message;
    EXPECT_TRUE(contains(message, "auto, always or never")) << message;
  }
}

TEST(EnvironmentPython, ADlrunInAVenvOrCondaEnvironmentRunsItsInterpreter) {
  auto having = [](std::set<std::string> files) {
    return [files](const std::string& path) { return files.contains(path); };
  };
  EXPECT_EQ(environmentPython("/venv/bin", having({"/venv/pyvenv.cfg", "/venv/bin/python3"})),
            "/venv/bin/python3");
  EXPECT_EQ(environmentPython("/conda/bin", having({"/conda/conda-meta", "/conda/bin/python"})),
            "/conda/bin/python");
  // A system or build-tree dlrun: the python3 on PATH, as before.
  EXPECT_EQ(environmentPython("/usr/bin", having({"/usr/bin/python3"})), "");
  EXPECT_EQ(environmentPython("/venv/bin", having({"/venv/pyvenv.cfg"})), "");
  EXPECT_EQ(environmentPython("", having({})), "");
}

}  // namespace
}  // namespace dlrun::launcher
