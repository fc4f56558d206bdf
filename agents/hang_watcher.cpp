#include "agents/hang_watcher.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "agents/process.h"
#include "common/log.h"
#include "common/text.h"

namespace dlrun::agents {

namespace asio = boost::asio;
namespace fs = std::filesystem;

namespace {

// How often the watch looks: often enough that a hang is seen well within a second of the
// timeout (a worker's last progress is seen up to a look late, and the hang up to another),
// rarely enough that thousands of workers cost nothing (a look reads a slot and a file each).
std::chrono::milliseconds lookInterval(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 50, std::chrono::milliseconds(50), std::chrono::milliseconds(400));
}

// How long the stacks may take (debuggers attaching to every worker at once), and how long the
// node that saw a hang waits for the other nodes' reports, which take their stacks meanwhile.
constexpr std::chrono::seconds kStackTimeout{10};
constexpr std::chrono::seconds kGatherTimeout{15};

// Whether `pid` is stopped (SIGSTOP, a tracer's stop): a stopped rank is the one the others
// wait for.
bool stopped(pid_t pid) {
  const char state = processState(pid);
  return state == 'T' || state == 't';
}

// The heartbeat file's modification time (0: not there yet) and the step it holds, if any.
struct Heartbeat {
  uint64_t marker = 0;
  std::optional<int64_t> step;
};

Heartbeat readHeartbeat(const fs::path& file, uint64_t seen) {
  struct stat info {};
  if (::stat(file.c_str(), &info) != 0) return {};
  Heartbeat beat;
  beat.marker = static_cast<uint64_t>(info.st_mtim.tv_sec) * 1'000'000'000u +
                static_cast<uint64_t>(info.st_mtim.tv_nsec);
  if (beat.marker == 0) beat.marker = 1;  // touched at the epoch is still touched
  // A step number is read only when the file changed, and only a short one.
  if (beat.marker != seen && info.st_size > 0 && info.st_size <= 32) {
    std::ifstream in(file);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
    if (const auto step = parseInteger<int64_t>(text)) beat.step = *step;
  }
  return beat;
}

double toSeconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

HangWatcher::HangWatcher(asio::io_context& io, HangOptions options, std::string nodeName,
                         rendezvous::Rendezvous& rendezvous)
    : io_(io),
      options_(options),
      nodeName_(std::move(nodeName)),
      rendezvous_(rendezvous),
      timer_(io) {}

HangWatcher::~HangWatcher() {
  if (collector_.joinable()) collector_.join();
  // The hook's per-process files of workers that were killed stay behind otherwise.
  if (pythonHook_) {
    std::error_code ignored;
    fs::remove_all(pythonHook_->dir(), ignored);
  }
}

Environment HangWatcher::hookEnvironment(const fs::path& runDir, const Environment& base) {
  if (!pythonHook_) pythonHook_ = std::make_unique<PythonStackHook>(runDir / "python-hook");
  return pythonHook_->environment(base);
}

void HangWatcher::prepareRound(const fs::path& attemptDir, const ProgressBoard& board,
                               const Environment& inherited, RoundSpec& spec) {
  unwatch();
  attemptDir_ = attemptDir;
  fs::create_directories(attemptDir_);
  Environment base = inherited;
  if (auto it = spec.services.find("PYTHONPATH"); it != spec.services.end())
    base["PYTHONPATH"] = it->second;
  for (auto& [key, value] : hookEnvironment(attemptDir_.parent_path(), base))
    spec.services[key] = value;
  board_ = &board;
  heartbeatDir_ = attemptDir_ / "heartbeat";
  fs::remove_all(heartbeatDir_);  // a file left from another run is not progress
  fs::create_directories(heartbeatDir_);
  spec.heartbeatDir = heartbeatDir_.string();
}

void HangWatcher::watch(std::vector<WatchedWorker> workers,
                        std::function<void(const HungWorker&)> onHang) {
  // Watched again within a round (a worker replaced alone): a survivor keeps its track, its
  // silence counted anew (it waited for the one replaced); a replacement starts from what its
  // slot and heartbeat file hold, its predecessor's progress.
  const auto now = Clock::now();
  std::vector<ProgressTrack> tracks(workers.size());
  std::vector<uint64_t> heartbeats(workers.size(), 0);
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto before = std::find_if(workers_.begin(), workers_.end(), [&](const auto& w) {
      return w.localRank == workers[i].localRank;
    });
    if (before == workers_.end()) continue;
    const auto j = static_cast<size_t>(before - workers_.begin());
    if (before->pid == workers[i].pid) {
      tracks[i] = tracks_[j];
      tracks[i].silentSince(now);
      heartbeats[i] = heartbeats_[j];
      continue;
    }
    const int local = workers[i].localRank;
    if (board_ && local < board_->workers())
      tracks[i].startFrom(ProgressSource::Board, board_->read(local).beats);
    heartbeats[i] = readHeartbeat(heartbeatFile(heartbeatDir_.string(), local), 0).marker;
    tracks[i].startFrom(ProgressSource::Heartbeat, heartbeats[i]);
  }
  workers_ = std::move(workers);
  tracks_ = std::move(tracks);
  heartbeats_ = std::move(heartbeats);
  onHang_ = std::move(onHang);
  stalled_ = false;
  schedule();
}

void HangWatcher::unwatch() {
  timer_.cancel();
  onHang_ = nullptr;
}

