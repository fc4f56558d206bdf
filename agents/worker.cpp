#include "agents/worker.h"
#include "agents/console_dedup.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "agents/warm_start.h"
#include "common/error.h"

namespace dlrun::agents {
namespace {

bool includes(Streams streams, Streams one) {
  return (static_cast<int>(streams) & static_cast<int>(one)) != 0;
}

// A log file descriptor that closes itself unless a pump takes it over.
class LogFile {
 public:
  LogFile() = default;
  explicit LogFile(const std::filesystem::path& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) {
    if (fd_ < 0)
      throw Error("cannot write log file " + path.string() + ": " + std::strerror(errno));
  }
  ~LogFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  LogFile(LogFile&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// A stream shown as it is needs no pipe; stderr is always piped for the failure report.
bool pipesStdout(const WorkerOutput& output) {
  const bool outToFile = includes(output.toFile, Streams::Out) && output.dir;
  const bool shownAsIs = output.shown && !includes(output.fileOnly, Streams::Out);
  const bool prefixed = includes(output.prefixed, Streams::Out) && !output.prefix.empty();
  return !shownAsIs || outToFile || prefixed || output.filteredOut;
}

int logFiles(const WorkerOutput& output) {
  if (!output.dir) return 0;
  return (includes(output.toFile, Streams::Out) ? 1 : 0) +
         (includes(output.toFile, Streams::Err) ? 1 : 0);
}

}  // namespace

int Worker::descriptors(const WorkerOutput& output) {
  return 1 + (pipesStdout(output) ? 1 : 0) + logFiles(output);
}

std::unique_ptr<Worker> Worker::start(boost::asio::io_context& io, WorkerLaunch launch,
                                      Zygote* zygote, bool reserved) {
  // The environment is needed only for the exec; a large node's workers would hold megabytes.
  std::vector<std::string> envp = std::move(launch.envp);
  launch.envp.clear();
  const std::span<const std::string> sharedEnvp = std::exchange(launch.sharedEnvp, {});
  std::unique_ptr<Worker> w(new Worker(std::move(launch)));
  const WorkerOutput& output = w->launch_.output;
  auto logFile = [&](Streams which, const char* name) {
    return includes(output.toFile, which) && output.dir ? LogFile(*output.dir / name) : LogFile();
  };
  LogFile outFile = logFile(Streams::Out, "stdout.log");
  LogFile errFile = logFile(Streams::Err, "stderr.log");
  auto target = [&](Streams which, int console, LogFile& file, size_t keep) {
    return OutputTarget{
        .consoleFd = output.shown && !includes(output.fileOnly, which) ? console : -1,
        .prefix = includes(output.prefixed, which) ? output.prefix : std::string(),
        .exactBytes = output.exactBytes,
        .pythonText = output.pythonText && includes(output.prefixed, which),
        .fileFd = file.release(),
        .keepLines = keep,
        // The prefixed streams' lines: every shown one, or torchrun's teed ones alone.
        .filtered = !includes(output.prefixed, which) ? nullptr
                    : which == Streams::Out           ? output.filteredOut
                                                      : output.filteredErr,
        .dedup = includes(output.prefixed, which) ? output.dedup : nullptr,
        .rank = w->launch_.rank,
    };
  };
  SpawnRequest request{
      .argv = w->launch_.argv,
      .envp = std::move(envp),
      .sharedEnvp = sharedEnvp,
      .pipeStdout = pipesStdout(output),
      .pipeStderr = true,
      .cpus = w->launch_.cpus,
  };
  const SpawnedProcess p =
      zygote ? zygote->start(request, reserved ? w->launch_.localRank : -1) : spawnProcess(request);
  w->pid_ = p.pid;
  if (p.stdoutFd >= 0) {
    w->out_ = std::make_unique<StreamPump>(io, p.stdoutFd,
                                           target(Streams::Out, STDOUT_FILENO, outFile, 0));
    w->out_->start();
  }
  w->err_ = std::make_unique<StreamPump>(
      io, p.stderrFd, target(Streams::Err, STDERR_FILENO, errFile, kReportLines));
  w->err_->start();
  return w;
}

Worker::~Worker() {
  if (groupFd_ >= 0) ::close(groupFd_);
}

void Worker::exited(ExitStatus status, int groupFd) {
  state_ = State::Exited;
  status_ = status;
  groupFd_ = groupFd;
  if (out_) out_->drain();
  err_->drain();
  // A failed worker's last lines before what is said of its failure; one that succeeded leaves
  // its lines to wait for the other ranks' (the agent's end shows what is left).
  if (launch_.output.dedup && !status.success()) launch_.output.dedup->flushThrough(launch_.rank);
}

void Worker::signal(int sig) const {
  if (alive()) ::kill(-pid_, sig);
}

// Unreaped, the worker holds its group's number; reaped, only its pidfd names the group.
void Worker::killGroup() {
  if (std::exchange(groupKilled_, true)) return;
  if (alive())
    ::kill(-pid_, SIGKILL);
  else
    signalReapedGroup(groupFd_, pid_, SIGKILL);
}

}  // namespace dlrun::agents
