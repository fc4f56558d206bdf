// What the agent keeps on disk: the log root (--log-dir, else a temporary directory for error
// files), the run's directory in it, and torch's file-based timer, whose FIFO lives there by
// default (file_timer.h).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "agents/agent_impl.h"
#include "agents/checkpoint_flush.h"
#include "common/host_port.h"
#include "common/log.h"
#include "common/program_files.h"
#include "common/signal_name.h"
#include "common/text.h"

namespace dlrun::agents::detail {
namespace {
// In a run directory: the group rank of the node that made it, at its first round.
constexpr const char* kRunDirOwner = "group_rank";

std::string requeuedLine(int requeues) {
  return "this Slurm job was requeued (SLURM_RESTART_COUNT=" + std::to_string(requeues) + ")";
}
}  // namespace

void AgentImpl::prepareLogRoot() {
  if (options_.requeues.value_or(0) > 0 && !options_.logDir)
    log::info(requeuedLine(*options_.requeues) +
              ": a new run; with --log-dir its log tree would go on");
  if (options_.logDir) {
    logRoot_ = *options_.logDir;
    keepLogRoot_ = true;
    return;
  }
  std::string pattern = (fs::temp_directory_path() / "dlrun-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    throw Error("cannot create a temporary directory for worker error files: " +
                std::string(std::strerror(errno)));
  logRoot_ = pattern;
}

// torchrun's run directory: tempfile.mkdtemp(prefix=RUN_ID + "_"), a fresh one per launch, so
// a second job under the same id never writes over the first one's logs.
fs::path AgentImpl::runDir() {
  if (runDir_) return *runDir_;
  std::error_code ec;
  fs::create_directories(logRoot_, ec);
  if (auto before = requeuedRunDir()) return *(runDir_ = *before);
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789_";  // tempfile's
  std::random_device random;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string name = world_.runId + "_";
    for (int i = 0; i < 8; ++i) name += kChars[random() % (sizeof(kChars) - 1)];
    const fs::path dir = logRoot_ / name;
    if (::mkdir(dir.c_str(), 0700) == 0) {
      // Which node's tree this is, for a requeue's agents sharing the log root (requeuedRunDir).
      if (options_.requeues) std::ofstream(dir / kRunDirOwner) << world_.groupRank << '\n';
      return *(runDir_ = dir);
    }
    if (errno != EEXIST)
      throw Error("cannot create the log directory " + dir.string() + ": " + std::strerror(errno));
  }
  throw Error("cannot create a log directory in " + logRoot_.string() +
              ": every name tried exists");
}

// A requeued job (SLURM_RESTART_COUNT) under --log-dir: the newest directory of this run id there
// that the node of this group rank made (a log root on a shared file system holds every node's),
// and the attempt after its last. The job id, and so the run id, stays across requeues.
std::optional<fs::path> AgentImpl::requeuedRunDir() {
  if (options_.requeues.value_or(0) == 0 || !options_.logDir) return std::nullopt;
  const std::string prefix = world_.runId + "_";
  std::optional<fs::path> newest;
  fs::file_time_type newestTime;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(logRoot_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory(ec) || !name.starts_with(prefix) || name.size() != prefix.size() + 8)
      continue;
    int owner = -1;
    std::ifstream(entry.path() / kRunDirOwner) >> owner;
    if (owner != world_.groupRank) continue;
    const auto time = entry.last_write_time(ec);
    if (!newest || time > newestTime) newest = entry.path(), newestTime = time;
  }
  const std::string requeued = requeuedLine(*options_.requeues);
  if (!newest) {
    log::info(requeued + ": no log tree of the run before in " + logRoot_.string());
    return std::nullopt;
  }
  for (const auto& entry : fs::directory_iterator(*newest, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("attempt_")) continue;
    if (const auto n = parseInteger<int>(name.substr(8)); n && *n >= firstAttempt_)
      firstAttempt_ = *n + 1;
  }
  log::info(requeued + ": its log tree goes on in " + newest->string() + " from attempt_" +
            std::to_string(firstAttempt_));
  return newest;
}

