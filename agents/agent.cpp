// The agent's state machine. One io_context, one thread; every event is a handler:
//
//   Joining --the round closed------------------> Running
//   Running --a worker fails--------------------> Stopping(failure)
//   Running --the round ended elsewhere---------> Stopping(round end)
//   Running --SIGINT/TERM/HUP/QUIT--------------> Stopping(signal)
//   Running --every worker exited 0-------------> Finished(0) | Done (several nodes)
//   Done --the round ended----------------------> Finished(0) | Joining (restart)
//   Stopping --last worker reaped---------------> Joining (restart, a new rendezvous round)
//                                                 | Finished(root cause's code, or 128+signal)
//
// With several nodes, rounds also end from outside (a node lost or added, a worker failed on
// another node): the rendezvous blocks on the network, so it runs on a thread of its own
// (next(), then awaitEnd()) and posts what it learns to this io_context. A single node's
// rendezvous never blocks and runs inline.
//
// SIGCHLD drives reaping (waitpid(-1) also reaps descendants re-parented to this subreaper);
// SIGUSR1/SIGUSR2 are forwarded to every worker's process group and change nothing else.
// Stopping sends SIGTERM (or the terminating signal) to each group, then SIGKILL after the
// grace period. Worker output is pumped by StreamPump on the same io_context.
#include "agents/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "agents/failure_report.h"
#include "agents/output.h"
#include "agents/process.h"
#include "agents/worker_env.h"
#include "common/asio.h"
#include "common/error.h"
#include "common/log.h"

namespace dlrun::agents {

namespace asio = boost::asio;
namespace fs = std::filesystem;

Streams StreamsByRank::forRank(int localRank) const {
  auto it = byRank.find(localRank);
  return it == byRank.end() ? all : it->second;
}

namespace detail {
namespace {

bool includes(Streams streams, Streams one) {
  return (static_cast<int>(streams) & static_cast<int>(one)) != 0;
}

int openLog(const fs::path& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write log file " + path.string() + ": " + std::strerror(errno));
  return fd;
}

}  // namespace

struct Worker {
  int localRank = 0;
  int rank = 0;
  pid_t pid = -1;
  int execReportFd = -1;
  bool alive = false;
  ExitStatus status;
  std::string errorFile;
  std::unique_ptr<StreamPump> out, err;

  ~Worker() {
    if (execReportFd >= 0) ::close(execReportFd);
  }
};

class AgentImpl {
 public:
  AgentImpl(AgentOptions options, rendezvous::Rendezvous& rendezvous)
      : options_(std::move(options)),
        rendezvous_(rendezvous),
        signals_(io_),
        stopTimer_(io_),
        inherited_(currentEnvironment()) {}

  int run() {
    becomeSubreaper();
    // Registered before any worker starts, so no exit or signal can be missed.
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2})
      signals_.add(sig);
    awaitSignal();
    prepareLogRoot();
    if (options_.nprocPerNode > 1 && !inherited_.contains("OMP_NUM_THREADS"))
      log::info("setting OMP_NUM_THREADS=1 for each worker to avoid overloading the CPUs; "
                "set it yourself to tune");
    beginRound();
    io_.run();
    if (roundThread_.joinable()) {
      rendezvous_.interrupt();
      roundThread_.join();
    }
    cleanUpLogRoot();
    return exitCode_;
  }

 private:
  enum class State { Joining, Running, Done, Stopping, Finished };

