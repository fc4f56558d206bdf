// torch's file-based timer: parsing the lines torch's FileTimerClient writes (and refusing
// malformed ones in one line), the timer table with torch's FileTimerServer semantics, and the
// FIFO server on an io_context.
#include "agents/file_timer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/asio.h"
#include "common/clock.h"
#include "common/error.h"

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;

// --- parsing -----------------------------------------------------------------------------

// Written by torch 1.13's FileTimerRequest.to_json(); torch 2.x writes the same fields.
TEST(ParseTimerRequest, TorchAcquire) {
  const TimerRequest r = parseTimerRequest(
      R"({"version": 1, "pid": 1234, "scope_id": "slow_block", "expiration_time": 1700000000.25, "signal": 9})");
  EXPECT_EQ(r.pid, 1234);
  EXPECT_EQ(r.scope, "slow_block");
  EXPECT_DOUBLE_EQ(r.expiration, 1700000000.25);
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_FALSE(r.release());
}

TEST(ParseTimerRequest, TorchRelease) {
  const TimerRequest r = parseTimerRequest(
      R"({"version": 1, "pid": 1234, "scope_id": "slow_block", "expiration_time": -1, "signal": 0})");
  EXPECT_TRUE(r.release());
  EXPECT_EQ(r.signal, 0);
}

TEST(ParseTimerRequest, IntegerExpirationEscapedScopeAndNoVersion) {
  // expires() without a scope names it "file#line"; an acquire() may pass a whole number.
  const TimerRequest r = parseTimerRequest(
      R"({"pid": 7, "scope_id": "caf\u00e9 \"q\" /w/t.py#12", "expiration_time": 1700000000, "signal": 15})");
  EXPECT_EQ(r.scope, "café \"q\" /w/t.py#12");
  EXPECT_DOUBLE_EQ(r.expiration, 1700000000.0);
  EXPECT_EQ(r.signal, SIGTERM);
  // A negative signal is torch's "do not kill", not an error.
  EXPECT_EQ(parseTimerRequest(R"({"pid": 7, "scope_id": "s", "expiration_time": 1, "signal": -3})")
                .signal,
            -3);
}

void expectRefused(const std::string& line, const std::string& why) {
  try {
    parseTimerRequest(line);
    ADD_FAILURE() << "accepted: " << line;
  } catch (const ProtocolError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(why), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
}

TEST(ParseTimerRequest, MalformedLines) {
  expectRefused("", "is not a JSON object");
  expectRefused("not json", "is not a JSON object: not json");
  expectRefused(R"({"pid": 1, "scope_id": "s")", "is not a JSON object");  // cut short
  expectRefused("[1, 2]", "is not a JSON object");
  expectRefused(R"({"scope_id": "s", "expiration_time": 1, "signal": 9})", "has no \"pid\"");
  expectRefused(R"({"pid": 1, "expiration_time": 1, "signal": 9})", "has no \"scope_id\"");
  expectRefused(R"({"pid": 1, "scope_id": "s", "signal": 9})", "has no \"expiration_time\"");
  expectRefused(R"({"pid": 1, "scope_id": "s", "expiration_time": 1})", "has no \"signal\"");
}

TEST(ParseTimerRequest, BadTypesAndRanges) {
  const std::string pid = "\"pid\" must be an integer from 1";
  expectRefused(R"({"pid": "12", "scope_id": "s", "expiration_time": 1, "signal": 9})", pid);
  expectRefused(R"({"pid": 1.5, "scope_id": "s", "expiration_time": 1, "signal": 9})", pid);
  // kill(2) takes 0 and negative pids for process groups, -1 for every process.
  expectRefused(R"({"pid": 0, "scope_id": "s", "expiration_time": 1, "signal": 9})", pid);
  expectRefused(R"({"pid": -1, "scope_id": "s", "expiration_time": 1, "signal": 9})", pid);
  expectRefused(R"({"pid": 18446744073709551615, "scope_id": "s", "expiration_time": 1,
                    "signal": 9})",
                pid);
  expectRefused(R"({"pid": 1, "scope_id": 5, "expiration_time": 1, "signal": 9})",
                "\"scope_id\" must be a string");
  expectRefused(R"({"pid": 1, "scope_id": "s", "expiration_time": "1", "signal": 9})",
                "\"expiration_time\" must be a number");
  expectRefused(R"({"pid": 1, "scope_id": "s", "expiration_time": null, "signal": 9})",
                "\"expiration_time\" must be a number");
  expectRefused(R"({"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": true})",
                "\"signal\" must be an integer");
  expectRefused(R"({"pid": 1, "scope_id": "s", "expiration_time": 1, "signal": 1000})",
                "\"signal\" must be an integer");
}

