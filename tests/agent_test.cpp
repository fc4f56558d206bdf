// The agent's state machine on a scripted rendezvous, with /bin/sh workers: success, a failure
// that restarts, a final failure, a round ended by another node, and a rendezvous that fails
// with any kind of exception. The fake rendezvous counts restarts with the same rule as the
// real ones (RoundEnd::countFailure).
#include "agents/agent.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>

#include "common/error.h"

namespace dlrun::agents {
namespace {

using rendezvous::JoinResult;
using rendezvous::RoundEnd;
using Kind = RoundEnd::Kind;

class FakeRendezvous : public rendezvous::Rendezvous {
 public:
  int maxRestarts = 0;
  int nproc = 2;
  int worldSize = 0;                          // 0: this node's workers alone
  std::vector<std::string> endpoints;         // TF_CONFIG's list
  std::map<int, RoundEnd> elsewhere;          // ends that another node brings to a round
  std::function<bool()> elsewhereWhen;        // an end from elsewhere arrives once this holds
  std::map<int, RoundEnd> whileJoining;       // the job ended while this node waited to join
  std::function<void(int round)> beforeJoin;  // may throw, as a failing rendezvous does
  std::map<rendezvous::RoundTopic, std::vector<std::string>> shared;  // by topic

  JoinResult next() override {
    std::lock_guard lock(mutex_);
    if (beforeJoin) beforeJoin(round_);
    end_.reset();
    if (auto it = whileJoining.find(round_); it != whileJoining.end()) {
      ++round_;
      return it->second;
    }
    rendezvous::World world;
    world.runId = "agent-test";
    world.round = world.spaceRound = round_++;
    world.localWorldSize = world.worldSize = nproc;
    if (worldSize > 0) world.worldSize = worldSize;
    world.workerEndpoints = endpoints;
    world.failures = failuresUsed_;
    world.restarts = {.maxRestarts = maxRestarts};
    world.masterAddr = "127.0.0.1";
    world.masterPort = world.storePort = 1;
    if (auto it = elsewhere.find(world.round); it != elsewhere.end()) end_ = it->second;
    return world;
  }

  RoundEnd awaitEnd() override {
    std::unique_lock lock(mutex_);
    // Rechecked every few ms: elsewhereWhen looks at the workers, which notify nothing.
    while (!interrupted_ && !(end_ && (!elsewhereWhen || elsewhereWhen())))
      changed_.wait_for(lock, std::chrono::milliseconds(5));
    if (!end_) throw Error("interrupted");
    return *end_;
  }

  void reportFailure(RoundEnd failure) override {
    std::lock_guard lock(mutex_);
    failure.countFailure(failuresUsed_, {.maxRestarts = maxRestarts});
    failuresUsed_ = failure.failures;
    failures.push_back(failure);
    end_ = failure;
    changed_.notify_all();
  }

  void reportLost(const std::string& what) override {
    std::lock_guard lock(mutex_);
    end_ = RoundEnd{.kind = Kind::NodeLost, .node = what};
    changed_.notify_all();
  }

  void shareWithRound(rendezvous::RoundTopic topic, const std::string& text) override {
    std::lock_guard lock(mutex_);
    shared[topic].push_back(text);
  }

  std::vector<std::string> gatherFromRound(rendezvous::RoundTopic topic,
                                           std::chrono::milliseconds) override {
    std::lock_guard lock(mutex_);
    return shared[topic];
  }

  void reportSuccess() override {
    std::lock_guard lock(mutex_);
    ++successes;
    end_ = RoundEnd{.kind = Kind::Finished};
    changed_.notify_all();
  }

  RoundEnd reportStop(int signal) override {
    std::lock_guard lock(mutex_);
    stops.push_back(signal);
    return rendezvous::jobStopped(signal, "this-node");
  }

  void interrupt() override {
    std::lock_guard lock(mutex_);
    interrupted_ = true;
    changed_.notify_all();
  }

  int rounds() {
    std::lock_guard lock(mutex_);
    return round_;
  }

