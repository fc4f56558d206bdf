// The dlrun command line: each small parser and entry-point resolution on its own, then
// parseDlrunArgs end to end with a fake HostProbe (no real CPUs, GPUs, PATH or files are
// consulted, but for the executable bit of two files the tests write).
#include "launcher/launch_cli.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <map>
#include <set>

#include "common/error.h"
#include "launcher/entry_point.h"

namespace dlrun::launcher {
namespace {

using Args = std::vector<std::string>;

// The ConfigError message `fn` throws; fails the test when it throws nothing.
template <typename Fn>
std::string configError(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A machine with 8 CPUs, `gpus` GPUs, a PATH holding `env` and `torchrun`, and a few files.
HostProbe fakeHost(int gpus = 0, bool trainerBuilt = false) {
  HostProbe host;
  host.cpuCount = [] { return 8; };
  host.gpuCount = [gpus] { return gpus; };
  host.findOnPath = [](const std::string& name) -> std::optional<std::string> {
    static const std::map<std::string, std::string> path = {
        {"env", "/usr/bin/env"}, {"torchrun", "/usr/local/bin/torchrun"}};
    auto it = path.find(name);
    if (it == path.end()) return std::nullopt;
    return it->second;
  };
  std::set<std::string> files = {"script.py", "/jobs/train.py", "/jobs/tool"};
  if (trainerBuilt) files.insert("/opt/dlrun/bin/dlrun-train");
  host.fileExists = [files](const std::string& p) { return files.contains(p); };
  // Every host resolves but those under .invalid (RFC 6761), to one address of the test net.
  host.resolveHost = [](const std::string& name) -> std::optional<std::string> {
    if (name.ends_with(".invalid")) return std::nullopt;
    return "192.0.2.1";
  };
  // --numa-binding: local rank i on CPU 10 * mode + i, so a test sees the mode and the count.
  host.numaCpuSets = [](agents::NumaMode mode, int nproc) {
    std::vector<std::vector<int>> sets;
    for (int i = 0; i < nproc; ++i) sets.push_back({10 * static_cast<int>(mode) + i});
    return sets;
  };
  host.selfDir = "/opt/dlrun/bin";
  host.pythonExec = "/fake/python3";
  return host;
}

LaunchConfig parse(const Args& args, const HostProbe& host = fakeHost()) {
  auto parsed = parseDlrunArgs(args, host);
  EXPECT_FALSE(parsed.exitCode);
  return parsed.config;
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

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

// --- parseNnodes -------------------------------------------------------------------------

TEST(ParseNnodes, SingleNumberOrRange) {
  EXPECT_EQ(parseNnodes("1"), std::make_pair(1, 1));
  EXPECT_EQ(parseNnodes("4"), std::make_pair(4, 4));
  EXPECT_EQ(parseNnodes("2:4"), std::make_pair(2, 4));
  EXPECT_EQ(parseNnodes("3:3"), std::make_pair(3, 3));
}

TEST(ParseNnodes, RejectsBadValuesNamingTheFlag) {
  for (const std::string value : {"3:2", "0", "-1", "a", "", "1:2:3", ":2", "2:", "1.5", "2x"}) {
    SCOPED_TRACE(value);
    const std::string message = configError([&] { parseNnodes(value); });
    EXPECT_TRUE(contains(message, "--nnodes")) << message;
    EXPECT_FALSE(contains(message, "\n")) << message;
  }
}

// --- parseNprocPerNode -------------------------------------------------------------------

TEST(ParseNprocPerNode, NumbersAndMachineWords) {
  EXPECT_EQ(parseNprocPerNode("1", fakeHost()), 1);
  EXPECT_EQ(parseNprocPerNode("16", fakeHost()), 16);
  EXPECT_EQ(parseNprocPerNode("cpu", fakeHost(2)), 8);
  EXPECT_EQ(parseNprocPerNode("gpu", fakeHost(2)), 2);
  EXPECT_EQ(parseNprocPerNode("auto", fakeHost(2)), 2);
  EXPECT_EQ(parseNprocPerNode("auto", fakeHost(0)), 8);
}

TEST(ParseNprocPerNode, GpuWithoutGpusIsAnError) {
  const std::string message = configError([] { parseNprocPerNode("gpu", fakeHost(0)); });
  EXPECT_TRUE(contains(message, "--nproc-per-node")) << message;
  EXPECT_TRUE(contains(message, "GPU")) << message;
}

TEST(ParseNprocPerNode, RejectsBadValuesNamingTheFlag) {
  for (const std::string value : {"0", "-2", "x", "4x", "", "2.0", "GPU"}) {
    SCOPED_TRACE(value);
    const std::string message = configError([&] { parseNprocPerNode(value, fakeHost()); });
    EXPECT_TRUE(contains(message, "--nproc-per-node")) << message;
    EXPECT_FALSE(contains(message, "\n")) << message;
  }
}

// --- parseStreams ------------------------------------------------------------------------

TEST(ParseStreams, OneValueForAll) {
  for (int v = 0; v <= 3; ++v) {
    auto s = parseStreams("--redirects", std::to_string(v));
    EXPECT_EQ(s.all, static_cast<agents::Streams>(v));
    EXPECT_TRUE(s.byRank.empty());
    EXPECT_EQ(s.forRank(5), static_cast<agents::Streams>(v));
  }
}

TEST(ParseStreams, PerRankPairs) {
  auto s = parseStreams("--tee", "0:1,2:3");
  EXPECT_EQ(s.all, agents::Streams::None);
  EXPECT_EQ(s.forRank(0), agents::Streams::Out);
  EXPECT_EQ(s.forRank(1), agents::Streams::None);
  EXPECT_EQ(s.forRank(2), agents::Streams::Both);
}

TEST(ParseStreams, RejectsBadValuesNamingTheGivenFlag) {
  for (const std::string value : {"4", "-1", "a", "0:4", "-1:1", "0:1,x", "0:", ":1", "0:1:2"}) {
    SCOPED_TRACE(value);
    const std::string message = configError([&] { parseStreams("--tee", value); });
    EXPECT_TRUE(contains(message, "--tee")) << message;
    EXPECT_TRUE(contains(message, value)) << message;
  }
}

// --- parseRdzvConf -----------------------------------------------------------------------

TEST(ParseRdzvConf, KeyValuePairs) {
  EXPECT_TRUE(parseRdzvConf("").empty());
  auto conf = parseRdzvConf("timeout=900,join_timeout=30,url=a=b");
  EXPECT_EQ(conf.size(), 3u);
  EXPECT_EQ(conf["timeout"], "900");
  EXPECT_EQ(conf["join_timeout"], "30");
  EXPECT_EQ(conf["url"], "a=b");  // only the first '=' separates
}

TEST(ParseRdzvConf, RejectsMalformedItems) {
  for (const std::string value : {"timeout", "=5", "a=1,,b=2", "a=1,b", ","}) {
    SCOPED_TRACE(value);
    const std::string message = configError([&] { parseRdzvConf(value); });
    EXPECT_TRUE(contains(message, "--rdzv-conf")) << message;
  }
}

// --- parseRanksFilter --------------------------------------------------------------------

TEST(ParseRanksFilter, Lists) {
  EXPECT_EQ(parseRanksFilter("1"), std::set<int>{1});
  EXPECT_EQ(parseRanksFilter("0,2,3"), (std::set<int>{0, 2, 3}));
  EXPECT_EQ(parseRanksFilter("3,3,0"), (std::set<int>{0, 3}));
}

TEST(ParseRanksFilter, RejectsBadLists) {
  for (const std::string value : {"", "a", "-1", "1,,2", "1,", "0-3", "1 2"}) {
    SCOPED_TRACE(value);
    const std::string message = configError([&] { parseRanksFilter(value); });
    EXPECT_TRUE(contains(message, "--local-ranks-filter")) << message;
  }
}

// --- parseDlrunArgs: entry points --------------------------------------------------------

TEST(ParseDlrunArgs, PyScriptRunsUnderPythonUnbuffered) {
  auto c = parse({"script.py", "--lr", "0.1"});
  EXPECT_EQ(c.agent.command, (Args{"/fake/python3", "-u", "script.py", "--lr", "0.1"}));
  EXPECT_EQ(c.entrypoint, "script.py");
  c = parse({"/jobs/train.py"});
  EXPECT_EQ(c.agent.command, (Args{"/fake/python3", "-u", "/jobs/train.py"}));
}

TEST(ParseDlrunArgs, Module) {
  for (const std::string flag : {"-m", "--module"}) {
    auto c = parse({flag, "pkg.train", "--epochs", "2"});
    EXPECT_EQ(c.agent.command, (Args{"/fake/python3", "-u", "-m", "pkg.train", "--epochs", "2"}));
    EXPECT_EQ(c.entrypoint, "pkg.train");
  }
}

TEST(ParseDlrunArgs, NoPythonExecutesTheFileItself) {
  for (const std::string flag : {"--no-python", "--no_python"}) {
    auto c = parse({flag, "/jobs/train.py", "x"});
    EXPECT_EQ(c.agent.command, (Args{"/jobs/train.py", "x"}));
  }
  auto c = parse({"--no-python", "env", "A=1"});
  EXPECT_EQ(c.agent.command, (Args{"/usr/bin/env", "A=1"}));
}

TEST(ParseDlrunArgs, NameOnPathRunsAsFound) {
  auto c = parse({"env", "FOO=1", "printenv"});
  EXPECT_EQ(c.agent.command, (Args{"/usr/bin/env", "FOO=1", "printenv"}));
  EXPECT_EQ(c.entrypoint, "env");
}

TEST(ParseDlrunArgs, MissingEntryPointIsAnErrorNamingIt) {
  for (const std::string entry : {"no-such-program", "/nowhere/train.py", "missing.py"}) {
    SCOPED_TRACE(entry);
    const std::string message = configError([&] { parse({entry}); });
    EXPECT_TRUE(contains(message, entry)) << message;
  }
  const std::string none = configError([] { parse({"--nproc-per-node=2"}); });
  EXPECT_TRUE(contains(none, "entry point")) << none;
  EXPECT_TRUE(contains(configError([] { parse({}); }), "entry point"));
}

TEST(ParseDlrunArgs, BundledTrainerSitsBesideDlrun) {
  auto c = parse({"train", "--epochs", "1"}, fakeHost(0, /*trainerBuilt=*/true));
  EXPECT_EQ(c.agent.command, (Args{"/opt/dlrun/bin/dlrun-train", "--epochs", "1"}));
  const std::string message = configError([] { parse({"train"}, fakeHost(0, false)); });
  EXPECT_TRUE(contains(message, "/opt/dlrun/bin/dlrun-train")) << message;
  EXPECT_FALSE(contains(message, "\n")) << message;
}

TEST(ParseDlrunArgs, EverythingAfterTheEntryPointBelongsToTheWorker) {
  auto c = parse({"--nproc-per-node=2", "script.py", "--nproc-per-node=9", "-m", "--standalone"});
  EXPECT_EQ(c.agent.nprocPerNode, 2);
  EXPECT_FALSE(c.standalone);
  EXPECT_EQ(c.agent.command,
            (Args{"/fake/python3", "-u", "script.py", "--nproc-per-node=9", "-m", "--standalone"}));
  c = parse({"--", "env"});
  EXPECT_EQ(c.agent.command, (Args{"/usr/bin/env"}));
}

// --- resolveCommand on its own ------------------------------------------------------------

TEST(ResolveCommand, EachFormOfEntryPoint) {
  const HostProbe host = fakeHost(0, /*trainerBuilt=*/true);
  EXPECT_EQ(resolveCommand("script.py", {"a"}, {}, host),
            (Args{"/fake/python3", "-u", "script.py", "a"}));
  EXPECT_EQ(resolveCommand("pkg.mod", {}, {.module = true}, host),
            (Args{"/fake/python3", "-u", "-m", "pkg.mod"}));
  EXPECT_EQ(resolveCommand("/jobs/train.py", {}, {.noPython = true}, host),
            (Args{"/jobs/train.py"}));
  EXPECT_EQ(resolveCommand("torchrun", {"x"}, {}, host), (Args{"/usr/local/bin/torchrun", "x"}));
  EXPECT_EQ(resolveCommand("train", {}, {}, host), (Args{"/opt/dlrun/bin/dlrun-train"}));
  // With --no-python, "train" is a program like any other, not the bundled trainer.
  EXPECT_TRUE(contains(configError([&] { resolveCommand("train", {}, {.noPython = true}, host); }),
                       "'train' not found"));
}

TEST(ResolveCommand, AnExistingFileIsExecutedOrRunUnderPython) {
  const std::string dir = ::testing::TempDir();
  const std::string program = dir + "/dlrun_entry_point_test_program";
  const std::string text = dir + "/dlrun_entry_point_test_text";
  for (const auto& [path, mode] : {std::pair{program, 0755}, std::pair{text, 0644}}) {
    FILE* file = std::fopen(path.c_str(), "w");
    ASSERT_TRUE(file);
    std::fclose(file);
    ::chmod(path.c_str(), mode);
  }
  EXPECT_TRUE(isExecutableFile(program));
  EXPECT_FALSE(isExecutableFile(text));
  EXPECT_FALSE(isExecutableFile(dir));  // a directory is no program
  HostProbe host = fakeHost();
  host.fileExists = [](const std::string&) { return true; };
  EXPECT_EQ(resolveCommand(program, {}, {}, host), (Args{program}));
  EXPECT_EQ(resolveCommand(text, {}, {}, host), (Args{"/fake/python3", "-u", text}));
  EXPECT_EQ(resolveCommand(text, {}, {.noPython = true}, host), (Args{text}));
  std::remove(program.c_str());
  std::remove(text.c_str());
}

// --- parseDlrunArgs: flags ---------------------------------------------------------------

TEST(ParseDlrunArgs, Defaults) {
  auto c = parse({"env"});
  EXPECT_EQ(c.minNodes, 1);
  EXPECT_EQ(c.maxNodes, 1);
  EXPECT_EQ(c.agent.nprocPerNode, 1);
  EXPECT_FALSE(c.nodeRank);
  EXPECT_FALSE(c.standalone);
  EXPECT_EQ(c.restarts.maxRestarts, 0);
  EXPECT_EQ(c.agent.role, "default");
  EXPECT_FALSE(c.agent.logDir);
  EXPECT_EQ(c.agent.redirects.all, agents::Streams::None);
  EXPECT_EQ(c.agent.tee.all, agents::Streams::None);
  EXPECT_FALSE(c.agent.localRanksFilter);
  EXPECT_EQ(c.agent.logLinePrefixTemplate, "[${rank}]:");
  EXPECT_FALSE(c.masterPort);
  EXPECT_EQ(c.agent.stopTimeout, std::chrono::seconds(30));
  EXPECT_TRUE(c.singleNode());
}

TEST(ParseDlrunArgs, ReadsEveryFlag) {
  auto c = parse({"--nnodes=1",
                  "--nproc-per-node=3",
                  "--node-rank=0",
                  "--rdzv-backend=c10d",
                  "--rdzv-endpoint=127.0.0.1:29400",
                  "--rdzv-id=job7",
                  "--rdzv-conf=join_timeout=60",
                  "--max-restarts=4",
                  "--monitor-interval=5",
                  "--stop-timeout=1.5",
                  "--role=trainer",
                  "--log-dir=/logs",
                  "-r",
                  "3",
                  "-t",
                  "0:1",
                  "--local-ranks-filter=0,2",
                  "--log-line-prefix-template=<${rank}>",
                  "--local-addr=127.0.0.2",
                  "--master-addr=127.0.0.3",
                  "--master-port=1234",
                  "--console-format=torchrun",
                  "env"});
  EXPECT_EQ(c.agent.nprocPerNode, 3);
  EXPECT_EQ(c.rdzvBackend, RdzvBackend::C10d);
  EXPECT_EQ(c.rdzvEndpoint.text, "127.0.0.1:29400");
  EXPECT_EQ(c.rdzvEndpoint.store(), (HostPort{"127.0.0.1", 29400}));
  EXPECT_EQ(c.rdzvId, "job7");
  EXPECT_EQ(c.rdzv.joinTimeout, std::chrono::seconds(60));
  EXPECT_EQ(c.restarts.maxRestarts, 4);
  EXPECT_EQ(c.agent.stopTimeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(c.agent.role, "trainer");
  EXPECT_EQ(c.agent.logDir, "/logs");
  EXPECT_EQ(c.agent.redirects.all, agents::Streams::Both);
  EXPECT_EQ(c.agent.tee.forRank(0), agents::Streams::Out);
  EXPECT_EQ(c.agent.tee.forRank(1), agents::Streams::None);
  EXPECT_EQ(c.agent.localRanksFilter, (std::set<int>{0, 2}));
  EXPECT_EQ(c.agent.logLinePrefixTemplate, "<${rank}>");
  EXPECT_EQ(c.localAddr, "127.0.0.2");
  EXPECT_EQ(c.masterAddr, "127.0.0.3");
  EXPECT_EQ(c.masterPort, 1234);
  EXPECT_EQ(c.agent.command, (Args{"/usr/bin/env"}));
  EXPECT_EQ(c.agent.consoleFormat, agents::ConsoleFormat::Torchrun);
}

// torchrun's console: only teed streams prefixed, by default with the role and local rank.
TEST(ParseDlrunArgs, ConsoleFormatAndItsDefaultPrefix) {
  EXPECT_EQ(parse({"env"}).agent.consoleFormat, agents::ConsoleFormat::Dlrun);
  EXPECT_EQ(parse({"env"}).agent.logLinePrefixTemplate, "[${rank}]:");
  auto c = parse({"--console-format", "torchrun", "env"});
  EXPECT_EQ(c.agent.logLinePrefixTemplate, "[${role_name}${local_rank}]:");
  c = parse({"--console_format=torchrun", "--log-line-prefix-template=<${rank}>", "env"});
  EXPECT_EQ(c.agent.logLinePrefixTemplate, "<${rank}>");
  {
    ScopedEnv env("PET_CONSOLE_FORMAT", "torchrun");
    EXPECT_EQ(parseDlrunArgs({"env"}, fakeHost()).config.agent.consoleFormat,
              agents::ConsoleFormat::Torchrun);
  }
  const std::string message = configError([] { parse({"--console-format=raw", "env"}); });
  EXPECT_TRUE(contains(message, "--console-format")) << message;
  EXPECT_TRUE(contains(message, "'raw'")) << message;
}

TEST(ParseDlrunArgs, NumaBindingTakesEachRanksCpusFromTheMachine) {
  using Sets = std::vector<std::vector<int>>;
  EXPECT_TRUE(parse({"env"}).agent.cpuBinding.empty());
  EXPECT_EQ(parse({"--numa-binding=node", "--nproc-per-node=2", "env"}).agent.cpuBinding,
            (Sets{{0}, {1}}));
  EXPECT_EQ(parse({"--numa_binding", "core-complex", "env"}).agent.cpuBinding, (Sets{{30}}));
  EXPECT_EQ(parse({"--numa-binding=socket", "env"}).agent.cpuBinding, (Sets{{10}}));
  EXPECT_EQ(parse({"--numa-binding=exclusive", "env"}).agent.cpuBinding, (Sets{{20}}));
  // A --hostfile launch leaves the binding to each host's agent.
  EXPECT_TRUE(parse({"--numa-binding=node", "--hosts=a:2", "env"}).agent.cpuBinding.empty());
  for (const std::string value : {"numa", "Node", "node,socket"}) {
    const std::string message = configError([&] { parse({"--numa-binding=" + value, "env"}); });
    EXPECT_TRUE(contains(message, "--numa-binding: '" + value + "'")) << message;
  }
}

TEST(ParseDlrunArgs, StoreProxyIsOnFromSixtyFourWorkersOrAsAsked) {
  EXPECT_FALSE(parse({"--nproc-per-node=63", "env"}).agent.storeProxy);
  EXPECT_TRUE(parse({"--nproc-per-node=64", "env"}).agent.storeProxy);
  EXPECT_TRUE(parse({"--store-proxy=on", "env"}).agent.storeProxy);
  EXPECT_FALSE(parse({"--store-proxy=off", "--nproc-per-node=64", "env"}).agent.storeProxy);
  const std::string message = configError([] { parse({"--store-proxy=yes", "env"}); });
  EXPECT_TRUE(contains(message, "--store-proxy: 'yes'")) << message;
}

TEST(ParseDlrunArgs, StoreAllowAdmitsItsNetworksAndLoopback) {
  EXPECT_TRUE(parse({"env"}).storeAllow.empty());
  const AdmissionRule rule = parse({"--store-allow=10.9.0.0/16,fd00::/8", "env"}).storeAllow;
  for (const char* admitted : {"10.9.3.4", "fd00::1", "127.0.0.1", "::1"})
    EXPECT_TRUE(rule.allows(*AdmissionRule::address(admitted))) << admitted;
  for (const char* refused : {"10.8.0.1", "127.0.0.2", "192.0.2.1"})
    EXPECT_FALSE(rule.allows(*AdmissionRule::address(refused))) << refused;
  const std::string message = configError([] { parse({"--store-allow=node1", "env"}); });
  EXPECT_TRUE(contains(message, "--store-allow")) << message;
}

// torchrun's --run-path: the entry point is a Python script whatever -m and --no-python say.
TEST(ParseDlrunArgs, RunPathRunsAPythonScriptOverModuleAndNoPython) {
  for (const Args& flags :
       {Args{"--run-path"}, Args{"--run-path", "-m"}, Args{"--run_path", "--no-python"},
        Args{"-m", "--no-python", "--run-path"}}) {
    Args args = flags;
    args.insert(args.end(), {"/jobs/tool", "a", "b"});
    EXPECT_EQ(parse(args).agent.command, (Args{"/fake/python3", "-u", "/jobs/tool", "a", "b"}));
  }
  const std::string message = configError([] { parse({"--run-path", "env"}); });
  EXPECT_TRUE(contains(message, "--run-path")) << message;
  EXPECT_TRUE(contains(message, "'env'")) << message;
}

// torchrun's argparse: a flag given again takes the last value (wrappers append overrides).
TEST(ParseDlrunArgs, AFlagGivenTwiceTakesItsLastValue) {
  auto c = parse({"--nproc-per-node=2", "--nproc_per_node", "5", "--max-restarts=1",
                  "--max-restarts=3", "--rdzv-conf=join_timeout=5", "--rdzv-conf=join_timeout=9",
                  "--standalone", "--standalone", "env"});
  EXPECT_EQ(c.agent.nprocPerNode, 5);
  EXPECT_EQ(c.restarts.maxRestarts, 3);
  EXPECT_EQ(c.rdzv.joinTimeout, std::chrono::seconds(9));
  EXPECT_TRUE(c.standalone);
}

// argparse's abbreviations: a unique prefix of a long flag is that flag; the entry point's own
// arguments are never touched.
TEST(ParseDlrunArgs, AUniquePrefixOfAFlagIsThatFlag) {
  auto c = parse({"--standa", "--max-rest", "2", "--nproc=3", "--rdzv-i", "job", "--role", "r",
                  "env", "--standa", "--max-rest"});
  EXPECT_TRUE(c.standalone);
  EXPECT_EQ(c.restarts.maxRestarts, 2);
  EXPECT_EQ(c.agent.nprocPerNode, 3);
  EXPECT_EQ(c.rdzvId, "job");
  EXPECT_EQ(c.agent.role, "r");  // --role is a flag of its own, not a prefix of --roles
  EXPECT_EQ(c.agent.command, (Args{"/usr/bin/env", "--standa", "--max-rest"}));
  const std::string message = configError([] { parse({"--no", "env"}); });
  EXPECT_TRUE(contains(message, "ambiguous flag --no")) << message;
  EXPECT_TRUE(contains(message, "--no-python")) << message;
  EXPECT_TRUE(contains(message, "--no-slurm")) << message;
  EXPECT_FALSE(contains(message, "\n")) << message;
}

TEST(ParseDlrunArgs, UnderscoredSpellings) {
  auto c = parse({"--nproc_per_node=3", "--max_restarts", "2", "--rdzv_backend=c10d", "--rdzv_id=x",
                  "--log_dir=/l", "--local_ranks_filter=1", "--stop_timeout=2", "--master_port=99",
                  "env"});
  EXPECT_EQ(c.agent.nprocPerNode, 3);
  EXPECT_EQ(c.restarts.maxRestarts, 2);
  EXPECT_EQ(c.rdzvBackend, RdzvBackend::C10d);
  EXPECT_EQ(c.rdzvId, "x");
  EXPECT_EQ(c.agent.logDir, "/l");
  EXPECT_EQ(c.agent.localRanksFilter, std::set<int>{1});
  EXPECT_EQ(c.agent.stopTimeout, std::chrono::seconds(2));
  EXPECT_EQ(c.masterPort, 99);
}

// The flags newer torchrun versions added.
TEST(ParseDlrunArgs, StartMethodIsAcceptedAndChecked) {
  for (const char* method : {"spawn", "fork", "forkserver"})
    parse({std::string("--start-method=") + method, "env"});
  parse({"--start_method", "fork", "env"});
  const std::string message = configError([] { parse({"--start-method=thread", "env"}); });
  EXPECT_TRUE(contains(message, "--start-method") && contains(message, "thread")) << message;
}

TEST(ParseDlrunArgs, TorchrunsPluginFlagsTakeTheBuiltInNames) {
  for (const char* handler : {"null", "console", "dynamic_rendezvous"})
    EXPECT_NO_THROW(parse({std::string("--event-log-handler=") + handler, "env"}));
  EXPECT_NO_THROW(parse({"--logs-specs", "default", "env"}));
  EXPECT_EQ(configError([] {
              parse({"--event-log-handler=mine", "env"});
            }),
            "--event-log-handler: 'mine' is not null, console or dynamic_rendezvous (plug-ins "
            "are torch's alone)");
  EXPECT_TRUE(contains(configError([] {
                         parse({"--logs-specs=custom", "env"});
                       }),
                       "--logs-specs: 'custom' is not default"));
}

TEST(ParseFilterList, CommasCutAndDoubledCommasEscape) {
  EXPECT_EQ(parseFilterList("apple,orange"), (Args{"apple", "orange"}));
  EXPECT_EQ(parseFilterList("a,,pple"), Args{"a,pple"});
  EXPECT_EQ(parseFilterList(""), Args{""});  // one empty needle: every line
  EXPECT_EQ(parseFilterList("x,"), (Args{"x", ""}));
  const LaunchConfig c = parse({"--duplicate-stdout-filters=a,b", "env"});
  EXPECT_EQ(c.agent.duplicateStdoutFilters, (Args{"a", "b"}));
  EXPECT_TRUE(c.agent.duplicateStderrFilters.empty());  // not given: no file
}

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

TEST(ParseDlrunArgs, SignalsToHandleInTheOrderGivenUnsetByDefault) {
  EXPECT_FALSE(parse({"env"}).agent.signalsToHandle);
  EXPECT_EQ(
      parse({"--signals-to-handle=SIGTERM,SIGUSR1,USR2,SIGTERM", "env"}).agent.signalsToHandle,
      (std::vector<int>{SIGTERM, SIGUSR1, SIGUSR2}));
  EXPECT_EQ(parse({"--signals_to_handle", "sigint,3", "env"}).agent.signalsToHandle,
            (std::vector<int>{SIGINT, SIGQUIT}));
}

TEST(ParseSignalsToHandle, RefusesWhatNoJobCanStopOnNamingIt) {
  const std::vector<std::pair<std::string, std::string>> cases{
      {"", "names no signal"},        {"SIGTERM,", "''"},
      {"SIGTERN", "SIGTERN"},         {"SIGKILL", "SIGKILL"},
      {"SIGTERM,SIGSTOP", "SIGSTOP"}, {"SIGCHLD", "SIGCHLD"},
      {"SIGSEGV", "SIGSEGV"},         {"SIGABRT", "SIGABRT"}};
  for (const auto& [value, mention] : cases) {
    const std::string message = configError([&] { parseSignalsToHandle(value); });
    EXPECT_TRUE(contains(message, "--signals-to-handle") && contains(message, mention))
        << value << ": " << message;
  }
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

TEST(ParseDlrunArgs, StandaloneUsesItsOwnStore) {
  auto c = parse({"--standalone", "--nproc-per-node=4", "env"});
  EXPECT_TRUE(c.standalone);
  EXPECT_EQ(c.rdzvBackend, RdzvBackend::C10d);
  EXPECT_TRUE(c.singleNode());
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

TEST(ParseDlrunArgs, HangWatchingIsOffUnlessATimeoutIsGiven) {
  EXPECT_FALSE(parse({"env"}).agent.hang);
  auto c = parse({"--hang-timeout=2.5", "env"});
  ASSERT_TRUE(c.agent.hang);
  EXPECT_EQ(c.agent.hang->timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(c.agent.hang->action, agents::HangAction::Restart);
  EXPECT_EQ(parse({"--hang_timeout", "1", "--hang-action=report", "env"}).agent.hang->action,
            agents::HangAction::Report);
  {
    ScopedEnv timeout("PET_HANG_TIMEOUT", "30");
    ScopedEnv action("PET_HANG_ACTION", "exit");
    c = parse({"env"});
    ASSERT_TRUE(c.agent.hang);
    EXPECT_EQ(c.agent.hang->timeout, std::chrono::seconds(30));
    EXPECT_EQ(c.agent.hang->action, agents::HangAction::Exit);
    EXPECT_FALSE(parse({"--hang-timeout=0", "env"}).agent.hang);  // the flag wins: off
  }
  std::string message = configError([&] {
    parse({"--hang-timeout=1", "--hang-action=kill", "env"});
  });
  EXPECT_TRUE(contains(message, "--hang-action")) << message;
  EXPECT_TRUE(contains(message, "report, restart or exit")) << message;
  message = configError([&] { parse({"--hang-action=exit", "env"}); });
  EXPECT_TRUE(contains(message, "needs --hang-timeout")) << message;
  message = configError([&] { parse({"--hang-timeout=-1", "env"}); });
  EXPECT_TRUE(contains(message, "--hang-timeout")) << message;
}

TEST(ParseDlrunArgs, NodeRankAndNnodes) {
  auto c =
      parse({"--nnodes=2:4", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "--node-rank=3", "env"});
  EXPECT_EQ(c.minNodes, 2);
  EXPECT_EQ(c.maxNodes, 4);
  EXPECT_EQ(c.nodeRank, 3);
  EXPECT_FALSE(c.singleNode());
}

// Each bad command line is a ConfigError naming the flag, on one line.
TEST(ParseDlrunArgs, InvalidInputNamesTheFlag) {
  const std::vector<std::pair<Args, std::vector<std::string>>> cases = {
      {{"--nproc-per-node=0", "env"}, {"--nproc-per-node", "0"}},
      {{"--nnodes=3:2", "env"}, {"--nnodes"}},
      {{"--rdzv-backend=bogus", "env"}, {"--rdzv-backend", "bogus"}},
      {{"--rdzv-backend=etcd-v2", "env"}, {"--rdzv-backend=etcd-v2", "v3"}},
      {{"--rdzv-conf=novalue", "env"}, {"--rdzv-conf", "novalue"}},
      {{"--master-port=abc", "env"}, {"--master-port", "abc"}},
      {{"--master-port=65536", "env"}, {"--master-port"}},
      {{"--max-restarts=-1", "env"}, {"--max-restarts"}},
      {{"--node-rank=2", "--nnodes=2", "env"}, {"--node-rank"}},
      {{"--standalone", "--nnodes=2", "env"}, {"--standalone"}},
      {{"--nnodes=1:2", "--rdzv-backend=static", "env"}, {"--nnodes"}},  // elastic needs c10d
      {{"-m", "--no-python", "env"}, {"--module", "--no-python"}},
      {{"--redirects=9", "env"}, {"--redirects", "9"}},
      {{"--tee=x", "env"}, {"--tee", "x"}},
      {{"--local-ranks-filter=a", "env"}, {"--local-ranks-filter", "a"}},
  };
  for (const auto& [args, mentions] : cases) {
    SCOPED_TRACE(args.front());
    const std::string message = configError([&] { parse(args); });
    for (const auto& word : mentions) EXPECT_TRUE(contains(message, word)) << message;
    EXPECT_FALSE(contains(message, "\n")) << message;
  }
}

// HOST:PORT with a port that is not a number is bad input even on one node (torchrun refuses
// it too), not something to ignore until a multi-node run trips over it.
TEST(ParseDlrunArgs, RdzvEndpointWithANonNumericPortIsRejected) {
  for (const std::string endpoint : {"127.0.0.1:abc", "host:", "[::1]:x", "h:70000"}) {
    SCOPED_TRACE(endpoint);
    const std::string message = configError([&] {
      parse({"--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint, "env"});
    });
    EXPECT_TRUE(contains(message, "--rdzv-endpoint")) << message;
  }
  // Host alone, host:port and bracketed IPv6 are fine.
  for (const std::string endpoint : {"127.0.0.1", "127.0.0.1:29400", "node1:29400", "[::1]:29400"})
    EXPECT_EQ(
        parse({"--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint, "env"}).rdzvEndpoint.text,
        endpoint);
  // Without a port, torchrun's.
  EXPECT_EQ(parse({"--nnodes=2", "--rdzv-endpoint=[::1]", "env"}).rdzvEndpoint.store(),
            (HostPort{"::1", kDefaultRdzvPort}));
}

TEST(ParseDlrunArgs, HelpAndVersionEndWithZero) {
  for (const std::string flag : {"--help", "--version"}) {
    testing::internal::CaptureStdout();
    auto parsed = parseDlrunArgs({flag}, fakeHost());
    const std::string out = testing::internal::GetCapturedStdout();
    EXPECT_EQ(parsed.exitCode, 0);
    EXPECT_FALSE(out.empty());
  }
}

// --- parseDlrunArgs: the rendezvous backend ----------------------------------------------

TEST(ParseRdzvBackend, TheSpellingsDlrunHas) {
  EXPECT_EQ(parseRdzvBackend("static").backend, RdzvBackend::Static);
  EXPECT_FALSE(parseRdzvBackend("static").slurm);
  EXPECT_EQ(parseRdzvBackend("c10d").backend, RdzvBackend::C10d);
  EXPECT_FALSE(parseRdzvBackend("c10d").slurm);
  EXPECT_EQ(parseRdzvBackend("slurm").backend, RdzvBackend::C10d);
  EXPECT_TRUE(parseRdzvBackend("slurm").slurm);
  EXPECT_EQ(parseRdzvBackend("etcd").backend, RdzvBackend::Etcd);
  EXPECT_EQ(parseRdzvBackend("etcd-v3").backend, RdzvBackend::Etcd);
  EXPECT_FALSE(parseRdzvBackend("etcd").slurm);
  for (const std::string value : {"", "C10D", "bogus", "etcd2"}) {
    SCOPED_TRACE(value);
    const std::string message = configError([&] { parseRdzvBackend(value); });
    EXPECT_TRUE(contains(message, "--rdzv-backend")) << message;
  }
}

// torchrun's etcd-v2 backend is refused when the flags are read, not when the nodes meet.
TEST(ParseDlrunArgs, EtcdV2IsRefusedAtParseTime) {
  for (const Args& args :
       {Args{"--rdzv-backend=etcd-v2", "env"},
        Args{"--nnodes=2", "--rdzv-backend=etcd-v2", "--rdzv-endpoint=h:1", "env"}}) {
    const std::string message = configError([&] { parse(args); });
    EXPECT_EQ(message,
              "--rdzv-backend=etcd-v2: dlrun speaks etcd's v3 API; use "
              "--rdzv-backend=etcd");
  }
  ScopedEnv backend("PET_RDZV_BACKEND", "etcd-v2");
  EXPECT_TRUE(contains(configError([] { parse({"env"}); }), "--rdzv-backend=etcd-v2"));
}

// --- the etcd backend ------------------------------------------------------------------------

TEST(ParseDlrunArgs, EtcdTakesAnEndpointListWithEtcdsDefaultPort) {
  const auto c = parse({"--nnodes=2:3", "--rdzv-backend=etcd",
                        "--rdzv-endpoint=e1,10.0.0.2:2380,[fd00::3]", "--rdzv-id=j", "env"});
  EXPECT_EQ(c.rdzvBackend, RdzvBackend::Etcd);
  using rendezvous::etcd::Endpoint;
  EXPECT_EQ(c.rdzvEndpoint.etcd(),
            (std::vector<Endpoint>{{"e1", 2379}, {"10.0.0.2", 2380}, {"fd00::3", 2379}}));
  EXPECT_EQ(c.rdzv.etcdPrefix, "/dlrun/");
  EXPECT_EQ(c.minNodes, 2);
  EXPECT_EQ(
      parse({"--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=e1", "env"}).rdzvBackend,
      RdzvBackend::Etcd);
}

TEST(ParseDlrunArgs, EtcdPrefixComesFromRdzvConf) {
  const auto c = parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e1",
                        "--rdzv-conf=etcd_prefix=/site/jobs", "env"});
  EXPECT_EQ(c.rdzv.etcdPrefix, "/site/jobs/");  // keys under PREFIX/ID/
  EXPECT_TRUE(contains(configError([] {
                         parseRdzvSettings({{"etcd_prefix", ""}});
                       }),
                       "etcd_prefix"));
}

TEST(ParseDlrunArgs, EtcdEndpointsMayComeFromTheEnvironmentTheFlagWinning) {
  HostProbe host = fakeHost();
  host.env["DLRUN_ETCD_ENDPOINTS"] = "e1:1,e2:2";
  EXPECT_EQ(parse({"--nnodes=2", "--rdzv-backend=etcd", "env"}, host).rdzvEndpoint.etcd().size(),
            2u);
  EXPECT_EQ(parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e3", "env"}, host)
                .rdzvEndpoint.etcd(),
            (std::vector<rendezvous::etcd::Endpoint>{{"e3", 2379}}));
}

// A malformed list, or none, is one line naming the flag when the flags are read.
TEST(ParseDlrunArgs, EtcdEndpointErrorsAreOneLineAtParseTime) {
  for (const std::string list : {"e1,,e2", "e1:0", "fd00::1", " "}) {
    SCOPED_TRACE(list);
    const std::string message = configError([&] {
      parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=" + list, "env"});
    });
    EXPECT_TRUE(contains(message, "--rdzv-endpoint")) << message;
    EXPECT_FALSE(contains(message, "\n")) << message;
  }
  const std::string none = configError([] { parse({"--nnodes=2", "--rdzv-backend=etcd", "env"}); });
  EXPECT_TRUE(contains(none, "--rdzv-endpoint")) << none;
  EXPECT_TRUE(contains(none, "DLRUN_ETCD_ENDPOINTS")) << none;
}

// A file of the test's own under TMPDIR (or /tmp), removed with the object.
class TempFile {
 public:
  explicit TempFile(const std::string& content) {
    const char* dir = std::getenv("TMPDIR");
    path_ = std::string(dir ? dir : "/tmp") + "/dlrun_cli_test_XXXXXX";
    const int fd = ::mkstemp(path_.data());
    EXPECT_GE(fd, 0);
    if (fd >= 0) {
      EXPECT_EQ(::write(fd, content.data(), content.size()), ssize_t(content.size()));
      ::close(fd);
    }
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// cacert, cert and key are read when the flags are, and turn TLS on; user with password or
// password_file (its trailing newline dropped) authenticates.
TEST(ParseDlrunArgs, EtcdTlsAndAuthSettings) {
  const TempFile ca("CA PEM"), cert("CERT PEM"), key("KEY PEM"), password("s3cret\n");
  const auto c = parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e1",
                        "--rdzv-conf=cacert=" + ca.path() + ",cert=" + cert.path() +
                            ",key=" + key.path() + ",user=root,password_file=" + password.path(),
                        "env"});
  EXPECT_TRUE(c.etcdSecurity.tls);
  EXPECT_EQ(c.etcdSecurity.rootCerts, "CA PEM");
  EXPECT_EQ(c.etcdSecurity.certChain, "CERT PEM");
  EXPECT_EQ(c.etcdSecurity.privateKey, "KEY PEM");
  EXPECT_EQ(c.etcdSecurity.user, "root");
  EXPECT_EQ(c.etcdSecurity.password, "s3cret");
  // Without settings: no TLS, no user; an https:// endpoint turns TLS on (the system's CAs).
  const auto plain = parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e1", "env"});
  EXPECT_EQ(plain.etcdSecurity, rendezvous::etcd::EtcdSecurity{});
  const auto https =
      parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=https://e1", "env"});
  EXPECT_TRUE(https.etcdSecurity.tls);
  EXPECT_TRUE(https.etcdSecurity.rootCerts.empty());
  const auto inline_ = parse({"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e1",
                              "--rdzv-conf=user=u,password=p", "env"});
  EXPECT_FALSE(inline_.etcdSecurity.tls);
  EXPECT_EQ(inline_.etcdSecurity.password, "p");
}

TEST(ParseDlrunArgs, EtcdSecurityErrorsAreOneLineAtParseTime) {
  const TempFile pem("PEM"), empty("");
  const std::string etcd[] = {"--nnodes=2", "--rdzv-backend=etcd", "--rdzv-endpoint=e1"};
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"cacert=/nonexistent/ca.pem", "cannot read"},
      {"cacert=" + empty.path(), "empty"},
      {"cert=" + pem.path(), "cert and key"},
      {"key=" + pem.path(), "cert and key"},
      {"user=u", "user and password"},
      {"password=p", "user and password"},
      {"user=u,password=p,password_file=" + pem.path(), "not both"},
      {"user=u,password_file=/nonexistent/pw", "password_file"},
  };
  for (const auto& [conf, part] : cases) {
    SCOPED_TRACE(conf);
    const std::string message = configError([&] {
      parse({etcd[0], etcd[1], etcd[2], "--rdzv-conf=" + conf, "env"});
    });
    EXPECT_TRUE(contains(message, part)) << message;
    EXPECT_FALSE(contains(message, "\n")) << message;
  }
  // Another backend has no use for them.
  const std::string c10d = configError([&] {
    parse({"--nnodes=2", "--rdzv-endpoint=h:1", "--rdzv-conf=cacert=" + pem.path(), "env"});
  });
  EXPECT_TRUE(contains(c10d, "--rdzv-backend=etcd")) << c10d;
}

TEST(ParseDlrunArgs, BackendDefaultsToC10dUnlessTheClassicStaticFlagsAreGiven) {
  EXPECT_EQ(parse({"env"}).rdzvBackend, RdzvBackend::C10d);
  EXPECT_EQ(parse({"--nnodes=2", "--rdzv-endpoint=h:1", "env"}).rdzvBackend, RdzvBackend::C10d);
  EXPECT_EQ(parse({"--nnodes=2", "--master-addr=h", "env"}).rdzvBackend, RdzvBackend::Static);
  EXPECT_EQ(parse({"--nnodes=2", "--master-port=5", "--node-rank=1", "env"}).rdzvBackend,
            RdzvBackend::Static);
  EXPECT_EQ(parse({"--master-addr=h", "env"}).rdzvBackend, RdzvBackend::Static);
  // An endpoint means the elastic rendezvous even beside the static flags.
  EXPECT_EQ(parse({"--nnodes=2", "--master-addr=h", "--rdzv-endpoint=h:1", "env"}).rdzvBackend,
            RdzvBackend::C10d);
  {
    ScopedEnv port("PET_MASTER_PORT", "5");  // a PET_ variable counts as given
    EXPECT_EQ(parse({"--nnodes=2", "env"}).rdzvBackend, RdzvBackend::Static);
  }
}

TEST(ParseDlrunArgs, AnExplicitBackendWins) {
  EXPECT_EQ(
      parse({"--nnodes=2", "--master-addr=h", "--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "env"})
          .rdzvBackend,
      RdzvBackend::C10d);
  EXPECT_EQ(
      parse({"--nnodes=2", "--rdzv-backend=static", "--rdzv-endpoint=h:1", "env"}).rdzvBackend,
      RdzvBackend::Static);
  EXPECT_EQ(parse({"--rdzv_backend=static", "env"}).rdzvBackend, RdzvBackend::Static);
  // --standalone serves its own store, whatever the backend says.
  EXPECT_EQ(parse({"--standalone", "--rdzv-backend=static", "env"}).rdzvBackend, RdzvBackend::C10d);
}

// A c10d job of several nodes needs a store every node reaches: refused when the flags are
// read, before any worker or network.
TEST(ParseDlrunArgs, SeveralC10dNodesNeedAnEndpoint) {
  for (const Args& args : {Args{"--nnodes=2", "env"}, Args{"--nnodes=1:3", "env"},
                           Args{"--nnodes=2", "--rdzv-backend=c10d", "--master-addr=h", "env"}}) {
    SCOPED_TRACE(args.front());
    const std::string message = configError([&] { parse(args); });
    EXPECT_TRUE(contains(message, "--rdzv-endpoint")) << message;
    EXPECT_TRUE(contains(message, args.front())) << message;
    EXPECT_FALSE(contains(message, "\n")) << message;
  }
  EXPECT_TRUE(parse({"--rdzv-backend=c10d", "env"}).singleNode());  // one node: its own store
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

TEST(ParseRdzvSettings, DefaultsDetectALostNodeWithinThreeSeconds) {
  const RdzvSettings s = parseRdzvSettings({});
  EXPECT_EQ(s.heartbeat, std::chrono::seconds(1));
  EXPECT_EQ(s.leaseTtl(), std::chrono::seconds(3));
  EXPECT_EQ(s.lastCall, std::chrono::seconds(1));
  EXPECT_FALSE(s.isHost);
  EXPECT_FALSE(s.stopOnlyNode);
}

TEST(ParseRdzvSettings, HeartbeatTimeoutAndStoreTypeAsTorchrunReadsThem) {
  const RdzvSettings s = parseRdzvSettings({{"heartbeat_timeout", "10"}, {"store_type", "tcp"}});
  EXPECT_EQ(s.leaseTtl(), std::chrono::seconds(10));  // in place of interval x attempts
  const std::string file = configError([] { parseRdzvSettings({{"store_type", "file"}}); });
  EXPECT_TRUE(contains(file, "store_type=file") && contains(file, "TCP only")) << file;
  const std::string shorter = configError([] {
    parseRdzvSettings({{"heartbeat_timeout", "1"}, {"keep_alive_interval", "2"}});
  });
  EXPECT_TRUE(contains(shorter, "heartbeat_timeout must be longer")) << shorter;
}

TEST(ParseRdzvSettings, StoreOutageTimeoutIsAMinuteUnlessSet) {
  EXPECT_EQ(parseRdzvSettings({}).storeOutage, std::chrono::seconds(60));
  EXPECT_EQ(parseRdzvSettings({{"store_outage_timeout", "2.5"}}).storeOutage,
            std::chrono::milliseconds(2500));
  const std::string bad = configError([] { parseRdzvSettings({{"store_outage_timeout", "-1"}}); });
  EXPECT_TRUE(contains(bad, "store_outage_timeout=-1")) << bad;
}

TEST(ParseRdzvSettings, TorchrunKeys) {
  const RdzvSettings s = parseRdzvSettings({{"join_timeout", "30"},
                                            {"last_call_timeout", "0.5"},
                                            {"keep_alive_interval", "0.25"},
                                            {"keep_alive_max_attempt", "4"},
                                            {"is_host", "true"},
                                            {"stop_policy", "node"},
                                            {"read_timeout", "60"}});
  EXPECT_EQ(s.joinTimeout, std::chrono::seconds(30));
  EXPECT_EQ(s.lastCall, std::chrono::milliseconds(500));
  EXPECT_EQ(s.leaseTtl(), std::chrono::seconds(1));
  EXPECT_EQ(s.isHost, true);
  EXPECT_TRUE(s.stopOnlyNode);
  // torch's boolean spellings; use_libuv (torch 2.x) is checked and means nothing here.
  EXPECT_EQ(parseRdzvSettings({{"is_host", "No"}}).isHost, false);
  EXPECT_EQ(parseRdzvSettings({{"is_host", "y"}, {"use_libuv", "0"}}).isHost, true);
  EXPECT_FALSE(parseRdzvSettings({{"use_libuv", "True"}}).isHost);
}

TEST(ParseRdzvSettings, TimeoutsArePositiveSecondsAndTheRefusalSaysSo) {
  EXPECT_EQ(parseRdzvSettings({{"last_call_timeout", "0.5"}}).lastCall,
            std::chrono::milliseconds(500));
  for (const char* value : {"0", "-2", "86401", "nan"}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(configError([&] {
                parseRdzvSettings({{"last_call_timeout", value}});
              }),
              std::string("--rdzv-conf: last_call_timeout=") + value +
                  " is not a number of seconds above 0 and at most 86400");
  }
}

// Under a millisecond a setting would be 0 ms, and the rendezvous would spin on it.
TEST(ParseRdzvSettings, ASettingUnderAMillisecondIsRefusedInOneLine) {
  for (const char* key : {"join_timeout", "last_call_timeout", "keep_alive_interval",
                          "heartbeat_timeout", "store_outage_timeout"}) {
    SCOPED_TRACE(key);
    EXPECT_EQ(configError([&] {
                parseRdzvSettings({{key, "0.0004"}});
              }),
              std::string("--rdzv-conf: ") + key +
                  "=0.0004 is under a millisecond: give at least 0.001 (seconds)");
  }
  EXPECT_EQ(parseRdzvSettings({{"keep_alive_interval", "0.001"}}).heartbeat,
            std::chrono::milliseconds(1));
}

TEST(ParseRdzvSettings, JobTtlIsWholeSecondsAnHourByDefault) {
  EXPECT_EQ(parseRdzvSettings({}).jobTtl, std::chrono::hours(1));
  EXPECT_EQ(parseRdzvSettings({{"job_ttl", "5"}}).jobTtl, std::chrono::seconds(5));
  EXPECT_EQ(parseRdzvSettings({{"job_ttl", "2592000"}}).jobTtl, std::chrono::days(30));
  for (const char* value : {"0", "-1", "1.5", "2592001", "soon", ""}) {
    SCOPED_TRACE(value);
    EXPECT_EQ(configError([&] {
                parseRdzvSettings({{"job_ttl", value}});
              }),
              std::string("--rdzv-conf: job_ttl=") + value +
                  " is not a whole number of seconds from 1 to 2592000 (30 days)");
  }
}

TEST(ParseRdzvSettings, BadValuesNameTheKey) {
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"join_timeout", "-1"},
                                                        {"last_call_timeout", "soon"},
                                                        {"keep_alive_max_attempt", "0"},
                                                        {"is_host", "maybe"},
                                                        {"stop_policy", "all"},
                                                        {"use_libuv", "sometimes"},
                                                        {"lease", "3"}}) {
    try {
      parseRdzvSettings({{key, value}});
      FAIL() << key << "=" << value << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dlrun::launcher

namespace dlrun::launcher {
namespace {

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

TEST(ParseDlrunArgs, ANodeOfServicesOnlyNeedsAnotherNodeToEndTheJob) {
  EXPECT_EQ(parse({"--nnodes=2", "--rdzv-endpoint=h:1", "--roles=worker:2:service", "env"})
                .agent.nprocPerNode,
            2);
  EXPECT_TRUE(contains(configError([] {
                         parse({"--standalone", "--roles=ps:1:service", "env"});
                       }),
                       "nothing would end the job"));
}

TEST(ParseDlrunArgs, LocalRankArgument) {
  EXPECT_EQ(parse({"env"}).agent.localRankFlag, "");
  EXPECT_EQ(parse({"--use-local-rank-arg", "env"}).agent.localRankFlag, "--local-rank");
  EXPECT_EQ(parse({"--no_use_env", "--local-rank-arg-style=underscore", "env"}).agent.localRankFlag,
            "--local_rank");
  EXPECT_EQ(parse({"--use-env", "env"}).agent.localRankFlag, "");
  EXPECT_EQ(configError([] {
              parse({"--local-rank-arg-style=camel", "env"});
            }),
            "--local-rank-arg-style: 'camel' is not dash or underscore");
}

// --warm-start: the interpreter and its options the zygote runs under, the preload list; both
// spellings and the PET_ variables.
TEST(ParseDlrunArgs, WarmStart) {
  EXPECT_FALSE(parse({"script.py"}).agent.warmStart);
  auto c = parse({"--warm-start", "--preload", "torch,numpy", "script.py", "--lr", "1"});
  ASSERT_TRUE(c.agent.warmStart);
  EXPECT_EQ(c.agent.warmStart->interpreter, (Args{"/fake/python3", "-u"}));
  EXPECT_EQ(c.agent.warmStart->preload, (Args{"torch", "numpy"}));
  c = parse({"--warm_start", "-m", "pkg.train"});
  ASSERT_TRUE(c.agent.warmStart);
  EXPECT_TRUE(c.agent.warmStart->preload.empty());
  HostProbe host = fakeHost();
  host.findOnPath = [](const std::string& name) -> std::optional<std::string> {
    return "/opt/py/bin/" + name;
  };
  c = parse({"--warm-start", "python3.11", "-X", "dev", "script.py"}, host);
  EXPECT_EQ(c.agent.warmStart->interpreter, (Args{"/opt/py/bin/python3.11", "-X", "dev"}));
  ScopedEnv warm("PET_WARM_START", "1");
  ScopedEnv preload("PET_PRELOAD", "torch");
  c = parse({"script.py"});
  ASSERT_TRUE(c.agent.warmStart);
  EXPECT_EQ(c.agent.warmStart->preload, (Args{"torch"}));
}

TEST(ParseDlrunArgs, WarmStartRefusesWhatIsNoPythonProgram) {
  EXPECT_TRUE(contains(configError([] {
                         parse({"--warm-start", "--no-python", "/jobs/tool"});
                       }),
                       "--warm-start and --no-python conflict"));
  EXPECT_TRUE(contains(configError([] {
                         parse({"--warm-start", "train"}, fakeHost(0, true));
                       }),
                       "the bundled trainer"));
  EXPECT_TRUE(contains(configError([] {
                         parse({"--warm-start", "env", "A=1"});
                       }),
                       "--warm-start: the entry point runs /usr/bin/env, which is no Python"));
  EXPECT_EQ(configError([] {
              parse({"--preload=torch", "script.py"});
            }),
            "--preload needs --warm-start (the modules are imported for warm starts)");
  EXPECT_EQ(configError([] {
              parse({"--warm-start", "--preload=to-rch", "script.py"});
            }),
            "--preload: 'to-rch' is not a module name (MOD[,MOD...])");
}

}  // namespace
TEST(ParseDlrunArgs, StragglerFlagsHaveDefaultsAndRanges) {
  const LaunchConfig defaults = parse({"script.py"});
  EXPECT_EQ(defaults.stragglers.fraction, 0.7);
  EXPECT_EQ(defaults.stragglers.window, 30);
  const LaunchConfig given =
      parse({"--straggler-fraction=0.5", "--straggler-window=12", "script.py"});
  EXPECT_EQ(given.stragglers.fraction, 0.5);
  EXPECT_EQ(given.stragglers.window, 12);
  EXPECT_EQ(parse({"--straggler-fraction=0", "script.py"}).stragglers.fraction, 0);  // off
  EXPECT_NE(configError([] {
              parseDlrunArgs({"--straggler-fraction=1.5", "script.py"}, fakeHost());
            }).find("--straggler-fraction"),
            std::string::npos);
  EXPECT_NE(configError([] {
              parseDlrunArgs({"--straggler-window=0", "script.py"}, fakeHost());
            }).find("--straggler-window"),
            std::string::npos);
}

// The checks run only where one is asked for; --health-gpus alone is one.
TEST(HealthFlags, HealthGpusTurnsTheChecksOn) {
  EXPECT_FALSE(parse({"script.py"}).agent.health);
  const auto health = parse({"--health-gpus=8", "script.py"}).agent.health;
  ASSERT_TRUE(health);
  EXPECT_EQ(health->gpus, 8);
  EXPECT_EQ(health->minFreeBytes, 0u);
  EXPECT_FALSE(health->command);
  const auto others = parse({"--health-min-free=1", "script.py"}).agent.health;
  ASSERT_TRUE(others);
  EXPECT_EQ(others->gpus, 0);  // the GPUs are checked all the same, not counted
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

}  // namespace dlrun::launcher