TEST(ParseTimerRequest, LongLinesAreQuotedShort) {
  const std::string line = "x" + std::string(5000, 'y');
  try {
    parseTimerRequest(line);
    FAIL() << "accepted";
  } catch (const ProtocolError& e) {
    EXPECT_LT(std::string(e.what()).size(), 300u) << e.what();
    EXPECT_NE(std::string(e.what()).find("..."), std::string::npos) << e.what();
  }
}

// --- the table ---------------------------------------------------------------------------

TimerRequest set(pid_t pid, std::string scope, double expiration, int signal = SIGKILL) {
  return {.pid = pid, .scope = std::move(scope), .expiration = expiration, .signal = signal};
}

TimerRequest release(pid_t pid, std::string scope) {
  return {.pid = pid, .scope = std::move(scope), .expiration = -1, .signal = 0};
}

TEST(TimerTable, NothingExpiresBeforeItsTime) {
  TimerTable table;
  table.apply(set(10, "a", 100));
  EXPECT_TRUE(table.takeExpired(99.9).empty());
  EXPECT_EQ(table.size(), 1u);
  const auto expired = table.takeExpired(100);  // torch: expiration_time <= now
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].pid, 10);
  EXPECT_EQ(expired[0].scope, "a");
  EXPECT_DOUBLE_EQ(expired[0].expiration, 100);
  EXPECT_EQ(expired[0].signal, SIGKILL);
  EXPECT_TRUE(table.empty());
  EXPECT_TRUE(table.takeExpired(1000).empty()) << "an expiry is reported once";
}

TEST(TimerTable, ReleaseRemovesOnlyItsScope) {
  TimerTable table;
  table.apply(set(10, "a", 100));
  table.apply(set(10, "b", 100));
  table.apply(release(10, "a"));
  table.apply(release(10, "never-set"));  // harmless, as in torch
  table.apply(release(11, "b"));          // another pid's scope of the same name
  ASSERT_EQ(table.size(), 1u);
  const auto expired = table.takeExpired(200);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].scope, "b");
}

TEST(TimerTable, SettingAScopeAgainReArmsIt) {
  TimerTable table;
  table.apply(set(10, "loop", 100));
  table.apply(set(10, "loop", 300, SIGTERM));
  EXPECT_EQ(table.size(), 1u);
  EXPECT_TRUE(table.takeExpired(200).empty());
  const auto expired = table.takeExpired(300);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].signal, SIGTERM);
}

TEST(TimerTable, OnePerPidEarliestFirstAndThePidsOtherTimersGo) {
  TimerTable table;
  table.apply(set(20, "late", 150));
  table.apply(set(10, "x", 120));
  table.apply(set(10, "y", 110));
  table.apply(set(10, "pending", 500));  // not expired, but cleared with its pid, as in torch
  table.apply(set(30, "future", 400));
  const auto expired = table.takeExpired(200);
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[0].pid, 10);
  EXPECT_EQ(expired[0].scope, "y") << "the pid's earliest expired timer decides";
  EXPECT_EQ(expired[1].pid, 20);
  ASSERT_EQ(table.size(), 1u);
  EXPECT_EQ(table.takeExpired(1000).at(0).pid, 30);
}

TEST(TimerTable, TheEarliestTimerWithASignalDecides) {
  TimerTable table;
  table.apply(set(10, "quiet", 100, 0));
  table.apply(set(10, "term", 110, SIGTERM));
  table.apply(set(10, "kill", 120, SIGKILL));
  auto expired = table.takeExpired(200);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].scope, "term");
  EXPECT_EQ(expired[0].signal, SIGTERM);

  // No timer with a signal: the earliest is named, with no signal to send.
  table.apply(set(11, "b", 110, -1));
  table.apply(set(11, "a", 100, 0));
  expired = table.takeExpired(200);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].scope, "a");
  EXPECT_LE(expired[0].signal, 0);
  EXPECT_TRUE(table.empty());
}

TEST(TimerTable, ForgetAndClear) {
  TimerTable table;
  table.apply(set(9, "a", 100));
  table.apply(set(10, "a", 100));
  table.apply(set(10, "b", 100));
  table.apply(set(11, "a", 100));
  table.forget(10);
  table.forget(12);  // no timers: nothing happens
  EXPECT_EQ(table.size(), 2u);
  const auto expired = table.takeExpired(100);
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[0].pid, 9);
  EXPECT_EQ(expired[1].pid, 11);
  table.apply(set(9, "a", 100));
  table.clear();
  EXPECT_TRUE(table.empty());
}

TEST(FormatExpiration, UtcWithMilliseconds) {
  EXPECT_EQ(formatExpiration(1700000000.25), "2023-11-14 22:13:20.250 UTC");
  EXPECT_EQ(formatExpiration(0), "1970-01-01 00:00:00.000 UTC");
}

// --- the FIFO server ---------------------------------------------------------------------