  std::vector<RoundEnd> failures;
  std::vector<int> stops;
  int successes = 0;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<RoundEnd> end_;
  bool interrupted_ = false;
  int round_ = 0;
  int failuresUsed_ = 0;
};

AgentOptions shellOptions(const FakeRendezvous& rendezvous, const std::string& script) {
  return {
      .command = {"/bin/sh", "-c", script},
      .nprocPerNode = rendezvous.nproc,
      .stopTimeout = std::chrono::seconds(5),
  };
}

int runAgent(FakeRendezvous& rendezvous, const std::string& script) {
  Agent agent(shellOptions(rendezvous, script), rendezvous);
  return agent.run();
}

// A job of `size` workers, this node running the first few: TF_CONFIG lists all of them.
void largeJob(FakeRendezvous& rendezvous, int size) {
  rendezvous.worldSize = size;
  rendezvous.endpoints.clear();
  for (int rank = 0; rank < size; ++rank)
    rendezvous.endpoints.push_back("127.0.0.1:" + std::to_string(20000 + rank % 40000));
}

// A directory the workers mark with a file each when they run; removed at the end.
class StartMarks {
 public:
  StartMarks() {
    std::string pattern = (std::filesystem::temp_directory_path() / "agent-test-XXXXXX").string();
    dir_ = ::mkdtemp(pattern.data());
  }
  ~StartMarks() { std::filesystem::remove_all(dir_); }
  // Shell code that marks this worker as started.
  std::string mark() const { return ": > " + dir_.string() + "/started_$LOCAL_RANK; "; }
  const std::filesystem::path& dir() const { return dir_; }
  size_t count() const {
    return std::distance(std::filesystem::directory_iterator(dir_),
                         std::filesystem::directory_iterator());
  }

