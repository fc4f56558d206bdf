// The agents' command lines: what the launcher's environment and flags become on each host.
#include "remote/agent_command.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::remote {
namespace {

const Environment kEnv{{"PATH", "/usr/bin"},
                       {"PYTHONPATH", "/src"},
                       {"LD_LIBRARY_PATH", "/lib"},
                       {"CUDA_VISIBLE_DEVICES", "0,1"},
                       {"NCCL_DEBUG", "INFO"},
                       {"PET_MAX_RESTARTS", "2"},
                       {"DLRUN_LOG_LEVEL", "debug"},
                       {"HOME", "/root"},
                       {"SSH_AUTH_SOCK", "/tmp/a"},
                       {"SLURM_JOB_ID", "7"},
                       {"OMPI_COMM_WORLD_RANK", "0"},
                       {"MY_SETTING", "x"},
                       {"HOSTNAME", "head"},
                       {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5"},
                       {"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}};

TEST(ForwardedEnvironment, TheJobsVariablesOnly) {
  const Environment out = forwardedEnvironment(kEnv, {}, false);
  EXPECT_EQ(out, (Environment{{"PATH", "/usr/bin"},
                              {"PYTHONPATH", "/src"},
                              {"LD_LIBRARY_PATH", "/lib"},
                              {"CUDA_VISIBLE_DEVICES", "0,1"},
                              {"NCCL_DEBUG", "INFO"},
                              {"PET_MAX_RESTARTS", "2"},
                              {"DLRUN_LOG_LEVEL", "debug"},
                              {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "5"},
                              {"TORCHELASTIC_ENABLE_FILE_TIMER", "1"}}));
}

TEST(ForwardedEnvironment, ExportsAndExportAll) {
  Environment out = forwardedEnvironment(kEnv, {"MY_SETTING", "EXTRA=a b"}, false);
  EXPECT_EQ(out.at("MY_SETTING"), "x");
  EXPECT_EQ(out.at("EXTRA"), "a b");
  EXPECT_FALSE(out.contains("HOME"));
  out = forwardedEnvironment(kEnv, {}, true);
  EXPECT_EQ(out.at("MY_SETTING"), "x");
  for (const char* local :
       {"HOME", "SSH_AUTH_SOCK", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK", "HOSTNAME"})
    EXPECT_FALSE(out.contains(local)) << local;
  // Exported by name, a variable of this session goes all the same.
  EXPECT_EQ(forwardedEnvironment(kEnv, {"HOME"}, true).at("HOME"), "/root");
}

TEST(ForwardedEnvironment, BadExports) {
  EXPECT_THROW(forwardedEnvironment(kEnv, {"UNSET_HERE"}, false), ConfigError);
  EXPECT_THROW(forwardedEnvironment(kEnv, {"1BAD"}, false), ConfigError);
  EXPECT_THROW(forwardedEnvironment(kEnv, {"=x"}, false), ConfigError);
}

TEST(KeptFlags, DropsWhatTheLauncherSets) {
  EXPECT_EQ(keptFlags({"--hostfile",
                       "h.txt",
                       "--max-restarts=2",
                       "--ssh_port=2222",
                       "--export",
                       "A",
                       "--export-all",
                       "--nproc-per-node",
                       "4",
                       "--rdzv-conf",
                       "join_timeout=5",
                       "--rdzv_id=x",
                       "--log-dir",
                       "/l",
                       "--standalone",
                       "--use-local-rank-arg",
                       "--ssh-command",
                       "ssh -i k",
                       "--hosts=a,b",
                       "-m"}),
            (std::vector<std::string>{"--max-restarts=2", "--log-dir", "/l", "--use-local-rank-arg",
                                      "-m"}));
}

TEST(AgentCommand, EveryWordQuoted) {
  RemoteJob job{.dlrun = "/opt/dl run/dlrun",
                .workDir = "/home/o'neil",
                .env = {{"PATH", "/usr/bin"}, {"A", "it's"}},
                .flags = {"--max-restarts=2"},
                .nodes = 3,
                .backend = "c10d",
                .endpoint = "10.0.0.1:4000",
                .rdzvId = "job1",
                .rdzvConf = "is_host=false",
                .entry = {"train.py", "--lr", "0.1 x"}};
  EXPECT_EQ(agentCommand(job, 1, 4),
            "cd '/home/o'\\''neil' && exec env 'A=it'\\''s' 'PATH=/usr/bin' "
            "'/opt/dl run/dlrun' '--max-restarts=2' '--nnodes=3' '--node-rank=1' "
            "'--nproc-per-node=4' '--rdzv-backend=c10d' '--rdzv-endpoint=10.0.0.1:4000' "
            "'--rdzv-id=job1' '--rdzv-conf=is_host=false' --control-stdin -- 'train.py' '--lr' "
            "'0.1 x'");
  // Without slots one worker; --nproc-per-node as given wins; unsaid rendezvous flags stay out.
  job = {.dlrun = "/d", .workDir = "/w", .nodes = 2, .entry = {"t"}};
  EXPECT_EQ(agentCommand(job, 0, std::nullopt),
            "cd '/w' && exec env '/d' '--nnodes=2' '--node-rank=0' '--nproc-per-node=1' "
            "--control-stdin -- 't'");
  job.nproc = "gpu";
  EXPECT_NE(agentCommand(job, 0, 8).find("'--nproc-per-node=gpu'"), std::string::npos);
}

TEST(SshArgv, BatchModeAndPort) {
  EXPECT_EQ(splitCommand("  ssh -i /k  -F /dev/null "),
            (std::vector<std::string>{"ssh", "-i", "/k", "-F", "/dev/null"}));
  EXPECT_THROW(splitCommand("  "), ConfigError);
  EXPECT_EQ(sshArgv({"ssh", "-i", "/k"}, 2222, "node1", "cd / && exec x"),
            (std::vector<std::string>{"ssh", "-i", "/k", "-o", "BatchMode=yes", "-p", "2222",
                                      "node1", "cd / && exec x"}));
  EXPECT_EQ(sshArgv({"ssh"}, std::nullopt, "n", "c"),
            (std::vector<std::string>{"ssh", "-o", "BatchMode=yes", "n", "c"}));
}

}  // namespace
}  // namespace dlrun::remote
