// The checks before every round (agents/health_check.h): the user's command (its exit status,
// its last line as the reason, its time bounded, everything it started killed), free space and
// memory against --health-min-free.
#include "agents/health_check.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;

HealthOptions command(const std::string& cmd,
                      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  return {.command = cmd, .timeout = timeout, .minFreeBytes = 0};
}

// Whether `pid` ends within 5 s (killed, it may stay a zombie until init reaps it).
bool gone(pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string pidField, name, state;
    if (!(stat >> pidField >> name >> state) || state == "Z") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(HealthCheck, ACheckThatExitsZeroIsHealthy) {
  EXPECT_EQ(checkHealth(command("echo fine")), std::nullopt);
  EXPECT_EQ(checkHealth(HealthOptions{.minFreeBytes = 0}), std::nullopt);
}

TEST(HealthCheck, AFailedCheckSaysItsLastLine) {
  EXPECT_EQ(checkHealth(command("echo looking; echo 'GPU 3 is gone' >&2; exit 3")),
            "--health-check 'echo looking; echo 'GPU 3 is gone' >&2; exit 3' failed (exit code "
            "3): GPU 3 is gone");
  EXPECT_EQ(checkHealth(command("printf 'first\\nlast line\\n\\n'; false")),
            "--health-check 'printf 'first\\nlast line\\n\\n'; false' failed (exit code 1): last "
            "line");
  EXPECT_EQ(checkHealth(command("exit 9")), "--health-check 'exit 9' failed (exit code 9)");
}

TEST(HealthCheck, ACheckThatHangsIsKilledWithWhatItStartedAndFails) {
  const fs::path pidFile =
      fs::temp_directory_path() / ("health_check_test." + std::to_string(::getpid()));
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(checkHealth(command("sleep 60 & echo $! > " + pidFile.string() + "; wait",
                                std::chrono::milliseconds(300))),
            "--health-check 'sleep 60 & echo $! > " + pidFile.string() +
                "; wait' did not finish in 0.3 s");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  pid_t sleeper = 0;
  std::ifstream(pidFile) >> sleeper;
  fs::remove(pidFile);
  ASSERT_GT(sleeper, 0);
  EXPECT_TRUE(gone(sleeper)) << "the check's child still runs";
}

TEST(HealthCheck, TheExitStatusIsReadFromTheWrappersLine) {
  EXPECT_EQ(readCheckOutput("hello\n\ndlrun-health-check-exit 4\n", "").exitCode, 4);
  EXPECT_EQ(readCheckOutput("hello\n\ndlrun-health-check-exit 4\n", "").reason, "hello");
  EXPECT_EQ(readCheckOutput("hello\n", "bad disk\n").exitCode, std::nullopt);  // killed
  EXPECT_EQ(readCheckOutput("x dlrun-health-check-exit 0\n", "").exitCode, std::nullopt);
}

TEST(HealthCheck, TooLittleSpaceOrMemoryIsNamed) {
  EXPECT_EQ(spaceProblem("in /logs", 2ull << 30, 1ull << 30), std::nullopt);
  EXPECT_EQ(spaceProblem("in /logs", 1ull << 29, 1ull << 30),
            "only 0.5 GiB free in /logs, under --health-min-free's 1.0 GiB");
  EXPECT_EQ(availableMemory("MemTotal: 100 kB\nMemAvailable:    2048 kB\n"), 2048u * 1024);
  EXPECT_EQ(availableMemory("MemTotal: 100 kB\n"), std::nullopt);
  const fs::path meminfo =
      fs::temp_directory_path() / ("health_meminfo." + std::to_string(::getpid()));
  std::ofstream(meminfo) << "MemAvailable: 1024 kB\n";
  HealthOptions options{.minFreeBytes = 1ull << 30, .meminfo = meminfo};
  EXPECT_EQ(checkHealth(options), "only 0.0 GiB free memory, under --health-min-free's 1.0 GiB");
  options.dirs = {"/"};
  options.minFreeBytes = ~0ull;
  EXPECT_NE(checkHealth(options).value_or("").find("free in /, under"), std::string::npos);
  fs::remove(meminfo);
}

}  // namespace
}  // namespace dlrun::agents