 private:
  std::filesystem::path dir_;
};

TEST(AgentTest, WorkersThatSucceedFinishTheJob) {
  FakeRendezvous rendezvous;
  EXPECT_EQ(runAgent(rendezvous, "exit 0"), 0);
  EXPECT_EQ(rendezvous.rounds(), 1);
  EXPECT_EQ(rendezvous.successes, 1);
  EXPECT_TRUE(rendezvous.failures.empty());
}

TEST(AgentTest, AFailureRestartsTheGroupWhileRestartsRemain) {
  FakeRendezvous rendezvous;
  rendezvous.maxRestarts = 1;
  // Local rank 1 fails in the first round only.
  const int code = runAgent(rendezvous,
                            "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && "
                            "[ \"$LOCAL_RANK\" = 1 ] && exit 3; exit 0");
  EXPECT_EQ(code, 0);
  EXPECT_EQ(rendezvous.rounds(), 2);
  ASSERT_EQ(rendezvous.failures.size(), 1u);
  EXPECT_EQ(rendezvous.failures[0].rank, 1);
  EXPECT_EQ(rendezvous.failures[0].exitCode, 3);
  EXPECT_FALSE(rendezvous.failures[0].final);
  EXPECT_EQ(rendezvous.successes, 1);
}

TEST(AgentTest, AFinalFailureExitsWithTheWorkersCode) {
  FakeRendezvous rendezvous;
  rendezvous.maxRestarts = 1;
  EXPECT_EQ(runAgent(rendezvous, "[ \"$LOCAL_RANK\" = 0 ] && exit 5; exec sleep 30"), 5);
  EXPECT_EQ(rendezvous.rounds(), 2);
  ASSERT_EQ(rendezvous.failures.size(), 2u);
  EXPECT_TRUE(rendezvous.failures[1].final);
  EXPECT_NE(rendezvous.failures[1].report.find("exit code 5"), std::string::npos)
      << rendezvous.failures[1].report;
}

TEST(AgentTest, ARoundEndedElsewhereStopsTheWorkersAndJoinsAgainWithoutAFailure) {
  FakeRendezvous rendezvous;
  rendezvous.elsewhere[0] = RoundEnd{.kind = Kind::NodeLost, .node = "other"};
  // Round 0's workers would sleep for ever; the lost node ends that round.
  EXPECT_EQ(
      runAgent(rendezvous, "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exec sleep 30; exit 0"), 0);
  EXPECT_EQ(rendezvous.rounds(), 2);
  EXPECT_TRUE(rendezvous.failures.empty());
}

// Each round's workers reach the store through the port of their attempt's key space, and the
// job's space is closed as the agent exits.
TEST(AgentTest, EachRoundsWorkersGetTheirAttemptsPortAndTheJobsSpaceCloses) {
  FakeRendezvous rendezvous;
  rendezvous.maxRestarts = 1;
  AgentOptions options =
      shellOptions(rendezvous,
                   "[ \"$MASTER_PORT\" = $((40000 + TORCHELASTIC_RESTART_COUNT)) ] || exit 9; "
                   "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exit 3; exit 0");
  std::vector<int> opened, closed;
  options.attemptSpaces = AttemptSpaces{
      .open = [&](const rendezvous::World& world) -> std::optional<uint16_t> {
        EXPECT_EQ(world.storePort, 1);
        opened.push_back(world.round);
        return static_cast<uint16_t>(40000 + world.round);
      },
      .close = [&](const rendezvous::World& world) { closed.push_back(world.round); },
  };
  EXPECT_EQ(Agent(options, rendezvous).run(), 0);
  ASSERT_EQ(rendezvous.failures.size(), 1u);
  EXPECT_EQ(rendezvous.failures[0].exitCode, 3);
  EXPECT_EQ(opened, (std::vector<int>{0, 1}));
  EXPECT_EQ(closed, (std::vector<int>{1}));
}

// A round that is over before its space opened (a later round's is open), or whose store is out
// of reach, starts no worker and counts no failure: the round's end decides what follows.
TEST(AgentTest, ARoundWithoutItsSpaceRunsNoWorkerAndTheNextRoundDoes) {
  for (const bool reachable : {true, false}) {
    FakeRendezvous rendezvous;
    if (reachable) rendezvous.elsewhere[0] = RoundEnd{.kind = Kind::NodeJoined, .node = "n"};
    StartMarks marks;
    AgentOptions options = shellOptions(rendezvous, marks.mark() + "exit 0");
    options.attemptSpaces = AttemptSpaces{
        .open = [&](const rendezvous::World& world) -> std::optional<uint16_t> {
          if (world.round > 0) return 40000;
          if (!reachable) throw NetworkError("connection refused");
          return std::nullopt;
        },
        .close = [](const rendezvous::World&) {},
    };
    // Unreachable: the agent reports the store's node lost, which ends round 0.
    EXPECT_EQ(Agent(options, rendezvous).run(), 0);
    EXPECT_EQ(rendezvous.rounds(), 2) << reachable;
    EXPECT_TRUE(rendezvous.failures.empty());
    EXPECT_EQ(rendezvous.successes, 1);
    EXPECT_EQ(marks.count(), 2u);  // round 1's two workers alone
  }
}

TEST(AgentTest, AJobFinishedElsewhereStopsTheWorkersAndExits0) {
  FakeRendezvous rendezvous;
  rendezvous.elsewhere[0] = RoundEnd{.kind = Kind::Finished};
  EXPECT_EQ(runAgent(rendezvous, "exec sleep 30"), 0);
  EXPECT_EQ(rendezvous.rounds(), 1);
  EXPECT_EQ(rendezvous.successes, 0);
}

// As torchrun 2.x: every worker gets the signals that stop the job, torchrun's default four
// unless --signals-to-handle names others.
TEST(AgentTest, WorkersGetTheSignalsToHandle) {
  FakeRendezvous defaults;
  EXPECT_EQ(runAgent(defaults,
                     "[ \"$TORCHELASTIC_SIGNALS_TO_HANDLE\" = "
                     "SIGTERM,SIGINT,SIGHUP,SIGQUIT ] || exit 3"),
            0);
  FakeRendezvous named;
  AgentOptions options =
      shellOptions(named, "[ \"$TORCHELASTIC_SIGNALS_TO_HANDLE\" = SIGTERM,SIGUSR1 ] || exit 3");
  options.signalsToHandle = std::vector<int>{SIGTERM, SIGUSR1};
  EXPECT_EQ(Agent(options, named).run(), 0);
}

TEST(AgentTest, AJobThatEndedWhileJoiningStartsNoWorker) {
  FakeRendezvous rendezvous;
  rendezvous.maxRestarts = 1;
  rendezvous.whileJoining[1] = RoundEnd{
      .kind = Kind::WorkerFailed, .exitCode = 4, .final = true, .report = "dlrun: failed\n"};
  // Round 0 fails (not final); the job fails for good elsewhere before round 1 forms.
  EXPECT_EQ(runAgent(rendezvous, "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] && exit 3; exit 0"), 4);
  EXPECT_EQ(rendezvous.rounds(), 2);
  EXPECT_EQ(rendezvous.successes, 0);
}

TEST(AgentTest, ASignalToTheAgentIsReportedAndStopsTheJob) {
  FakeRendezvous rendezvous;
  // A worker sends SIGINT to its parent, the agent (this test process), as Ctrl-C would.
  EXPECT_EQ(runAgent(rendezvous, "[ \"$LOCAL_RANK\" = 0 ] && kill -INT $PPID; exec sleep 30"),
            128 + SIGINT);
  EXPECT_EQ(rendezvous.stops, std::vector<int>{SIGINT});
  EXPECT_TRUE(rendezvous.failures.empty());
  EXPECT_EQ(rendezvous.rounds(), 1);
}

TEST(AgentTest, AJobStoppedElsewhereExitsWithTheStoppersCode) {
  FakeRendezvous rendezvous;
  rendezvous.elsewhere[0] = rendezvous::jobStopped(SIGTERM, "other");
  EXPECT_EQ(runAgent(rendezvous, "exec sleep 30"), 128 + SIGTERM);
  EXPECT_TRUE(rendezvous.stops.empty());
  EXPECT_EQ(rendezvous.rounds(), 1);
}

TEST(AgentTest, ASignalAfterAStopElsewhereEndsWithThatStopAndReportsNone) {
  // scancel signals every node, not all at once: this node hears of another's stop first, and
  // its own SIGTERM arrives while its workers stop (here the workers send it), when the store
  // may be gone with the node that served it. The job's stop is the other node's.
  FakeRendezvous rendezvous;
  rendezvous.nproc = 1;
  rendezvous.elsewhere[0] = rendezvous::jobStopped(SIGINT, "other");
  StartMarks marks;  // the stop arrives once the worker's trap is set
  rendezvous.elsewhereWhen = [&] { return marks.count() == 1; };
  // The worker answers the agent's SIGTERM with one to the agent, and exits at the next, which
  // the agent sends once it has taken its own. Its sleep is out of the group the agent signals.
  EXPECT_EQ(runAgent(rendezvous,
                     "n=0; trap 'n=$((n+1)); if [ $n = 1 ]; then kill -TERM $PPID; "
                     "else kill $s; exit 0; fi' TERM; setsid sleep 10 & s=$!; " +
                         marks.mark() + "while kill -0 $s 2>/dev/null; do wait $s; done"),
            128 + SIGINT);
  EXPECT_TRUE(rendezvous.stops.empty());
  EXPECT_EQ(rendezvous.rounds(), 1);
}

// A stop while the workers stop (here the agent's SIGTERM after a worker's failure) keeps the
// first stop's deadline: SIGKILL comes --stop-timeout after the first, not after the second.
TEST(AgentTest, ASecondStopKeepsTheFirstStopsDeadline) {
  FakeRendezvous rendezvous;
  StartMarks marks;
  AgentOptions options = shellOptions(
      rendezvous,
      // Rank 1 ignores SIGTERM; at the first it waits 2 s, then stops the agent itself. Rank 0
      // fails once rank 1's trap is set. Short sleeps in the loop: bash runs a trap only once
      // the command in the foreground is done, so the second stop comes 2 s after the first.
      "if [ \"$LOCAL_RANK\" = 0 ]; then until [ -e " + marks.dir().string() +
          "/started_1 ]; do sleep 0.01; done; exit 1; fi; "
          "n=0; trap 'n=$((n+1)); if [ $n = 1 ]; then sleep 2; kill -TERM $PPID; fi' TERM; " +
          marks.mark() + "while :; do sleep 0.05; done");
  options.stopTimeout = std::chrono::seconds(4);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Agent(options, rendezvous).run(), 128 + SIGTERM);
  // Killed 4 s after the failure; a grace restarted by the second stop would end it after 6.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(5000));
  EXPECT_EQ(rendezvous.stops, std::vector<int>{SIGTERM});
}

TEST(AgentTest, ABadConfigurationInTheRendezvousExits2) {
  FakeRendezvous rendezvous;
  rendezvous.beforeJoin = [](int) -> void { throw ConfigError("shape conflict"); };
  EXPECT_EQ(runAgent(rendezvous, "exit 0"), 2);
}

TEST(AgentTest, AnyOtherExceptionInTheRendezvousExits1) {
  FakeRendezvous rendezvous;
  rendezvous.beforeJoin = [](int) -> void { throw std::runtime_error("not a dlrun::Error"); };
  EXPECT_EQ(runAgent(rendezvous, "exit 0"), 1);
  FakeRendezvous other;
  other.beforeJoin = [](int) -> void { throw 42; };
  EXPECT_EQ(runAgent(other, "exit 0"), 1);
}

TEST(AgentTest, ARendezvousFailureBetweenRoundsExits1) {
  FakeRendezvous rendezvous;
  rendezvous.maxRestarts = 1;
  rendezvous.beforeJoin = [](int round) {
    if (round == 1) throw NetworkError("the store is gone");
  };
  EXPECT_EQ(runAgent(rendezvous, "[ \"$LOCAL_RANK\" = 1 ] && exit 3; exec sleep 30"), 1);
  EXPECT_EQ(rendezvous.rounds(), 1);
}

TEST(AgentTest, ManyWorkersStartInBatchesAndAllFinish) {
  FakeRendezvous rendezvous;
  rendezvous.nproc = 300;  // several batches
  StartMarks marks;
  EXPECT_EQ(runAgent(rendezvous, marks.mark() + "exit 0"), 0);
  EXPECT_EQ(marks.count(), 300u);
  EXPECT_EQ(rendezvous.successes, 1);
}

TEST(AgentTest, ATfConfigOverTheKernelsLimitIsLeftOutUnderAuto) {
  FakeRendezvous rendezvous;
  largeJob(rendezvous, 8000);  // about 144 KB: over the 128 KiB a string may take
  EXPECT_EQ(runAgent(rendezvous, "[ -z \"$TF_CONFIG\" ] || exit 9; exit 0"), 0);
  FakeRendezvous small;
  largeJob(small, 100);
  EXPECT_EQ(runAgent(small, "[ -n \"$TF_CONFIG\" ] || exit 9; exit 0"), 0);
}

TEST(AgentTest, ATfConfigThatCannotFitUnderAlwaysExits2BeforeAnyWorkerStarts) {
  FakeRendezvous rendezvous;
  largeJob(rendezvous, 8000);
  StartMarks marks;
  AgentOptions options = shellOptions(rendezvous, marks.mark() + "exit 0");
  options.tfConfig = TfConfigMode::Always;
  EXPECT_EQ(Agent(options, rendezvous).run(), 2);
  EXPECT_EQ(marks.count(), 0u);
  EXPECT_EQ(rendezvous.rounds(), 1);
}

TEST(AgentTest, AnEnvironmentOverTheExecLimitExits127BeforeAnyWorkerStarts) {
  FakeRendezvous rendezvous;
  StartMarks marks;
  // The agent's own environment, which every worker inherits, holds one string too long.
  ::setenv("DLRUN_AGENT_TEST_HUGE", std::string(200 * 1024, 'x').c_str(), 1);
  Agent agent(shellOptions(rendezvous, marks.mark() + "exit 0"), rendezvous);
  ::unsetenv("DLRUN_AGENT_TEST_HUGE");
  EXPECT_EQ(agent.run(), 127);
  EXPECT_EQ(marks.count(), 0u);
}

// torch's file-based timer, written to as torch's client writes (one JSON line per request).
// The agent reads its environment when it is made: TORCHELASTIC_ENABLE_FILE_TIMER=1 then.
// The scripts write $$$$ for the shell's $$ (its pid): worker arguments are read as torchrun
// reads them, where $$ is an escaped $ (agents/worker_args.h).
int runAgentWithFileTimer(FakeRendezvous& rendezvous, const std::string& script) {
  ::setenv("TORCHELASTIC_ENABLE_FILE_TIMER", "1", 1);
  Agent agent(shellOptions(rendezvous, script), rendezvous);
  ::unsetenv("TORCHELASTIC_ENABLE_FILE_TIMER");
  return agent.run();
}

// printf's format of a timer request expired long ago, for `pid` (a number, or %d: printf's
// argument).
std::string expiredTimer(const std::string& pid, const std::string& scope, int sig) {
  return R"({"version": 1, "pid": )" + pid + R"(, "scope_id": ")" + scope +
         R"(", "expiration_time": 0, "signal": )" + std::to_string(sig) + "}\\n";
}