void HangWatcher::schedule() {
  timer_.expires_after(lookInterval(options_.timeout));
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || !onHang_) return;
    look();
    if (onHang_) schedule();
  });
}

void HangWatcher::look() {
  const auto now = Clock::now();
  std::vector<char> hung(workers_.size(), 0);
  for (size_t i = 0; i < workers_.size(); ++i) {
    const int local = workers_[i].localRank;
    ProgressTrack& track = tracks_[i];
    if (local < board_->workers()) {
      const ProgressReading r = board_->read(local);
      track.observe(
          ProgressSource::Board,
          {.marker = r.beats, .step = r.step, .inCollective = r.phase == ProgressPhase::Collective},
          now);
    }
    const Heartbeat beat =
        readHeartbeat(heartbeatFile(heartbeatDir_.string(), local), heartbeats_[i]);
    heartbeats_[i] = beat.marker;
    track.observe(ProgressSource::Heartbeat, {.marker = beat.marker, .step = beat.step}, now);
    hung[i] = track.hung(now, options_.timeout);
  }
  if (std::none_of(hung.begin(), hung.end(), [](char h) { return h != 0; })) {
    stalled_ = false;  // progress resumed everywhere: a new stall is a new hang
    return;
  }
  if (stalled_) return;
  stalled_ = true;
  // The suspect among the hung workers and the stopped ones, hung yet or not: one stopped
  // inside a collective may have been seen entering it after the peers that wait on it.
  std::vector<RankReport> candidates;
  std::vector<size_t> at;
  for (size_t i = 0; i < workers_.size(); ++i) {
    RankReport r = report(i, now);
    if (!hung[i] && !r.stopped) continue;
    candidates.push_back(std::move(r));
    at.push_back(i);
  }
  const auto pick = suspect(candidates);
  if (!pick) return;  // not reached: a hung worker has reported
  const size_t i = at[*pick];
  onHang_(HungWorker{workers_[i].rank, toSeconds(tracks_[i].silentFor(now)), tracks_[i].step()});
}

RankReport HangWatcher::report(size_t i, Clock::time_point now) const {
  const ProgressTrack& t = tracks_[i];
  RankReport r;
  r.rank = workers_[i].rank;
  r.node = nodeName_;
  r.reported = t.reported();
  r.stopped = stopped(workers_[i].pid);
  r.step = t.step();
  r.silentSeconds = t.reported() ? toSeconds(t.silentFor(now)) : 0.0;
  if (t.inCollective()) r.collective = "a collective (its own report)";
  return r;
}

std::vector<RankReport> HangWatcher::localReports(Clock::time_point now) const {
  std::vector<RankReport> reports;
  for (size_t i = 0; i < workers_.size(); ++i) reports.push_back(report(i, now));
  return reports;
}

void HangWatcher::collect(Collect what, std::function<void()> done) {
  if (collector_.joinable()) collector_.join();
  std::vector<RankReport> reports = localReports(Clock::now());
  std::vector<StackTarget> targets;
  for (const auto& w : workers_)
    targets.push_back({.pid = w.pid,
                       .rank = w.rank,
                       .outFile = stackDir() / ("rank_" + std::to_string(w.rank) + ".txt"),
                       .native = what.nativeOnlyOf == 0 || what.nativeOnlyOf == w.pid});
  const double timeout = toSeconds(options_.timeout);
  // A thread: the debuggers and the other nodes' reports are waited for. It lives until the
  // tools it starts are done (their death signal is tied to it). It gets this round's folder
  // and hook by copy: prepareRound() may set up the next round's meanwhile.
  collector_ = std::thread([this, reports = std::move(reports), targets = std::move(targets), what,
                            timeout, stacks = stackDir(), hook = pythonHook_.get(),
                            done = std::move(done)]() mutable {
    try {
      fs::create_directories(stacks);
      const auto dumps = dumpStacks(targets, hook, kStackTimeout);
      if (what.taken) asio::post(io_, what.taken);
      for (size_t i = 0; i < dumps.size(); ++i) {
        RankReport& r = reports[i];
        r.stackFile = targets[i].outFile.string();
        r.topFrames = dumps[i].topFrames;
        if (dumps[i].collective) r.collective = dumps[i].collective;
        r.lastCollective = dumps[i].lastNcclCollective;
        if (!dumps[i].error.empty())
          log::info("rank " + std::to_string(r.rank) + ": " + dumps[i].error);
      }
      std::vector<RankReport> all;
      int reported = 1, nodes = 1;
      if (what.shareWithJob) {
        rendezvous_.shareWithRound(rendezvous::RoundTopic::Hang, encodeRankReports(reports));
        if (what.summarize) {
          const auto texts =
              rendezvous_.gatherFromRound(rendezvous::RoundTopic::Hang, kGatherTimeout);
          nodes = static_cast<int>(texts.size());
          reported = 0;
          for (const auto& text : texts) {
            if (text.empty()) continue;
            ++reported;
            auto part = decodeRankReports(text);
            all.insert(all.end(), part.begin(), part.end());
          }
        }
      } else {
        all = reports;
      }
      if (what.summarize) log::info(hangSummary(all, timeout, reported, nodes));
    } catch (const std::exception& e) {
      log::info(std::string("cannot complete the hang report: ") + e.what());
    }
    asio::post(io_, std::move(done));
  });
}

}  // namespace dlrun::agents
