// Stack reports of live processes: a C++ program blocked in a known function (eu-stack, and gdb
// where eu-stack is missing), a Python one sleeping in a known function (the hook), processes
// without the hook (never signalled), a fake flight recorder on its pipe, a tool that hangs
// (killed at the deadline), and, with torch, a gloo job whose rank 1 sleeps while rank 0 waits
// in all_reduce. Children start as the agent starts workers (spawnProcess) and are killed by pid.
#include "agents/stack_dump.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include "agents/process.h"
#include "common/clock.h"
#include "store/address.h"

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kReady = seconds(60);  // a Python start with torch on a busy machine
constexpr auto kDump = milliseconds(20000);
constexpr const char* kPython = "/usr/bin/python3";

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void writeFile(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Polls for a file with a deadline: what a child writes once it is where the test wants it.
bool waitForFile(const fs::path& path, Clock::duration limit = kReady) {
  for (const auto until = Clock::now() + limit; Clock::now() < until;) {
    if (fs::exists(path)) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return false;
}

// Running, not stopped, and `sig` not pending for it.
::testing::AssertionResult runsUnharmed(pid_t pid, int sig) {
  if (::waitpid(pid, nullptr, WNOHANG) != 0)
    return ::testing::AssertionFailure() << pid << " ended";
  const std::string status = readFile("/proc/" + std::to_string(pid) + "/status");
  std::istringstream lines(status);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with("State:") && (contains(line, "T (") || contains(line, "t (")))
      return ::testing::AssertionFailure() << pid << " is stopped: " << line;
    if (line.starts_with("ShdPnd:") || line.starts_with("SigPnd:")) {
      const unsigned long long pending = std::stoull(line.substr(line.find(':') + 1), nullptr, 16);
      if (pending & (1ULL << (sig - 1)))
        return ::testing::AssertionFailure() << pid << " has signal " << sig << " pending";
    }
  }
  return ::testing::AssertionSuccess();
}

// Sets PATH for one test (which tools dumpStacks finds) and puts it back.
class PathOverride {
 public:
  explicit PathOverride(const std::string& path) : saved_(std::getenv("PATH")) {
    ::setenv("PATH", path.c_str(), 1);
  }
  ~PathOverride() { ::setenv("PATH", saved_.c_str(), 1); }

 private:
  std::string saved_;
};

class StackDumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/dlrun-stack-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    for (pid_t pid : children_) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  pid_t start(std::vector<std::string> argv, const Environment& extra = {}) {
    std::vector<std::string> env = {"PATH=/usr/bin:/bin"};
    for (const auto& [key, value] : extra) env.push_back(key + "=" + value);
    const pid_t pid = spawnProcess({.argv = std::move(argv), .envp = env, .nullStdin = true}).pid;
    children_.push_back(pid);
    return pid;
  }

  // The C++ helper, blocked once its ready file exists.
  pid_t startBlocked(const std::string& name) {
    const fs::path ready = dir_ / (name + ".ready");
    const pid_t pid = start({STACK_DUMP_BLOCKED, ready});
    EXPECT_TRUE(waitForFile(ready));
    return pid;
  }

  // A Python script that calls `function`, which writes the ready file and sleeps.
  pid_t startPythonSleeping(const std::string& function, const Environment& env,
                            std::vector<std::string> flags = {}) {
    const fs::path script = dir_ / (function + ".py"), ready = dir_ / (function + ".ready");
    writeFile(script,
              "import sys, time\n"
              "def " +
                  function +
                  "():\n"
                  "    open(sys.argv[1], 'w').close()\n"
                  "    time.sleep(600)\n" +
                  function + "()\n");
    std::vector<std::string> argv = {kPython};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {script, ready});
    const pid_t pid = start(argv, env);
    EXPECT_TRUE(waitForFile(ready));
    return pid;
  }

  fs::path dir_;
  std::vector<pid_t> children_;
};

