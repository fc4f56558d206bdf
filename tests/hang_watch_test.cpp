// The hang rules (agents/hang_watch.h) as pure functions: when a worker counts as hung, whom a
// report suspects, and what the summary says; and the watcher's collection (hang_watcher.h)
// writing into the round it was asked for.
#include "agents/hang_watch.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

#include "agents/hang_watcher.h"
#include "common/error.h"

namespace dlrun::agents {
namespace {

using namespace std::chrono_literals;

TEST(ProgressTrack, HungOnlyAfterProgressThenSilenceForTheTimeout) {
  const auto t0 = Clock::time_point{} + 1h;
  ProgressTrack track;
  track.observe(ProgressSource::Board, {.marker = 0}, t0);  // nothing yet
  EXPECT_FALSE(track.reported());
  EXPECT_FALSE(track.hung(t0 + 1h, 5s));  // never reported: never hung
  track.observe(ProgressSource::Board, {.marker = 1, .step = 3}, t0);
  EXPECT_TRUE(track.reported());
  EXPECT_EQ(track.step(), 3);
  // The same beat: no progress.
  track.observe(ProgressSource::Board, {.marker = 1, .step = 3}, t0 + 4s);
  EXPECT_FALSE(track.hung(t0 + 4s, 5s));
  EXPECT_TRUE(track.hung(t0 + 5s, 5s));
  // The heartbeat file is a second source: its change is progress too.
  track.observe(ProgressSource::Heartbeat, {.marker = 1}, t0 + 6s);
  EXPECT_FALSE(track.hung(t0 + 6s, 5s));
  EXPECT_EQ(track.step(), 3);  // a touch without a number keeps the step
  track.observe(ProgressSource::Board, {.marker = 2, .step = 4, .inCollective = true}, t0 + 7s);
  EXPECT_TRUE(track.inCollective());
  EXPECT_EQ(track.silentFor(t0 + 9s), 2s);
}

RankReport rank(int r, double silent, bool inCollective, bool reported = true) {
  RankReport report;
  report.rank = r;
  report.node = "n" + std::to_string(r / 2);
  report.reported = reported;
  report.step = 12;
  report.silentSeconds = silent;
  if (inCollective) report.collective = "all_reduce";
  return report;
}

TEST(ProgressTrack, AReplacementStartsFromItsPredecessorsBeatsAndASurvivorsSilenceAnew) {
  const auto t0 = Clock::time_point{} + 1h;
  ProgressTrack replacement;
  replacement.startFrom(ProgressSource::Board, 40);  // the slot's beats, its predecessor's
  replacement.observe(ProgressSource::Board, {.marker = 40, .step = 9}, t0);
  EXPECT_FALSE(replacement.reported());
  EXPECT_FALSE(replacement.hung(t0 + 1h, 5s));
  replacement.observe(ProgressSource::Board, {.marker = 41, .step = 10}, t0 + 1s);
  EXPECT_TRUE(replacement.reported());

  ProgressTrack survivor;
  survivor.observe(ProgressSource::Board, {.marker = 7}, t0);
  EXPECT_TRUE(survivor.hung(t0 + 6s, 5s));
  survivor.silentSince(t0 + 6s);  // it waited for the one replaced
  EXPECT_FALSE(survivor.hung(t0 + 10s, 5s));
  EXPECT_TRUE(survivor.hung(t0 + 11s, 5s));
}

TEST(HangSuspect, ARankOutsideACollectiveBeforeTheOnesItHoldsUp) {
  // Rank 3 sleeps before its all-reduce; the others wait in it, some of them longer.
  const std::vector<RankReport> reports{rank(0, 9.0, true), rank(1, 9.5, true), rank(2, 9.1, true),
                                        rank(3, 5.0, false)};
  EXPECT_EQ(suspect(reports), 3u);
}

TEST(HangSuspect, OtherwiseTheLongestSilentThenTheLowestRank) {
  EXPECT_EQ(suspect({rank(0, 5.0, true), rank(1, 7.0, true), rank(2, 6.0, true)}), 1u);
  EXPECT_EQ(suspect({rank(0, 5.0, false), rank(1, 5.0, false)}), 0u);
  // Ranks that never reported progress are not suspected; with none reported, nobody is.
  EXPECT_EQ(suspect({rank(0, 0, false, false), rank(1, 6.0, true)}), 1u);
  EXPECT_EQ(suspect({rank(0, 0, false, false)}), std::nullopt);
}

TEST(HangSuspect, AStoppedRankFirstThenOneBehindTheOthers) {
  // Rank 2 was stopped inside its all-reduce, after its peers began waiting in theirs.
  std::vector<RankReport> reports{rank(0, 5.1, true), rank(1, 5.0, false), rank(2, 4.9, true)};
  reports[2].stopped = true;
  EXPECT_EQ(suspect(reports), 2u);
  // Rank 0 went on to step 13 (its part of the all-reduce was done): the ranks at step 12 hold
  // it up, the one outside a collective first.
  std::vector<RankReport> ahead{rank(0, 9.0, false), rank(1, 5.0, true), rank(2, 5.0, false)};
  ahead[0].step = 13;
  EXPECT_EQ(suspect(ahead), 2u);
  EXPECT_NE(hangSummary(reports, 5.0, 1, 1).find("suspect: rank 2 on n1, last step 12, stopped"),
            std::string::npos);
}

TEST(HangReports, EncodeDecodeRoundTripsAndBadTextIsAProtocolError) {
  RankReport r = rank(3, 5.25, false);
  r.topFrames = {"#0 clock_nanosleep", "#1 sleepForeverForTesting"};
  r.stackFile = "/logs/stacks/rank_3.txt";
  RankReport quiet = rank(0, 0, true, false);
  quiet.step.reset();
  quiet.stopped = true;
  const auto back = decodeRankReports(encodeRankReports({r, quiet}));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].rank, 3);
  EXPECT_EQ(back[0].node, "n1");
  EXPECT_EQ(back[0].step, 12);
  EXPECT_DOUBLE_EQ(back[0].silentSeconds, 5.25);
  EXPECT_EQ(back[0].topFrames, r.topFrames);
  EXPECT_EQ(back[0].stackFile, r.stackFile);
  EXPECT_FALSE(back[0].collective);
  EXPECT_FALSE(back[0].stopped);
  EXPECT_TRUE(back[1].stopped);
  EXPECT_FALSE(back[1].reported);
  EXPECT_FALSE(back[1].step);
  EXPECT_EQ(back[1].collective, "all_reduce");
  EXPECT_THROW(decodeRankReports("[{\"rank\": 1}]"), ProtocolError);
  EXPECT_THROW(decodeRankReports("not json"), ProtocolError);
}

