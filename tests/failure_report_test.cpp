// The root-cause report: reading TORCHELASTIC_ERROR_FILE in both of torch's formats (and
// surviving garbage), formatting the report, and how a process's end is described.
#include "agents/failure_report.h"
#include "common/signal_name.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;

class ErrorFileTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "failure_report_test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& contents) {
    const std::string path = (dir_ / ("error" + std::to_string(files_++) + ".json")).string();
    std::ofstream(path) << contents;
    return path;
  }

  fs::path dir_;
  int files_ = 0;
};

// What torch's @record writes (torch/distributed/elastic/multiprocessing/errors/error_handler.py).
TEST_F(ErrorFileTest, TorchRecordFormat) {
  const std::string path = write(R"({"message": {"message": "RuntimeError: boom",
      "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\", line 3",
                    "timestamp": "1700000000"}}})");
  const std::string message = readErrorFile(path);
  EXPECT_NE(message.find("RuntimeError: boom"), std::string::npos) << message;
  EXPECT_NE(message.find("Traceback (most recent call last):"), std::string::npos) << message;
  EXPECT_NE(message.find("t.py"), std::string::npos) << message;
  EXPECT_EQ(message.rfind("RuntimeError: boom", 0), 0u) << "the message comes first: " << message;
}

TEST_F(ErrorFileTest, MessageWithoutExtraInfo) {
  EXPECT_EQ(readErrorFile(write(R"({"message": {"message": "ValueError: x"}})")), "ValueError: x");
  EXPECT_EQ(readErrorFile(write(R"({"message": {"message": "E", "extraInfo": 5}})")), "E");
}

TEST_F(ErrorFileTest, PlainStringMessage) {
  EXPECT_EQ(readErrorFile(write(R"({"message": "worker ran out of memory"})")),
            "worker ran out of memory");
}

TEST_F(ErrorFileTest, MissingFileIsEmpty) {
  EXPECT_EQ(readErrorFile((dir_ / "never-written.json").string()), "");
}

// A worker may leave anything at its error file's path; the header promises "empty when the
// file is missing or unreadable", and a throw here would escape the agent's event loop.
TEST_F(ErrorFileTest, DirectoryIsEmptyNotAnException) {
  std::string message = "not called";
  EXPECT_NO_THROW(message = readErrorFile(dir_.string()));
  EXPECT_EQ(message, "");
}

TEST_F(ErrorFileTest, GarbageIsEmpty) {
  for (const std::string& contents :
       std::vector<std::string>{"", "not json", "{\"message\": ", "[1, 2]", "\"message\"",
                                "{\"other\": 1}", "{\"message\": 5}", "{\"message\": null}",
                                "{\"message\": [\"a\"]}", std::string("\x00\xff\xfe", 3)}) {
    SCOPED_TRACE(contents);
    EXPECT_EQ(readErrorFile(write(contents)), "");
  }
}

// --- formatFailureReport -----------------------------------------------------------------

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

TEST(FailureReport, ExitCode) {
  WorkerFailure f;
  f.rank = 5;
  f.localRank = 1;
  f.status = ExitStatus{false, 3};
  const std::string report = formatFailureReport(f, 0);
  ASSERT_FALSE(report.empty());
  EXPECT_EQ(report.back(), '\n');
  const auto first = lines(report).front();
  EXPECT_NE(first.find("rank 5"), std::string::npos) << first;
  EXPECT_NE(first.find("local rank 1"), std::string::npos) << first;
  EXPECT_NE(first.find("exit code 3"), std::string::npos) << first;
  EXPECT_EQ(first.find("restart"), std::string::npos) << first;
}

TEST(FailureReport, SignalAndRestarts) {
  WorkerFailure f;
  f.rank = 0;
  f.status = ExitStatus{true, SIGSEGV};
  const std::string report = formatFailureReport(f, 2);
  EXPECT_NE(report.find("SIGSEGV"), std::string::npos) << report;
  EXPECT_NE(report.find("2 restart"), std::string::npos) << report;
}