TEST_F(StackDumpTest, NativeStacksOfABlockedProgram) {
  const pid_t pid = startBlocked("native");
  const fs::path out = dir_ / "stacks" / "rank-0.txt";
  const auto dumps = dumpStacks({{pid, 0, out}}, nullptr, kDump);
  ASSERT_EQ(dumps.size(), 1u);
  const StackDump& d = dumps[0];
  EXPECT_EQ(d.pid, pid);
  EXPECT_EQ(d.error, "");
  EXPECT_EQ(readFile(out), d.text);
  EXPECT_TRUE(contains(d.text, "== native stacks (eu-stack -p " + std::to_string(pid) + ")"))
      << d.text;
  EXPECT_TRUE(contains(d.text, "dlrunStackTestBlockedHere")) << d.text;
  EXPECT_NE(std::find(d.topFrames.begin(), d.topFrames.end(), "dlrunStackTestBlockedHere"),
            d.topFrames.end())
      << d.text;
  EXPECT_EQ(d.collective, std::nullopt);
  EXPECT_TRUE(runsUnharmed(pid, SIGCONT));
}

TEST_F(StackDumpTest, GdbWhereEuStackIsMissing) {
  if (!fs::exists("/usr/bin/gdb")) GTEST_SKIP() << "gdb is not installed";
  const fs::path tools = dir_ / "tools";
  fs::create_directories(tools);
  fs::create_symlink("/usr/bin/gdb", tools / "gdb");
  const pid_t pid = startBlocked("gdb");
  PathOverride path(tools.string());
  const auto dumps = dumpStacks({{pid, 1, dir_ / "rank-1.txt"}}, nullptr, kDump);
  EXPECT_EQ(dumps[0].error, "");
  EXPECT_TRUE(contains(dumps[0].text, "== native stacks (gdb -p ")) << dumps[0].text;
  EXPECT_NE(
      std::find(dumps[0].topFrames.begin(), dumps[0].topFrames.end(), "dlrunStackTestBlockedHere"),
      dumps[0].topFrames.end())
      << dumps[0].text;
  EXPECT_TRUE(runsUnharmed(pid, SIGCONT));
}

TEST_F(StackDumpTest, PythonStacksThroughTheHook) {
  const PythonStackHook hook(dir_ / "hook");
  const pid_t pid = startPythonSleeping("dlrun_stack_test_sleeps_here", hook.environment({}));
  ASSERT_TRUE(fs::exists(hook.dir() / ("py-" + std::to_string(pid) + ".txt")));
  const auto dumps = dumpStacks({{pid, 0, dir_ / "rank-0.txt"}}, &hook, kDump);
  const StackDump& d = dumps[0];
  EXPECT_EQ(d.error, "");
  EXPECT_TRUE(contains(d.text, "== Python stacks (faulthandler) ==")) << d.text;
  EXPECT_TRUE(contains(d.text, "== native stacks (eu-stack")) << d.text;
  ASSERT_FALSE(d.topFrames.empty()) << d.text;
  EXPECT_TRUE(d.topFrames[0].starts_with(
      "dlrun_stack_test_sleeps_here (dlrun_stack_test_sleeps_here.py:4)"))
      << d.topFrames[0];
  EXPECT_TRUE(runsUnharmed(pid, PythonStackHook::signal()));
  // A second report reads the new dump only.
  const auto again = dumpStacks({{pid, 0, dir_ / "again.txt"}}, &hook, kDump);
  const std::string python = again[0].text.substr(again[0].text.find("== Python"));
  EXPECT_EQ(python.find("most recent call first"), python.rfind("most recent call first"))
      << again[0].text;
}

