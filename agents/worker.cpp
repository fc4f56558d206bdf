#include "agents/worker.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

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

}  // namespace

std::unique_ptr<Worker> Worker::start(boost::asio::io_context& io, WorkerLaunch launch) {
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
        .prefix = output.prefix,
        .fileFd = file.release(),
        .keepLines = keep,
    };
  };
  const bool outToFile = includes(output.toFile, Streams::Out) && output.dir;
  // A stream shown as it is needs no pipe; stderr is always piped for the failure report.
  const bool shownAsIs = output.shown && !includes(output.fileOnly, Streams::Out);
  const bool pipeOut = !shownAsIs || outToFile || !output.prefix.empty();

  const SpawnedProcess p = spawnProcess({
      .argv = w->launch_.argv,
      .envp = w->launch_.envp,
      .pipeStdout = pipeOut,
      .pipeStderr = true,
  });
  w->pid_ = p.pid;
  w->execReportFd_ = p.execReportFd;
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
  if (execReportFd_ >= 0) ::close(execReportFd_);
}

void Worker::confirmExec() {
  try {
    agents::confirmExec(pid_, std::exchange(execReportFd_, -1), launch_.argv.front());
  } catch (const Error&) {
    state_ = State::Exited;  // reaped by confirmExec
    throw;
  }
  state_ = State::Running;
}

void Worker::exited(ExitStatus status) {
  state_ = State::Exited;
  status_ = status;
  if (out_) out_->drain();
  err_->drain();
}

void Worker::signal(int sig) const {
  if (alive()) ::kill(-pid_, sig);
}

void Worker::killGroup() const { ::kill(-pid_, SIGKILL); }

}  // namespace dlrun::agents