double now() { return unixSeconds(); }

class FileTimerServerTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "file_timer_test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    fifo_ = dir_ / "timer";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // What torch's client does: a non-blocking open for writing, one write, close.
  void send(const std::string& text) {
    const int fd = ::open(fifo_.c_str(), O_WRONLY | O_NONBLOCK);
    ASSERT_GE(fd, 0) << "no reader on " << fifo_;
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }

  static std::string request(pid_t pid, const std::string& scope, double expiration,
                             int signal = SIGKILL) {
    return R"({"version": 1, "pid": )" + std::to_string(pid) + R"(, "scope_id": ")" + scope +
           R"(", "expiration_time": )" + std::to_string(expiration) + R"(, "signal": )" +
           std::to_string(signal) + "}\n";
  }

  // Runs the io_context until `done` or the deadline.
  template <typename Done>
  void runUntil(Done&& done, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done() && std::chrono::steady_clock::now() < deadline)
      io_.run_for(std::chrono::milliseconds(20));
  }

  // Keeps each expiry and when it came.
  FileTimerServer::OnExpiry record() {
    return [this](const TimerExpiry& expiry) {
      expired_.push_back(expiry);
      expiredAt_.push_back(now());
    };
  }

  boost::asio::io_context io_;
  fs::path dir_, fifo_;
  std::vector<TimerExpiry> expired_;
  std::vector<double> expiredAt_;
};

TEST_F(FileTimerServerTest, ExpiresWhatIsNotReleased) {
  FileTimerServer server(io_, fifo_, record());
  struct stat st {};
  ASSERT_EQ(::lstat(fifo_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "only this user's processes may set timers";
  // Several clients open, write and close: no end of file stops the reading.
  const double soon = now() + 0.5;
  send(request(101, "released", soon));
  send(request(102, "kept", soon));
  send(R"({"version": 1, "pid": 101, "scope_id": "released", "expiration_time": -1, "signal": 0})"
       "\n");
  send("garbage\n");  // logged and skipped
  send(request(103, "forgotten", soon));
  send(request(104, "marker", 0));  // expires at the first check, once all of the above is read
  runUntil([&] { return !expired_.empty(); });
  ASSERT_EQ(expired_.size(), 1u);
  EXPECT_EQ(expired_[0].pid, 104);
  server.forget(103);

  runUntil([&] { return expired_.size() > 1; });
  ASSERT_EQ(expired_.size(), 2u);
  EXPECT_EQ(expired_[1].pid, 102);
  EXPECT_EQ(expired_[1].scope, "kept");
  EXPECT_EQ(expired_[1].signal, SIGKILL);
  EXPECT_GE(expiredAt_[1], soon);
  EXPECT_LT(expiredAt_[1], soon + 0.5) << "checked every 100 ms";
  // The released and forgotten timers were due with the kept one.
  runUntil([] { return false; }, std::chrono::milliseconds(300));
  EXPECT_EQ(expired_.size(), 2u);
}

TEST_F(FileTimerServerTest, ARequestInPiecesAndClear) {
  FileTimerServer server(io_, fifo_, record());
  const std::string line = request(201, "split", 0);
  send(line.substr(0, 10));
  runUntil([] { return false; }, std::chrono::milliseconds(20));  // most likely read alone
  send(line.substr(10));
  runUntil([&] { return !expired_.empty(); });
  ASSERT_EQ(expired_.size(), 1u);
  EXPECT_EQ(expired_[0].scope, "split");
  const double soon = now() + 0.3;
  send(request(202, "cleared", soon));
  send(request(203, "marker", 0));
  runUntil([&] { return expired_.size() > 1; });
  ASSERT_EQ(expired_.size(), 2u);
  EXPECT_EQ(expired_[1].pid, 203);
  server.clear();
  runUntil([&] { return now() > soon + 0.3; });
  EXPECT_EQ(expired_.size(), 2u);
}

TEST_F(FileTimerServerTest, ReplacesAStaleFifoRefusesAFileAndRemovesItsOwn) {
  ASSERT_EQ(::mkfifo(fifo_.c_str(), 0600), 0);
  {
    FileTimerServer server(io_, fifo_, [](const TimerExpiry&) {});
    EXPECT_EQ(server.path(), fifo_);
  }
  EXPECT_FALSE(fs::exists(fs::symlink_status(fifo_))) << "removed with the server";
  std::ofstream(fifo_) << "someone's data";
  try {
    FileTimerServer server(io_, fifo_, [](const TimerExpiry&) {});
    FAIL() << "replaced a regular file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fifo_.string()), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_regular_file(fifo_));
  EXPECT_THROW(FileTimerServer(io_, dir_ / "missing" / "timer", [](const TimerExpiry&) {}), Error);
}

}  // namespace
}  // namespace dlrun::agents