// torch's file-based timer, served as torch's agent serves it: when the agent's environment
// has TORCHELASTIC_ENABLE_FILE_TIMER=1, at TORCHELASTIC_TIMER_FILE if set, and the workers get
// that variable. One FIFO for the whole job; its timers go with each round's workers.
void AgentImpl::serveFileTimer() {
  const auto enabled = inherited_.find("TORCHELASTIC_ENABLE_FILE_TIMER");
  if (enabled == inherited_.end() || enabled->second != "1") return;
  const auto given = inherited_.find("TORCHELASTIC_TIMER_FILE");
  // --log-dir is otherwise made with the first attempt's directories; a failure to make it
  // shows as the FIFO's.
  std::error_code ec;
  if (given == inherited_.end()) fs::create_directories(logRoot_, ec);
  const fs::path path = given != inherited_.end()
                            ? fs::path(given->second)
                            : logRoot_ / ("torch-timer-" + std::to_string(::getpid()));
  try {
    fileTimer_.emplace(io_, path, [this](const TimerExpiry& e) { onTimerExpired(e); });
  } catch (const Error& e) {
    cleanUpLogRoot();  // run() ends here, before anything else was written there
    throw ConfigError("TORCHELASTIC_ENABLE_FILE_TIMER=1, but " + std::string(e.what()) +
                      " (TORCHELASTIC_TIMER_FILE chooses the path)");
  }
  services_["TORCHELASTIC_TIMER_FILE"] = path.string();
}

// torch's server signals any pid it is told; dlrun signals only this round's workers and the
// processes in their process groups (each worker leads its own), so a stray request cannot
// make the agent kill something else.
void AgentImpl::onTimerExpired(const TimerExpiry& expiry) {
  const std::string timer = "timer '" + expiry.scope + "' expired";
  auto it = byPid_.find(expiry.pid);
  if (it == byPid_.end()) it = byPid_.find(::getpgid(expiry.pid));
  if (it == byPid_.end() || !it->second->alive()) {
    log::info("pid " + std::to_string(expiry.pid) + ": " + timer +
              ", but it is not one of this node's workers; not signalled");
    return;
  }
  const std::string who =
      "rank " + std::to_string(it->second->rank()) + " (pid " + std::to_string(expiry.pid) + ")";
  if (expiry.signal <= 0) {
    log::info(who + ": " + timer + "; it asked for no signal, so it runs on");
    return;
  }
  log::info(who + ": " + timer + "; sending " + signalName(expiry.signal));
  expiredTimers_[it->second->pid()] = timer + " at " + formatExpiration(expiry.expiration) +
                                      "; dlrun sent " + signalName(expiry.signal) + " to pid " +
                                      std::to_string(expiry.pid);
  ::kill(expiry.pid, expiry.signal);
}

void AgentImpl::cleanUpLogRoot() {
  if (keepLogRoot_) {
    if (!options_.logDir) log::info("worker logs are in " + logRoot_.string());
    return;
  }
  std::error_code ec;
  fs::remove_all(logRoot_, ec);
}

