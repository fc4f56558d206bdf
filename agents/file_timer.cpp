#include "agents/file_timer.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "agents/output.h"
#include "common/asio.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

namespace dlrun::agents {

namespace asio = boost::asio;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// A request is at most PIPE_BUF bytes (torch's client refuses longer ones); messages quote
// this much of a bad one.
constexpr size_t kQuoted = 200;

[[noreturn]] void bad(std::string_view line, const std::string& why) {
  std::string quoted(line.substr(0, kQuoted));
  if (line.size() > kQuoted) quoted += "...";
  // The message stays one line whatever the client wrote.
  std::replace_if(
      quoted.begin(), quoted.end(), [](unsigned char c) { return c < ' '; }, ' ');
  throw ProtocolError("timer request " + why + ": " + quoted);
}

const json& field(const json& request, std::string_view line, const char* name) {
  auto it = request.find(name);
  if (it == request.end()) bad(line, std::string("has no \"") + name + "\"");
  return *it;
}

int64_t integerIn(const json& request, std::string_view line, const char* name, int64_t low,
                  int64_t high) {
  const json& value = field(request, line, name);
  const std::string range = "\"" + std::string(name) + "\" must be an integer from " +
                            std::to_string(low) + " to " + std::to_string(high);
  if (!value.is_number_integer()) bad(line, range);
  // An unsigned value above int64's range would wrap in get<int64_t>.
  if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(high))
    bad(line, range);
  const int64_t n = value.get<int64_t>();
  if (n < low || n > high) bad(line, range);
  return n;
}

}  // namespace

TimerRequest parseTimerRequest(std::string_view line) {
  const json request = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object()) bad(line, "is not a JSON object");
  TimerRequest parsed;
  // Not 0 or below: kill(2) would take those for process groups or every process.
  parsed.pid =
      static_cast<pid_t>(integerIn(request, line, "pid", 1, std::numeric_limits<pid_t>::max()));
  const json& scope = field(request, line, "scope_id");
  if (!scope.is_string()) bad(line, "\"scope_id\" must be a string");
  parsed.scope = scope.get<std::string>();
  const json& expiration = field(request, line, "expiration_time");
  if (!expiration.is_number()) bad(line, "\"expiration_time\" must be a number");
  parsed.expiration = expiration.get<double>();
  // torch's client sends 0 with a release, and "a negative or zero signal will not kill".
  parsed.signal = static_cast<int>(
      integerIn(request, line, "signal", std::numeric_limits<int>::min(), NSIG - 1));
  return parsed;
}

void TimerTable::apply(TimerRequest request) {
  auto key = std::make_pair(request.pid, std::move(request.scope));
  if (request.release()) {
    timers_.erase(key);
    return;
  }
  timers_.insert_or_assign(std::move(key),
                           Timer{.expiration = request.expiration, .signal = request.signal});
}

std::vector<TimerExpiry> TimerTable::takeExpired(double now) {
  std::vector<TimerExpiry> expired;
  auto it = timers_.begin();
  while (it != timers_.end()) {
    const pid_t pid = it->first.first;
    const auto first = it;
    std::optional<TimerExpiry> chosen;
    for (; it != timers_.end() && it->first.first == pid; ++it) {
      const Timer& timer = it->second;
      if (timer.expiration > now) continue;
      // torch's order: the earliest expired timer with a signal decides; without one, the
      // earliest expired is named and nobody is signalled.
      const bool signals = timer.signal > 0;
      const bool chosenSignals = chosen && chosen->signal > 0;
      if (!chosen || (signals && !chosenSignals) ||
          (signals == chosenSignals && timer.expiration < chosen->expiration))
        chosen = TimerExpiry{pid, it->first.second, timer.expiration, timer.signal};
    }
    if (!chosen) continue;
    expired.push_back(std::move(*chosen));
    it = timers_.erase(first, it);
  }
  std::stable_sort(expired.begin(), expired.end(),
                   [](const auto& a, const auto& b) { return a.expiration < b.expiration; });
  return expired;
}

void TimerTable::forget(pid_t pid) {
  auto it = timers_.lower_bound({pid, std::string()});
  while (it != timers_.end() && it->first.first == pid) it = timers_.erase(it);
}

