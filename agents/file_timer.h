// PyTorch's file-based timer, served by the agent: what torch's FileTimerClient and
// torch.distributed.elastic.timer.expires() write to the FIFO named by TORCHELASTIC_TIMER_FILE
// (one JSON line per request), the timers they set, and the FIFO server that reads them on the
// agent's io_context and says when one expired. The agent decides whom to signal.
//
// The pure part (parseTimerRequest, TimerTable) does no I/O, so tests check torch's semantics
// (torch/distributed/elastic/timer/file_based_local_timer.py, FileTimerServer): one timer per
// (pid, scope); an expiration below 0 releases it; when any timer of a pid expires, the pid is
// signalled once with the signal of its earliest expired timer that has one (> 0), and all its
// timers go. Expirations are torch's: seconds since the epoch (the client's time.time()).
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace dlrun::agents {

// One line of the FIFO: {"version": 1, "pid": P, "scope_id": S, "expiration_time": T,
// "signal": N}, the same in torch 1.13 and 2.x ("version" is optional and not checked, as
// torch's server does not).
struct TimerRequest {
  pid_t pid = 0;
  std::string scope;
  double expiration = 0;  // seconds since the epoch; below 0: release
  int signal = 0;         // 0 or below: the timer is noted, nobody is signalled
  bool release() const { return expiration < 0; }
};

// Throws ProtocolError, one line saying what is wrong with the request.
TimerRequest parseTimerRequest(std::string_view line);

// A pid whose timer expired: the timer that decides (the earliest expired with a signal, else
// the earliest expired) and its signal.
struct TimerExpiry {
  pid_t pid = 0;
  std::string scope;
  double expiration = 0;
  int signal = 0;
};

class TimerTable {
 public:
  // Sets (or re-arms) the timer of (pid, scope), or releases it.
  void apply(TimerRequest request);
  // Every pid with a timer expired at `now` (seconds since the epoch), earliest expiry first;
  // those pids' timers are removed, expired or not, as torch's server clears a reaped pid.
  std::vector<TimerExpiry> takeExpired(double now);
  void forget(pid_t pid);
  void clear() { timers_.clear(); }
  bool empty() const { return timers_.empty(); }
  size_t size() const { return timers_.size(); }

 private:
  struct Timer {
    double expiration = 0;
    int signal = 0;
  };
  std::map<std::pair<pid_t, std::string>, Timer> timers_;  // by pid, then scope
};

// "2024-05-01 12:00:03.250 UTC" for an expiration.
std::string formatExpiration(double secondsSinceEpoch);

// The FIFO and its timers on the agent's io_context (no thread). It is opened for reading and
// writing, so a client closing its end is never an end of file to spin on. Timers are checked
// every 100 ms while any is set (torch's agent uses max_interval=0.1); onExpiry gets each
// expired pid, whatever the pid is: whom to signal is the caller's choice.
class FileTimerServer {
 public:
  using OnExpiry = std::function<void(const TimerExpiry&)>;

  // Creates the FIFO at `path` (replacing a FIFO left there, as torch does; anything else there
  // is an Error naming the path) and starts reading.
  FileTimerServer(boost::asio::io_context& io, std::filesystem::path path, OnExpiry onExpiry);
  // Stops reading and removes the FIFO.
  ~FileTimerServer();
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::filesystem::path& path() const;
  void forget(pid_t pid);
  void clear();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace dlrun::agents