TEST_F(StackDumpTest, APythonOnlyTargetIsNotWalkedByADebugger) {
  // A survivor of an in-process recovery: its Python stack alone, no eu-stack stopping it; one
  // that is stopped (no hook can answer) still gets its native stack.
  const PythonStackHook hook(dir_ / "hook");
  const pid_t pid = startPythonSleeping("dlrun_stack_test_python_only", hook.environment({}));
  const pid_t stopped =
      startPythonSleeping("dlrun_stack_test_python_stopped", hook.environment({}));
  ASSERT_EQ(::kill(stopped, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(stopped, &status, WUNTRACED), stopped);
  const auto dumps =
      dumpStacks({{.pid = pid, .rank = 0, .outFile = dir_ / "rank-0.txt", .native = false},
                  {.pid = stopped, .rank = 1, .outFile = dir_ / "rank-1.txt", .native = false}},
                 &hook, kDump);
  EXPECT_EQ(dumps[0].error, "");
  EXPECT_TRUE(contains(dumps[0].text, "== Python stacks (faulthandler) ==")) << dumps[0].text;
  EXPECT_FALSE(contains(dumps[0].text, "== native stacks")) << dumps[0].text;
  EXPECT_TRUE(contains(dumps[0].text, "no native stacks: its Python stack alone was asked for"))
      << dumps[0].text;
  ASSERT_FALSE(dumps[0].topFrames.empty()) << dumps[0].text;
  EXPECT_TRUE(dumps[0].topFrames[0].starts_with("dlrun_stack_test_python_only ("))
      << dumps[0].topFrames[0];
  EXPECT_TRUE(contains(dumps[1].text, "== native stacks")) << dumps[1].text;
  EXPECT_TRUE(runsUnharmed(pid, PythonStackHook::signal()));
  ::kill(stopped, SIGCONT);
}

TEST_F(StackDumpTest, AStoppedPythonProcessGetsItsNativeStackAndIsNotWaitedFor) {
  // A SIGSTOPped rank (a hang) cannot run the hook: its native stack alone, and it stays stopped.
  const PythonStackHook hook(dir_ / "hook");
  const pid_t pid = startPythonSleeping("dlrun_stack_test_stopped", hook.environment({}));
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, WUNTRACED), pid);  // stopped by now, as a hung rank is
  ASSERT_TRUE(WIFSTOPPED(status));
  const auto dumps = dumpStacks({{pid, 0, dir_ / "rank-0.txt"}}, &hook, kDump);
  const StackDump& d = dumps[0];
  EXPECT_TRUE(contains(d.text, "no Python stacks: the process is stopped")) << d.text;
  EXPECT_FALSE(contains(d.text, "the hook did not answer in time")) << d.text;
  EXPECT_TRUE(contains(d.text, "== native stacks")) << d.text;
  EXPECT_FALSE(runsUnharmed(pid, PythonStackHook::signal()));  // still stopped
  ::kill(pid, SIGCONT);
}

TEST_F(StackDumpTest, TheHookRunsTheNextSitecustomize) {
  const PythonStackHook hook(dir_ / "hook");
  const fs::path site = dir_ / "site", marker = dir_ / "site-ran";
  fs::create_directories(site);
  writeFile(site / "sitecustomize.py", "open('" + marker.string() + "', 'w').close()\n");
  const pid_t pid = startPythonSleeping("dlrun_stack_test_site",
                                        hook.environment({{"PYTHONPATH", site.string()}}));
  EXPECT_EQ(hook.environment({{"PYTHONPATH", site.string()}}).at("PYTHONPATH"),
            hook.dir().string() + ":" + site.string());
  EXPECT_TRUE(fs::exists(marker));
  EXPECT_TRUE(fs::exists(hook.dir() / ("py-" + std::to_string(pid) + ".txt")));
}

TEST_F(StackDumpTest, AProcessWithoutTheHookIsNeverSignalled) {
  const PythonStackHook hook(dir_ / "hook");
  // Isolated mode ignores PYTHONPATH: no hook, no file.
  const pid_t isolated =
      startPythonSleeping("dlrun_stack_test_isolated", hook.environment({}), {"-I"});
  // A file by the name of a process that does not hold it (a program exec'd since, a reused pid).
  const pid_t native = startBlocked("stale");
  writeFile(hook.dir() / ("py-" + std::to_string(native) + ".txt"), "");
  const auto dumps = dumpStacks(
      {{isolated, 0, dir_ / "rank-0.txt"}, {native, 1, dir_ / "rank-1.txt"}}, &hook, kDump);
  for (const auto& d : dumps) {
    EXPECT_TRUE(runsUnharmed(d.pid, PythonStackHook::signal()));
    EXPECT_TRUE(contains(d.text, "has not loaded dlrun's hook")) << d.text;
    EXPECT_TRUE(contains(d.text, "== native stacks")) << d.text;
  }
}