TEST(HangSummary, NamesTheSuspectItsFramesAndTheOthers) {
  RankReport stuck = rank(3, 5.0, false);
  stuck.topFrames = {"#1 sleepForeverForTesting"};
  const std::string text =
      hangSummary({rank(0, 9.0, true), rank(1, 9.0, true), rank(2, 9.0, true), stuck}, 5.0, 2, 2);
  EXPECT_NE(text.find("suspect: rank 3 on n1, last step 12, silent 5.0 s, not in a collective"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("sleepForeverForTesting"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 0 on n0, last step 12, silent 9.0 s, waiting in all_reduce"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("sent no report"), std::string::npos) << text;
  EXPECT_NE(hangSummary({stuck}, 5.0, 1, 2).find("1 of 2 nodes sent no report in time"),
            std::string::npos);
}

TEST(HangSummary, ManyRanksAreCutShort) {
  std::vector<RankReport> many;
  for (int r = 0; r < 100; ++r) many.push_back(rank(r, 6.0, true));
  const std::string text = hangSummary(many, 5.0, 50, 50);
  EXPECT_NE(text.find("... and 83 more"), std::string::npos) << text;
}

// A rendezvous the collection below never needs (it shares nothing).
class NoRendezvous : public rendezvous::Rendezvous {
 public:
  rendezvous::JoinResult next() override { throw Error("unused"); }
  rendezvous::RoundEnd awaitEnd() override { throw Error("unused"); }
  void reportFailure(rendezvous::RoundEnd) override {}
  void reportSuccess() override {}
  rendezvous::RoundEnd reportStop(int) override { throw Error("unused"); }
  void reportLost(const std::string&) override {}
  void shareWithRound(rendezvous::RoundTopic, const std::string&) override {}
  std::vector<std::string> gatherFromRound(rendezvous::RoundTopic,
                                           std::chrono::milliseconds) override {
    return {};
  }
  void interrupt() override {}
};

// The next round may be set up while a collection runs (--hang-action=report): the collection
// still writes into the round it was asked for. On one CPU, first in first out, the collection's
// thread starts only once this one waits, after the next round is set up.
TEST(HangWatcher, ACollectionWritesIntoItsOwnRoundWhileTheNextIsSetUp) {
  cpu_set_t all, one;
  ASSERT_EQ(::sched_getaffinity(0, sizeof all, &all), 0);
  CPU_ZERO(&one);
  CPU_SET(::sched_getcpu(), &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof one, &one), 0);
  sched_param fifo{.sched_priority = 1}, old{};
  int oldPolicy = 0;
  ASSERT_EQ(::pthread_getschedparam(::pthread_self(), &oldPolicy, &old), 0);
  if (::pthread_setschedparam(::pthread_self(), SCHED_FIFO, &fifo) != 0) {
    ::sched_setaffinity(0, sizeof all, &all);
    GTEST_SKIP() << "real-time scheduling is not allowed here";
  }
  std::string pattern = (std::filesystem::temp_directory_path() / "hang-test-XXXXXX").string();
  const std::filesystem::path dir = ::mkdtemp(pattern.data());
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);  // run_one() waits for `done`
  NoRendezvous rendezvous;
  {
    HangWatcher watcher(io, {.timeout = 1s}, "node", rendezvous);
    auto attempt = [&](int round) { return dir / ("attempt_" + std::to_string(round)); };
    RoundSpec spec;
    std::filesystem::create_directories(dir);
    const ProgressBoard board(dir / "progress", 1);
    watcher.prepareRound(attempt(0), board, {}, spec);
    for (int round = 0; round < 20; ++round) {
      bool done = false;
      watcher.collect({}, [&] { done = true; });
      watcher.prepareRound(attempt(round + 1), board, {}, spec);
      while (!done) io.run_one();
      EXPECT_TRUE(std::filesystem::exists(attempt(round) / "stacks")) << round;
      EXPECT_FALSE(std::filesystem::exists(attempt(round + 1) / "stacks")) << round;
    }
  }
  ::pthread_setschedparam(::pthread_self(), oldPolicy, &old);
  ::sched_setaffinity(0, sizeof all, &all);
  std::filesystem::remove_all(dir);
}

// Local rank 1 waits in its all-reduce first; local rank 0 enters its own a look later and is
// then stopped (SIGSTOP). Rank 1's silence reaches the timeout first, but the stopped worker is
// the one named: it is the one the in-process recovery replaces.
TEST(HangWatcher, NamesAStoppedWorkerThoughAPeerWentSilentFirst) {
  // Two workers' processes, each pausing until its SIGKILL here, however the test ends.
  struct Children {
    pid_t pids[2] = {-1, -1};
    ~Children() {
      for (const pid_t pid : pids)
        if (pid > 0) {
          ::kill(pid, SIGKILL);
          ::waitpid(pid, nullptr, 0);
        }
    }
  } guard;
  pid_t* children = guard.pids;
  for (pid_t& pid : guard.pids) {
    pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0)
      for (;;) ::pause();
  }
  std::string pattern = (std::filesystem::temp_directory_path() / "hang-test-XXXXXX").string();
  const std::filesystem::path dir = ::mkdtemp(pattern.data());
  boost::asio::io_context io;
  NoRendezvous rendezvous;
  std::optional<HungWorker> named;
  {
    HangWatcher watcher(io, {.timeout = 1s}, "node", rendezvous);
    const ProgressBoard board(dir / "progress", 2);
    RoundSpec spec;
    watcher.prepareRound(dir / "attempt_0", board, {}, spec);
    auto reporter = [&](const char* local) {
      ::setenv("DLRUN_PROGRESS_FILE", board.path().c_str(), 1);
      ::setenv("LOCAL_RANK", local, 1);
      ProgressReporter r = ProgressReporter::fromEnvironment();
      ::unsetenv("DLRUN_PROGRESS_FILE");
      ::unsetenv("LOCAL_RANK");
      return r;
    };
    ProgressReporter stuck = reporter("0"), peer = reporter("1");
    watcher.watch({{.pid = children[0], .rank = 0, .localRank = 0},
                   {.pid = children[1], .rank = 1, .localRank = 1}},
                  [&](const HungWorker& hung) {
                    named = hung;
                    watcher.unwatch();
                  });
    // Each run_one() is one look (the watch's timer is all the io_context has).
    peer.phase(ProgressPhase::Collective);
    io.run_one();
    stuck.phase(ProgressPhase::Collective);
    io.run_one();
    ::kill(children[0], SIGSTOP);
    int status = 0;
    ASSERT_EQ(::waitpid(children[0], &status, WUNTRACED), children[0]);
    ASSERT_TRUE(WIFSTOPPED(status));
    // The peer's silence reaches the timeout within some 20 looks; 100 bound a broken watch.
    for (int looks = 0; !named && looks < 100; ++looks) io.run_one();
  }
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(named);
  EXPECT_EQ(named->rank, 0);
}

}  // namespace
}  // namespace dlrun::agents
