// The dlrun command line's general flags: each small parser and entry-point resolution on its own,
// then parseDlrunArgs end to end with a fake HostProbe (launch_cli_testing.h; no real CPUs, GPUs,
// PATH or files are consulted, but for the executable bit of two files the tests write): the
// defaults, every flag's spellings, the worker's console, hangs, warm start, stragglers and
// health. The rendezvous's flags are launch_cli_rdzv_test.cpp's; Slurm, mpirun, --hostfile,
// Kubernetes and the settings the environment gives are launch_cli_cluster_test.cpp's.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <csignal>
#include <cstdio>
#include <set>

#include "launcher/entry_point.h"
#include "launcher/launch_cli.h"
#include "tests/launch_cli_testing.h"

namespace dlrun::launcher {
namespace {

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

TEST(ParseDlrunArgs, HelpAndVersionEndWithZero) {
  for (const std::string flag : {"--help", "--version"}) {
    testing::internal::CaptureStdout();
    auto parsed = parseDlrunArgs({flag}, fakeHost());
    const std::string out = testing::internal::GetCapturedStdout();
    EXPECT_EQ(parsed.exitCode, 0);
    EXPECT_FALSE(out.empty());
  }
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

}  // namespace
}  // namespace dlrun::launcher