TEST_F(StackDumpTest, TheFlightRecorderDumpIsGatheredWithTheStacks) {
  // What torch does with TORCH_NCCL_DEBUG_INFO_PIPE_FILE: <stem><rank>.pipe, read now and then;
  // anything written there dumps the trace to TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>.
  const fs::path script = dir_ / "flight_recorder.py", ready = dir_ / "fr.ready";
  writeFile(script, R"(import os, pickle, sys, time
rank = os.environ["RANK"]
pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + rank + ".pipe"
os.mkfifo(pipe)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
open(sys.argv[1], "w").close()
while True:
    time.sleep(0.02)
    if os.read(fd, 128):
        entry = {"collective_seq_id": 7, "profiling_name": "nccl:all_gather"}
        entries = [dict(entry, state="scheduled")]
        with open(os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + rank, "wb") as f:
            pickle.dump({"version": "2.2", "entries": entries}, f, protocol=2)
)");
  const pid_t pid = start({kPython, script, ready},
                          {{"RANK", "3"},
                           {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", (dir_ / "nccl_pipe_").string()},
                           {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE", (dir_ / "nccl_trace_").string()}});
  ASSERT_TRUE(waitForFile(ready));
  const fs::path out = dir_ / "rank-3.txt";
  const auto dumps = dumpStacks({{pid, 3, out}}, nullptr, kDump);
  const StackDump& d = dumps[0];
  fs::path copy = out;
  copy += ".nccl_trace";
  EXPECT_EQ(d.ncclTrace, copy);
  EXPECT_EQ(readFile(copy), readFile(dir_ / "nccl_trace_3"));
  EXPECT_EQ(d.lastNcclCollective, "all_gather (seq 7, scheduled)");
  EXPECT_TRUE(contains(d.text, "newest entry: all_gather (seq 7, scheduled)")) << d.text;
}

TEST_F(StackDumpTest, NoReaderOnTheFlightRecordersPipeIsANote) {
  const fs::path pipe = dir_ / "nccl_pipe_0.pipe";
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);
  const pid_t pid = start({STACK_DUMP_BLOCKED, dir_ / "quiet.ready"},
                          {{"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", (dir_ / "nccl_pipe_").string()}});
  ASSERT_TRUE(waitForFile(dir_ / "quiet.ready"));
  const auto dumps = dumpStacks({{pid, 0, dir_ / "rank-0.txt"}}, nullptr, kDump);
  EXPECT_EQ(dumps[0].ncclTrace, std::nullopt);
  EXPECT_TRUE(contains(dumps[0].text, "nobody reads it")) << dumps[0].text;
}

TEST_F(StackDumpTest, TheDeadlineKillsAToolThatHangs) {
  const fs::path tools = dir_ / "tools", toolPid = dir_ / "tool.pid";
  fs::create_directories(tools);
  writeFile(tools / "eu-stack",
            "#!/bin/sh\necho $$ > " + toolPid.string() + "\nexec /bin/sleep 600\n");
  fs::permissions(tools / "eu-stack", fs::perms::owner_all);
  const pid_t pid = startBlocked("slow");
  PathOverride path(tools.string());
  const auto began = Clock::now();
  const auto dumps = dumpStacks({{pid, 0, dir_ / "rank-0.txt"}}, nullptr, milliseconds(1000));
  EXPECT_LT(Clock::now() - began, seconds(5));
  EXPECT_TRUE(contains(dumps[0].error, "eu-stack: killed at the deadline")) << dumps[0].error;
  const pid_t tool = std::stoi(readFile(toolPid));
  EXPECT_EQ(::kill(tool, 0), -1);  // killed and reaped
  EXPECT_EQ(errno, ESRCH);
  EXPECT_TRUE(runsUnharmed(pid, SIGCONT));
}

TEST_F(StackDumpTest, AProcessThatIsGoneIsAnError) {
  const pid_t pid = start({"/bin/true"});
  ::waitpid(pid, nullptr, 0);
  children_.clear();
  const auto dumps = dumpStacks({{pid, 0, dir_ / "rank-0.txt"}}, nullptr, kDump);
  EXPECT_EQ(dumps[0].error, "process " + std::to_string(pid) + " is gone");
  EXPECT_TRUE(contains(readFile(dir_ / "rank-0.txt"), "is gone"));
}

// The acceptance scenario with real torch: rank 1 sleeps before all_reduce, rank 0 waits in it.
// The report names all_reduce for rank 0 and no collective for rank 1, the suspect.
TEST_F(StackDumpTest, GlooRankWaitsInAllReduceWhileItsPeerSleeps) {
  if (std::system("/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null") != 0)
    GTEST_SKIP() << "torch is not installed for /usr/bin/python3";
  const PythonStackHook hook(dir_ / "hook");
  const fs::path script = dir_ / "gloo_hang.py";
  writeFile(script, R"(import os, sys, time, torch, torch.distributed as dist
def sleeping_rank_sleeps_here():
    open(sys.argv[1], "w").close()
    time.sleep(600)
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    sleeping_rank_sleeps_here()
open(sys.argv[1], "w").close()
dist.all_reduce(torch.ones(4))
)");
  const auto port = reserveFreePorts("127.0.0.1", 1).at(0);
  std::vector<StackTarget> targets;
  for (int rank : {0, 1}) {
    Environment env = hook.environment({});
    // USE_LIBUV=0: rank 0 serves torch's classic store, which a torch built without libuv
    // (Debian 13's 2.6) has too; torch 1.x ignores it.
    env.insert({{"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", std::to_string(port)},
                {"WORLD_SIZE", "2"},
                {"RANK", std::to_string(rank)},
                {"USE_LIBUV", "0"}});
    targets.push_back(
        {start({kPython, script, dir_ / ("rank" + std::to_string(rank) + ".ready")}, env), rank,
         dir_ / "stacks" / ("rank-" + std::to_string(rank) + ".txt")});
  }
  for (int rank : {0, 1})
    ASSERT_TRUE(waitForFile(dir_ / ("rank" + std::to_string(rank) + ".ready")));
  // The ready files come just before the calls: report again until both are in them. Python's
  // stack is taken before the native one, so rank 0 may still be in torch.ones() for the first
  // and already in Work::wait for the second: only all_reduce in both says it is in the call.
  std::vector<StackDump> dumps;
  for (const auto until = Clock::now() + seconds(60); Clock::now() < until;) {
    dumps = dumpStacks(targets, &hook, kDump);
    if (dumps[0].collective == "all_reduce" && !dumps[1].topFrames.empty() &&
        dumps[1].topFrames[0].starts_with("sleeping_rank_sleeps_here"))
      break;
  }
  ASSERT_EQ(dumps.size(), 2u);
  EXPECT_EQ(dumps[0].collective, "all_reduce") << dumps[0].text;
  EXPECT_EQ(dumps[1].collective, std::nullopt) << dumps[1].text;
  ASSERT_FALSE(dumps[1].topFrames.empty()) << dumps[1].text;
  EXPECT_TRUE(dumps[1].topFrames[0].starts_with("sleeping_rank_sleeps_here (gloo_hang.py:4)"))
      << dumps[1].text;
  EXPECT_TRUE(contains(readFile(targets[1].outFile), "sleeping_rank_sleeps_here"));
  EXPECT_TRUE(contains(readFile(targets[0].outFile), "waiting in: all_reduce"));
  for (const auto& t : targets) EXPECT_TRUE(runsUnharmed(t.pid, PythonStackHook::signal()));
}

}  // namespace
}  // namespace dlrun::agents