std::string formatExpiration(double secondsSinceEpoch) {
  const auto whole = static_cast<time_t>(secondsSinceEpoch);
  const int millis = static_cast<int>((secondsSinceEpoch - static_cast<double>(whole)) * 1000);
  struct tm utc {};
  ::gmtime_r(&whole, &utc);
  std::array<char, 64> text{};
  std::snprintf(text.data(), text.size(), "%04d-%02d-%02d %02d:%02d:%02d.%03d UTC",
                utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min,
                utc.tm_sec, std::clamp(millis, 0, 999));
  return text.data();
}

struct FileTimerServer::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io, fs::path fifoPath, OnExpiry callback)
      : path(std::move(fifoPath)), fifo(io), ticker(io), onExpiry(std::move(callback)) {}

  void open() {
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0) {
      // A FIFO left by an earlier agent is replaced, as torch's server does; anything else is
      // someone's file.
      if (!S_ISFIFO(st.st_mode))
        throw Error("cannot serve torch's timer pipe at " + path.string() +
                    ": something other than a FIFO is there; remove it or choose another path");
      ::unlink(path.c_str());
    }
    // Only this user's processes (the workers) may set timers that make the agent signal.
    if (::mkfifo(path.c_str(), 0600) != 0)
      throw Error("cannot create torch's timer pipe " + path.string() + ": " +
                  std::strerror(errno));
    // Read and write: the agent is then a writer too, so the FIFO never reports an end of file
    // when the last client closes, and clients' non-blocking opens always find a reader.
    const int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      ::unlink(path.c_str());
      throw Error("cannot open torch's timer pipe " + path.string() + ": " + std::strerror(err));
    }
    fifo.assign(fd);
  }

  void read() {
    fifo.async_read_some(asio::buffer(buffer), [self = shared_from_this()](
                                                   const boost::system::error_code& ec, size_t n) {
      if (self->closed) return;
      if (ec) {
        log::warn("torch's timer pipe " + self->path.string() + " failed (" + ec.message() +
                  "); timers set from now on are not enforced");
        return;
      }
      self->splitter.feed(std::string_view(self->buffer.data(), n),
                          [&](std::string_view line) { self->onLine(line); });
      self->read();
    });
  }

  void onLine(std::string_view line) {
    try {
      table.apply(parseTimerRequest(line));
    } catch (const ProtocolError& e) {
      log::warn(std::string("ignored on torch's timer pipe: ") + e.what());
      return;
    }
    if (!ticking && !table.empty()) tick();
  }

  void tick() {
    ticking = true;
    ticker.expires_after(kInterval);
    ticker.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || self->closed) return;
      self->ticking = false;
      for (const TimerExpiry& expiry : self->table.takeExpired(unixSeconds()))
        self->onExpiry(expiry);
      if (!self->closed && !self->ticking && !self->table.empty()) self->tick();
    });
  }

  void close() {
    if (closed) return;
    closed = true;
    boost::system::error_code ec;
    fifo.close(ec);
    ticker.cancel();
    ::unlink(path.c_str());
  }

  // torch's agent checks its timers every 0.1 s (max_interval).
  static constexpr std::chrono::milliseconds kInterval{100};
  const fs::path path;
  asio::posix::stream_descriptor fifo;
  asio::steady_timer ticker;
  OnExpiry onExpiry;
  TimerTable table;
  // A line longer than a request is cut into pieces, each refused as malformed.
  LineSplitter splitter{64 * 1024};
  std::array<char, 4096> buffer{};
  bool ticking = false;  // a check is scheduled
  bool closed = false;
};

FileTimerServer::FileTimerServer(asio::io_context& io, fs::path path, OnExpiry onExpiry)
    : impl_(std::make_shared<Impl>(io, std::move(path), std::move(onExpiry))) {
  impl_->open();
  impl_->read();
}

FileTimerServer::~FileTimerServer() { impl_->close(); }

const fs::path& FileTimerServer::path() const { return impl_->path; }

void FileTimerServer::forget(pid_t pid) { impl_->table.forget(pid); }

void FileTimerServer::clear() { impl_->table.clear(); }

}  // namespace dlrun::agents