TEST(FailureReport, ErrorFileAndStderrTailEveryLinePrefixed) {
  WorkerFailure f;
  f.rank = 2;
  f.status = ExitStatus{false, 1};
  f.errorMessage = "RuntimeError: boom\nTraceback line 1\nTraceback line 2";
  f.stderrTail = {"warning: something", "fatal: the end"};
  const std::string report = formatFailureReport(f, 0);
  for (const auto& line : lines(report)) EXPECT_EQ(line.rfind("dlrun: ", 0), 0u) << line;
  for (const std::string part : {"RuntimeError: boom", "Traceback line 1", "Traceback line 2",
                                 "warning: something", "fatal: the end"})
    EXPECT_NE(report.find(part), std::string::npos) << part << "\n" << report;
  // The error file comes before the stderr tail.
  EXPECT_LT(report.find("RuntimeError: boom"), report.find("fatal: the end"));
}

// The timer line comes right after the first, before the error file.
TEST(FailureReport, ExpiredTimerFollowsTheFirstLine) {
  WorkerFailure f;
  f.rank = 1;
  f.status = ExitStatus{true, SIGKILL};
  f.errorMessage = "RuntimeError: boom";
  f.expiredTimer = "timer 'slow_block' expired at 2024-05-01 12:00:03.250 UTC";
  const auto report = lines(formatFailureReport(f, 0));
  ASSERT_GE(report.size(), 2u);
  EXPECT_EQ(report[1], "dlrun: timer 'slow_block' expired at 2024-05-01 12:00:03.250 UTC");
}

TEST(FailureReport, NothingExtraWhenThereIsNothingToShow) {
  WorkerFailure f;
  f.status = ExitStatus{false, 1};
  EXPECT_EQ(lines(formatFailureReport(f, 0)).size(), 1u);
}

// --- ExitStatus and signal names ---------------------------------------------------------

int waitStatusOfChild(void (*body)()) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(99);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

TEST(ExitStatus, FromARealExit) {
  const auto status = ExitStatus::fromWaitStatus(waitStatusOfChild([] { ::_exit(3); }));
  EXPECT_FALSE(status.signaled);
  EXPECT_EQ(status.value, 3);
  EXPECT_FALSE(status.success());
  EXPECT_EQ(status.shellCode(), 3);
  EXPECT_EQ(status.describe(), "exit code 3");
}

TEST(ExitStatus, FromARealSignal) {
  const auto status = ExitStatus::fromWaitStatus(waitStatusOfChild([] { ::raise(SIGKILL); }));
  EXPECT_TRUE(status.signaled);
  EXPECT_EQ(status.value, SIGKILL);
  EXPECT_FALSE(status.success());
  EXPECT_EQ(status.shellCode(), 128 + SIGKILL);
  EXPECT_EQ(status.describe(), "signal SIGKILL");
}

TEST(ExitStatus, SuccessOnlyForExitZero) {
  EXPECT_TRUE(ExitStatus::fromWaitStatus(waitStatusOfChild([] { ::_exit(0); })).success());
  EXPECT_EQ((ExitStatus{false, 0}).shellCode(), 0);
}

TEST(SignalName, KnownSignals) {
  EXPECT_EQ(signalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(signalName(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(signalName(SIGUSR1), "SIGUSR1");
}

TEST(SignalName, AJobCatchesItsStopSignalsTheDefaultsAndTheUserSignals) {
  const std::set<int> plain{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
  EXPECT_EQ(jobSignals(kDefaultStopSignals), plain);
  EXPECT_EQ(jobSignals({SIGTERM, SIGUSR1}), plain);  // left out: still caught, then ignored
  std::set<int> more = plain;
  more.insert(SIGXCPU);
  EXPECT_EQ(jobSignals({SIGXCPU}), more);
}

}  // namespace
}  // namespace dlrun::agents