TEST(AgentTest, AnExpiredFileTimerKillsItsWorkerAndTheReportNamesIt) {
  FakeRendezvous rendezvous;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(runAgentWithFileTimer(rendezvous,
                                  "[ \"$LOCAL_RANK\" = 0 ] && exit 0; printf '" +
                                      expiredTimer("%d", "stuck", SIGKILL) +
                                      "' $$$$ > \"$TORCHELASTIC_TIMER_FILE\" && exec sleep 30"),
            128 + SIGKILL);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ASSERT_EQ(rendezvous.failures.size(), 1u);
  EXPECT_EQ(rendezvous.failures[0].rank, 1);
  EXPECT_NE(rendezvous.failures[0].report.find(
                "dlrun: timer 'stuck' expired at 1970-01-01 00:00:00.000 UTC; dlrun sent "
                "SIGKILL to pid "),
            std::string::npos)
      << rendezvous.failures[0].report;
}

// torch's server signals any pid; dlrun only its workers and their process groups. The worker
// asks for a process of the test's and for itself in one write, so both expire in one check:
// when the worker is killed, the other request has been dealt with too.
TEST(AgentTest, AFileTimerOfAProcessOutsideTheWorkersSignalsNothing) {
  const pid_t outsider = ::fork();
  ASSERT_GE(outsider, 0);
  if (outsider == 0) {
    ::pause();
    ::_exit(0);
  }
  FakeRendezvous rendezvous;
  rendezvous.nproc = 1;
  EXPECT_EQ(
      runAgentWithFileTimer(
          rendezvous, "printf '" + expiredTimer(std::to_string(outsider), "elsewhere", SIGKILL) +
                          expiredTimer("%d", "own", SIGKILL) +
                          "' $$$$ > \"$TORCHELASTIC_TIMER_FILE\" && "
                          "exec sleep 30"),
      128 + SIGKILL);
  int status = 0;
  EXPECT_EQ(::waitpid(outsider, &status, WNOHANG), 0) << "the outsider was signalled";
  ::kill(outsider, SIGKILL);
  ::waitpid(outsider, &status, 0);
}