  void awaitSignal() {
    signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      onSignal(sig);
      if (state_ != State::Finished) awaitSignal();
    });
  }

  void onSignal(int sig) {
    if (sig == SIGCHLD) return reap();
    if (sig == SIGUSR1 || sig == SIGUSR2) return signalWorkers(sig);
    if (state_ == State::Stopping && stopSignal_) {
      signalWorkers(SIGKILL);  // a second terminating signal: no more patience
      return;
    }
    log::info("received " + signalName(sig) + ", stopping workers");
    stopSignal_ = sig;
    stop(sig);
  }

  void beginRound() {
    state_ = State::Joining;
    failure_.reset();
    roundEnd_.reset();
    if (!rendezvous_.multiNode()) return onJoined(rendezvous_.next());
    if (roundThread_.joinable()) roundThread_.join();  // it ended with the last round
    roundThread_ = std::thread([this] {
      try {
        rendezvous::JoinResult joined = rendezvous_.next();
        const bool member = std::holds_alternative<rendezvous::World>(joined);
        asio::post(io_, [this, joined = std::move(joined)] { onJoined(joined); });
        if (!member) return;
        asio::post(io_, [this, end = rendezvous_.awaitEnd()] { onRoundEnd(end); });
      } catch (const Error& e) {
        const int code = dynamic_cast<const ConfigError*>(&e) ? 2 : 1;
        asio::post(io_, [this, code, message = std::string(e.what())] {
          onRendezvousError(code, message);
        });
      }
    });
  }

  void onJoined(const rendezvous::JoinResult& joined) {
    if (state_ != State::Joining) return;  // a signal is ending dlrun
    if (const auto* end = std::get_if<rendezvous::RoundEnd>(&joined)) {
      roundEnd_ = *end;
      return endOfRound();
    }
    startAttempt(std::get<rendezvous::World>(joined));
  }

  void onRoundEnd(const rendezvous::RoundEnd& end) {
    log::debug("round " + std::to_string(round_) + " ended: " + end.describe());
    if (state_ == State::Finished || stopSignal_) return;
    roundEnd_ = end;
    if (state_ == State::Done) return endOfRound();
    if (state_ == State::Running) {
      log::info("stopping workers: " + end.describe());
      stop(SIGTERM);
    }
    // Stopping: endOfRound() runs once the last worker is reaped.
  }

  void onRendezvousError(int code, const std::string& message) {
    if (state_ == State::Finished) return;
    log::info("error: " + message);
    launchFailed_ = true;
    exitCode_ = code;
    if (state_ == State::Running) return stop(SIGTERM);
    if (liveWorkers() == 0) finish(code);
  }

  // Every worker is gone and the round's end is known: the job is over, or a new round begins.
  void endOfRound() {
    const rendezvous::RoundEnd& end = *roundEnd_;
    using Kind = rendezvous::RoundEnd::Kind;
    if (end.kind == Kind::Finished) return finish(0);
    if (end.countsAsFailure() && end.final) {
      [[maybe_unused]] auto n = ::write(STDERR_FILENO, end.report.data(), end.report.size());
      return finish(end.exitCode);
    }
    if (end.countsAsFailure())
      log::info("worker group failed (" + end.describe() + "); restarting, attempt " +
                std::to_string(end.failures) + " of " + std::to_string(options_.maxRestarts));
    else
      log::info("re-rendezvous: " + end.describe());
    killLeftovers();
    beginRound();
  }

  void startAttempt(const rendezvous::World& world) {
    log::debug("round " + std::to_string(world.round) + ": group rank " +
               std::to_string(world.groupRank) + " of " + std::to_string(world.groupWorldSize) +
               ", ranks " + std::to_string(world.baseRank) + "+" +
               std::to_string(world.localWorldSize) + " of " + std::to_string(world.worldSize));
    state_ = State::Running;
    runId_ = world.runId;
    round_ = world.round;
    failuresBefore_ = world.failures;
    const fs::path attemptDir = logRoot_ / runId_ / ("attempt_" + std::to_string(round_));
    workers_.clear();
    try {
      for (int local = 0; local < options_.nprocPerNode; ++local)
        workers_.push_back(startWorker(world, attemptDir, local));
      // Confirmed only now, so the workers' execs overlap instead of running one by one.
      for (auto& w : workers_) {
        try {
          confirmExec(w->pid, std::exchange(w->execReportFd, -1), options_.command.front());
        } catch (const Error&) {
          w->alive = false;
          throw;
        }
      }
    } catch (const Error& e) {
      log::info(std::string("error: ") + e.what());
      exitCode_ = 127;
      signalWorkers(SIGKILL);
      state_ = State::Stopping;
      launchFailed_ = true;
      if (liveWorkers() == 0) finish(exitCode_);
    }
  }

  std::unique_ptr<Worker> startWorker(const rendezvous::World& world, const fs::path& attemptDir,
                                      int local) {
    auto w = std::make_unique<Worker>();
    w->localRank = local;
    w->rank = world.baseRank + local;
    const Streams toFile = static_cast<Streams>(
        static_cast<int>(options_.redirects.forRank(local)) |
        static_cast<int>(options_.tee.forRank(local)));
    // A directory per rank only where the user will look; otherwise the error file alone, in
    // the temporary root (creating and removing directories costs a launch milliseconds).
    const bool rankDir = options_.logDir || toFile != Streams::None;
    const fs::path dir = attemptDir / std::to_string(local);
    if (rankDir) fs::create_directories(dir);
    w->errorFile = rankDir ? (dir / "error.json").string()
                           : (logRoot_ / ("error-" + std::to_string(round_) + "-" +
                                          std::to_string(local) + ".json")).string();

    WorkerSpec spec{options_.role, options_.maxRestarts, world.round, w->errorFile};
    const Streams fileOnly = options_.redirects.forRank(local);
    const bool shown = !options_.localRanksFilter || options_.localRanksFilter->contains(local);
    const std::string prefix =
        expandPrefix(options_.logLinePrefixTemplate, w->rank, local, options_.role);

    auto target = [&](Streams which, int console, const char* file, size_t keep) {
      OutputTarget t;
      t.consoleFd = shown && !includes(fileOnly, which) ? console : -1;
      t.prefix = prefix;
      t.fileFd = includes(toFile, which) ? openLog(dir / file) : -1;
      t.keepLines = keep;
      if (t.fileFd >= 0) keepLogRoot_ = true;
      return t;
    };
    OutputTarget out = target(Streams::Out, STDOUT_FILENO, "stdout.log", 0);
    OutputTarget err = target(Streams::Err, STDERR_FILENO, "stderr.log", kReportLines);
    // A stream shown as it is needs no pipe; stderr is always piped for the failure report.
    const bool pipeOut = out.consoleFd < 0 || out.fileFd >= 0 || !prefix.empty();

    SpawnRequest request;
    request.argv = options_.command;
    request.envp = toEnvp(workerEnvironment(inherited_, world, spec, local));
    request.pipeStdout = pipeOut;
    request.pipeStderr = true;
    SpawnedProcess p;
    try {
      p = spawnProcess(request);
    } catch (...) {
      if (out.fileFd >= 0) ::close(out.fileFd);
      if (err.fileFd >= 0) ::close(err.fileFd);
      throw;
    }
    w->pid = p.pid;
    w->execReportFd = p.execReportFd;
    w->alive = true;
    if (p.stdoutFd >= 0) {
      w->out = std::make_unique<StreamPump>(io_, p.stdoutFd, std::move(out));
      w->out->start();
    }
    w->err = std::make_unique<StreamPump>(io_, p.stderrFd, std::move(err));
    w->err->start();
    return w;
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& w : workers_) {
        if (w->pid == pid && w->alive) onWorkerExit(*w, ExitStatus::fromWaitStatus(status));
      }
    }
  }

  void onWorkerExit(Worker& w, ExitStatus status) {
    w.alive = false;
    w.status = status;
    if (w.out) w.out->drain();
    w.err->drain();
    if (state_ == State::Running && !status.success()) {
      recordFailure(w);
      stop(SIGTERM);
    }
    if (liveWorkers() > 0) return;
    if (state_ == State::Running) return onSucceeded();
    if (state_ == State::Stopping) onStopped();
  }

  void onSucceeded() {
    if (!rendezvous_.multiNode()) return finish(0);
    // The other nodes may still be running: the job is over when the round ends as Finished.
    state_ = State::Done;
    reportToRendezvous([&] { rendezvous_.reportSuccess(); });
    if (roundEnd_) endOfRound();
  }

  void recordFailure(const Worker& w) {
    failure_ = WorkerFailure{w.rank, w.localRank, options_.nodeName, w.status,
                             readErrorFile(w.errorFile), w.err->lastLines()};
    if (!rendezvous_.multiNode()) return;
    rendezvous::RoundEnd end{.kind = rendezvous::RoundEnd::Kind::WorkerFailed,
                             .node = options_.nodeName,
                             .rank = w.rank,
                             .exitCode = w.status.shellCode(),
                             .report = formatFailureReport(*failure_, failuresBefore_)};
    reportToRendezvous([&] { rendezvous_.reportFailure(end); });
  }

  // A report that cannot reach the store leaves the round to end by the lease: this node's
  // watcher notices the lost store too.
  template <typename Fn>
  void reportToRendezvous(Fn&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      log::info(std::string("cannot report to the rendezvous store: ") + e.what());
    }
  }

  size_t liveWorkers() const {
    size_t n = 0;
    for (const auto& w : workers_) n += w->alive ? 1 : 0;
    return n;
  }

  void signalWorkers(int sig) {
    for (const auto& w : workers_) {
      if (w->alive) ::kill(-w->pid, sig);
    }
  }

  void stop(int sig) {
    state_ = State::Stopping;
    signalWorkers(sig);
    if (liveWorkers() == 0) return onStopped();
    stopTimer_.expires_after(options_.stopTimeout);
    stopTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      for (const auto& w : workers_) {
        if (w->alive)
          log::info("rank " + std::to_string(w->rank) + " did not stop within " +
                    std::to_string(options_.stopTimeout.count()) + " ms; sending SIGKILL");
      }
      signalWorkers(SIGKILL);
    });
  }

  void onStopped() {
    stopTimer_.cancel();
    if (launchFailed_) return finish(exitCode_);
    if (stopSignal_) return finish(128 + *stopSignal_);
    if (rendezvous_.multiNode()) {
      state_ = State::Done;  // no workers; the round's end decides what follows
      if (roundEnd_) endOfRound();
      return;
    }
    if (restarts_ < options_.maxRestarts) {
      ++restarts_;
      log::info("worker group failed (rank " + std::to_string(failure_->rank) + ", " +
                failure_->status.describe() + "); restarting, attempt " +
                std::to_string(restarts_) + " of " + std::to_string(options_.maxRestarts));
      killLeftovers();
      return beginRound();
    }
    const std::string report = formatFailureReport(*failure_, restarts_);
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, report.data(), report.size());
    finish(failure_->status.shellCode());
  }

  // Whatever the workers left behind in their process groups goes with them, so no job leaves
  // orphans, whether it failed or succeeded.
  void killLeftovers() {
    for (const auto& w : workers_) ::kill(-w->pid, SIGKILL);
  }

  void finish(int code) {
    killLeftovers();
    state_ = State::Finished;
    exitCode_ = code;
    stopTimer_.cancel();
    signals_.cancel();
    io_.stop();
  }

  void prepareLogRoot() {
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

  void cleanUpLogRoot() {
    if (keepLogRoot_) {
      if (!options_.logDir) log::info("worker logs are in " + logRoot_.string());
      return;
    }
    std::error_code ec;
    fs::remove_all(logRoot_, ec);
  }

  static constexpr size_t kReportLines = 20;

  AgentOptions options_;
  rendezvous::Rendezvous& rendezvous_;
  asio::io_context io_{1};
  asio::signal_set signals_;
  asio::steady_timer stopTimer_;
  const Environment inherited_;
  State state_ = State::Joining;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::optional<WorkerFailure> failure_;
  std::optional<int> stopSignal_;
  bool launchFailed_ = false;
  int restarts_ = 0;         // failure restarts of a single-node job
  int failuresBefore_ = 0;   // failure restarts used before the current round
  int round_ = 0;
  std::optional<rendezvous::RoundEnd> roundEnd_;
  std::thread roundThread_;  // next() and awaitEnd() of a multi-node rendezvous
  int exitCode_ = 0;
  std::string runId_;
  fs::path logRoot_;
  bool keepLogRoot_ = false;
};

}  // namespace detail

Agent::Agent(AgentOptions options, rendezvous::Rendezvous& rendezvous)
    : impl_(std::make_unique<detail::AgentImpl>(std::move(options), rendezvous)) {}

Agent::~Agent() = default;

int Agent::run() { return impl_->run(); }

}  // namespace dlrun::agents