// Where /dev/shm cannot hold a directory, dlrun.checkpoint saves to files, as outside dlrun.
void AgentImpl::holdCheckpointMemory() {
  if (options_.checkpointDir) {
    std::error_code ec;
    fs::create_directories(*options_.checkpointDir, ec);
    if (ec)
      throw ConfigError("--checkpoint-dir: cannot make " + *options_.checkpointDir + ": " +
                        ec.message());
    services_[std::string(kCheckpointDirVariable)] = fs::absolute(*options_.checkpointDir).string();
  }
  try {
    checkpointMemory_.emplace();
    services_[std::string(kCheckpointMemoryVariable)] = checkpointMemory_->dir().string();
    const std::string copy = findProgramFile(kCheckpointCopyModule, DLRUN_CHECKPOINT_MODULE_DIR);
    if (!copy.empty()) services_[std::string(kCheckpointCopyVariable)] = copy;
  } catch (const Error& e) {
    log::info(std::string("in-memory checkpoints are off: ") + e.what());
    return;
  }
  std::optional<fs::path> writeTo;
  if (options_.checkpointDir && options_.checkpointWriteEvery.count() > 0) {
    writeTo = *options_.checkpointDir;
    services_[std::string(kCheckpointWriteEveryVariable)] =
        std::to_string(options_.checkpointWriteEvery.count() / 1000.0);
  }
  // The workers' requests come at their cadence; a tenth of a second is the wait for one. A
  // peer that cannot be reached is said once, until a copy gets through again.
  checkpointCourier_.emplace(
      checkpointMemory_->dir(), writeTo, std::chrono::milliseconds(100),
      [failing = false](const std::string& how, const CopyReport& report) mutable {
        for (const auto& [rank, step] : report.copied)
          log::debug("checkpoints: step " + std::to_string(step) + " of rank " +
                     std::to_string(rank) + " " + how);
        if (!report.problems.empty() && !failing)
          log::info("checkpoints: not " + how + ": " + report.problems.front());
        failing = !report.problems.empty();
      });
}

// Put out: its name goes where a requeued batch script reads the nodes to exclude. One write of
// a whole line with O_APPEND, so that nodes putting themselves out at once do not mix lines.
void AgentImpl::noteQuarantined() {
  const auto& file = options_.quarantine.file;
  if (!file) return;
  const std::string line = options_.quarantine.nodeName + "\n";
  const int fd = ::open(file->c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    log::info("cannot note this node as put out in " + file->string() + ": " +
              std::strerror(errno));
  if (fd >= 0) ::close(fd);
}

// The round's other nodes keep a copy of this node's checkpoints, and this one of theirs: its
// workers learn where this agent serves them (as the other nodes reach this one).
void AgentImpl::serveCheckpointPeers(RoundSpec& spec) {
  if (!checkpointMemory_ || world_.groupWorldSize < 2 ||
      world_.workerEndpoints.size() <= static_cast<size_t>(world_.baseRank))
    return;
  if (!checkpointPeers_) {
    const std::string host = parseHostPort(world_.workerEndpoints[world_.baseRank], 0).host;
    try {
      checkpointPeers_.emplace(checkpointMemory_->dir(), host);
    } catch (const Error& e) {
      log::info(std::string("checkpoints stay on this node: ") + e.what());
      return;
    }
  }
  spec.services[std::string(kCheckpointAgentVariable)] = checkpointPeers_->address();
}

// The workers are gone: what they left in memory goes to --checkpoint-dir, then the memory.
void AgentImpl::releaseCheckpointMemory() {
  checkpointCourier_.reset();
  checkpointPeers_.reset();
  if (checkpointMemory_ && options_.checkpointDir) {
    const CopyReport report =
        flushCheckpoints(checkpointMemory_->dir(), *options_.checkpointDir, world_.worldSize);
    std::map<int64_t, std::vector<int>> ranksByStep;
    for (const auto& [rank, step] : report.copied) ranksByStep[step].push_back(rank);
    for (auto& [step, ranks] : ranksByStep) {
      std::sort(ranks.begin(), ranks.end());
      std::string named;
      for (int rank : ranks) named += (named.empty() ? "" : ", ") + std::to_string(rank);
      log::info("checkpoints: step " + std::to_string(step) + " of rank(s) " + named +
                " written to " + *options_.checkpointDir);
    }
    for (const auto& problem : report.problems)
      log::info("checkpoints: not written to " + *options_.checkpointDir + ": " + problem);
  }
  checkpointMemory_.reset();
}

}  // namespace dlrun::agents::detail