TEST(AgentTest, TooManyWorkersForTheDescriptorLimitExit2WithoutJoining) {
  rlimit files{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &files), 0);
  if (files.rlim_max > (1u << 20)) GTEST_SKIP() << "the hard descriptor limit is too high";
  FakeRendezvous rendezvous;
  rendezvous.nproc = static_cast<int>(files.rlim_max);  // two pipes each: twice too many
  EXPECT_EQ(runAgent(rendezvous, "exit 0"), 2);
  EXPECT_EQ(rendezvous.rounds(), 0);
}

TEST(AgentTest, DescriptorNeedsCountPipesLogFilesAndStoreConnections) {
  AgentOptions options{.command = {"true"}, .nprocPerNode = 4};
  EXPECT_EQ(descriptorNeeds(options, 10).workerFiles, 8);  // stdout (prefixed) and stderr
  EXPECT_EQ(descriptorNeeds(options, 10).inUse, 10);
  options.logLinePrefixTemplate = "";
  EXPECT_EQ(descriptorNeeds(options, 0).workerFiles, 4);  // stdout as it is: stderr alone
  options.logDir = "/logs";
  options.tee.all = Streams::Both;
  EXPECT_EQ(descriptorNeeds(options, 0).workerFiles, 16);  // both piped, two files each
  EXPECT_EQ(descriptorNeeds(options, 0).storeClients, 0);
  options.servesStore = true;
  EXPECT_EQ(descriptorNeeds(options, 0).storeClients, 4);
}

}  // namespace
}  // namespace dlrun::agents
