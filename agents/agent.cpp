// The agent's state machine. One io_context, one thread; every event is a handler:
//
//   Joining --the round closed------------------> Running
//   Running --a worker fails--------------------> Stopping(failure)
//   Running --the round ended elsewhere---------> Stopping(round end)
//   Running --SIGINT/TERM/HUP/QUIT--------------> Stopping(signal)
//   Running --a hang ended the round------------> (stacks taken) Stopping(round end)
//   Running --every worker exited 0-------------> Done
//   Stopping --last worker reaped---------------> Done | Finished(128+signal, or 127)
//   Done --the round ended----------------------> Finished(0, or the final failure's code)
//                                                 | Joining (a new round)
//
// The rendezvous decides how a round ends, for one node as for several: this node's workers
// report their success or failure to it, and the round's end (from this node or another)
// comes back through awaitEnd(). Its calls block, so they run on a thread of their own
// (next(), then awaitEnd()) and post what they learn to this io_context.
//
// Starting: the round's shared environment is built once, every worker's exec is checked
// against the kernel's limits, and then the workers start a batch at a time, the io_context
// running between batches, so a node of thousands reaps, reads output and heeds signals while
// it starts.
//
// --roles (roles.h): workers of a `service` role do not end the job: this node's part is done
// (reported as a success) once its other workers exited 0, and its services run on until the
// round ends, then are stopped; a service that fails before fails the round like any worker.
// A failed worker of an `alone` role is started again in its place while the round goes on,
// as long as the restarts used (the round's and this node's lone ones) leave one; else its
// failure is final.
//
// --hang-timeout: a HangWatcher watches the round's workers; a hang it sees is reported to the
// rendezvous as a failure (or, under --hang-action=report, only reported), and a round that a
// hang ended on any node has every node take its workers' stacks before it stops them.
//
// The control plane (ControlPublisher): the node's state at each change of its workers and the
// job's events go to the rendezvous store; the events of the job as a whole (a round closed or
// ended, a restart, the job's end) come from group rank 0 alone. SignalJob's signals are
// forwarded to every worker; StopJob stops the job like a signal with a stated exit code.
//
// SIGCHLD drives reaping (waitpid(-1) also reaps descendants re-parented to this subreaper).
// The signals of --signals-to-handle (SIGTERM, SIGINT, SIGHUP, SIGQUIT by default) stop the job;
// SIGUSR1/SIGUSR2 otherwise are forwarded to every worker's process group and change nothing
// else, and a default one left out is ignored. Stopping sends SIGTERM (or the terminating
// signal) to each group, then SIGKILL after the grace period. Worker output is pumped by
// StreamPump on the same io_context.
#include "agents/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "agents/failure_report.h"
#include "agents/file_timer.h"
#include "agents/hang_watcher.h"
#include "agents/output.h"
#include "agents/process.h"
#include "agents/worker.h"
#include "agents/worker_env.h"
#include "common/asio.h"
#include "common/error.h"
#include "common/log.h"
#include "common/signal_name.h"

namespace dlrun::agents {

namespace asio = boost::asio;
namespace fs = std::filesystem;

Streams StreamsByRank::forRank(int localRank) const {
  auto it = byRank.find(localRank);
  return it == byRank.end() ? all : it->second;
}

namespace {

// Where a worker's output goes; the caller sets its directory (where wantsDir says).
WorkerOutput outputFor(const AgentOptions& options, int local, int rank) {
  WorkerOutput output;
  output.fileOnly = options.redirects.forRank(local);
  output.toFile = static_cast<Streams>(static_cast<int>(output.fileOnly) |
                                       static_cast<int>(options.tee.forRank(local)));
  output.shown = !options.localRanksFilter || options.localRanksFilter->contains(local);
  const std::string& role =
      options.roles.empty() ? options.role : roleOfLocal(options.roles, local).name;
  output.prefix = expandPrefix(options.logLinePrefixTemplate, rank, local, role);
  return output;
}

// A directory per rank only where the user will look; otherwise the error file alone, in the
// temporary root (creating and removing directories costs a launch milliseconds).
bool wantsDir(const AgentOptions& options, const WorkerOutput& output) {
  return options.logDir || output.toFile != Streams::None;
}

}  // namespace

DescriptorNeeds descriptorNeeds(const AgentOptions& options, int inUse) {
  DescriptorNeeds needs{.inUse = inUse, .workers = options.nprocPerNode};
  for (int local = 0; local < options.nprocPerNode; ++local) {
    WorkerOutput output = outputFor(options, local, local);
    if (wantsDir(options, output)) output.dir = ".";
    needs.workerFiles += Worker::descriptors(output);
  }
  // torch's workers each open a client to the store at MASTER_ADDR.
  if (options.servesStore) needs.storeClients = options.nprocPerNode;
  return needs;
}

void checkDescriptors(const AgentOptions& options) {
  const size_t limit = raiseDescriptorLimit();
  if (auto problem = descriptorProblem(descriptorNeeds(options, openDescriptors()), limit))
    throw ConfigError(*problem);
}

namespace detail {

class AgentImpl {
 public:
  AgentImpl(AgentOptions options, rendezvous::Rendezvous& rendezvous)
      : options_(std::move(options)),
        rendezvous_(rendezvous),
        signals_(io_),
        launcherLink_(io_),
        stopTimer_(io_),
        inherited_(currentEnvironment()),
        stopSignals_(options_.signalsToHandle.value_or(kDefaultStopSignals)) {
    // As torchrun 2.x, which gives every worker the list (its default four unless the flag
    // names others), for a worker that starts processes of its own through torch.
    std::string names;
    for (int sig : stopSignals_) names += (names.empty() ? "" : ",") + signalName(sig);
    services_["TORCHELASTIC_SIGNALS_TO_HANDLE"] = names;
    if (options_.hang)
      hang_.emplace(io_, *options_.hang,
                    options_.nodeName.empty() ? std::string("this node") : options_.nodeName,
                    rendezvous_);
  }

  int run() {
    try {
      checkDescriptors(options_);
    } catch (const ConfigError& e) {
      log::info(std::string("error: ") + e.what());
      return 2;
    }
    if (options_.metrics) {
      try {
        metrics_.emplace(io_, *options_.metrics, options_.nodeName);
      } catch (const ConfigError& e) {
        log::info(std::string("error: ") + e.what());
        return 2;
      }
    }
    becomeSubreaper();
    // Registered before any worker starts, so no exit or signal can be missed.
    signals_.add(SIGCHLD);
    for (int sig : jobSignals(stopSignals_)) signals_.add(sig);
    awaitSignal();
    if (options_.controlStdin) followLauncher();
    prepareLogRoot();
    if (options_.control)
      control_ = std::make_unique<ControlPublisher>(
          *options_.control, [this](const ControlCommand& command) {
            asio::post(io_, [this, command] { onControlCommand(command); });
          });
    serveFileTimer();
    if (options_.control && !options_.control->announce.empty())
      log::info(options_.control->announce);
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

  // A signal that reached this agent, or its launcher (--control-stdin).
  void onSignal(int sig) {
    if (sig == SIGCHLD) return reap();
    if (std::find(stopSignals_.begin(), stopSignals_.end(), sig) != stopSignals_.end())
      return stopOn(sig);
    if (sig == SIGUSR1 || sig == SIGUSR2) return signalWorkers(sig);
    log::info("received " + signalName(sig) + ", which --signals-to-handle leaves out: ignored");
  }

  void stopOn(int sig) {
    if (state_ == State::Stopping && stopSignal_) {
      signalWorkers(SIGKILL);  // a second terminating signal: no more patience
      return;
    }
    log::info("received " + signalName(sig) + ", stopping workers");
    stopSignal_ = sig;
    if (roundEnd_ && roundEnd_->kind == rendezvous::RoundEnd::Kind::Stopped) {
      // Another node's stop came first (scancel signals every node, not all at once): that
      // stop is the job's, and its store may already be gone with the node that served it.
      stopEnd_ = roundEnd_;
    } else {
      // The other nodes hear of a deliberate stop before this one stops its workers, so none
      // mistakes it for a lost node.
      reportToRendezvous([&] { stopEnd_ = rendezvous_.reportStop(sig); });
    }
    stop(sig);
  }

  // --control-stdin: the launcher's signals arrive as lines on stdin, which moves off fd 0 so the
  // workers cannot read it. Once the connection is gone, writes to stdout fail (EPIPE) instead of
  // killing the agent before it has stopped its workers.
  void followLauncher() {
    ::signal(SIGPIPE, SIG_IGN);
    const int fd = ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || null < 0) throw Error("--control-stdin: cannot take over stdin");
    ::dup2(null, STDIN_FILENO);
    ::close(null);
    launcherLink_.assign(fd);
    readLauncher();
  }

  void readLauncher() {
    launcherLink_.async_read_some(
        asio::buffer(launcherBuffer_), [this](const boost::system::error_code& ec, size_t n) {
          if (ec == asio::error::operation_aborted || state_ == State::Finished) return;
          if (ec) {
            log::info("the launcher's connection closed");
            return stopOn(SIGHUP);
          }
          launcherLines_.feed(std::string_view(launcherBuffer_.data(), n), [&](auto line) {
            if (auto sig = parseSignal(line); sig && sig != SIGCHLD) onSignal(*sig);
          });
          if (state_ != State::Finished) readLauncher();
        });
  }

  void onControlCommand(const ControlCommand& command) {
    if (state_ == State::Finished) return;
    if (command.kind == ControlCommand::Kind::Signal) {
      log::info("control plane: " + signalName(command.value) + " to every worker");
      return signalWorkers(command.value);
    }
    if (stopSignal_) return;
    log::info("control plane: stopping the job (exit code " + std::to_string(command.value) +
              ")");
    stopSignal_ = SIGTERM;
    reportToRendezvous([&] { stopEnd_ = rendezvous_.reportStop(SIGTERM); });
    // On one node the rendezvous knows nothing of the control plane's stop: its code stands.
    if (!stopEnd_) stopEnd_ = rendezvous::jobStopped(SIGTERM, options_.nodeName);
    stopEnd_->exitCode = command.value;
    stop(SIGTERM);
  }

  void beginRound() {
    state_ = State::Joining;
    roundEnd_.reset();
    if (roundThread_.joinable()) roundThread_.join();  // it ended with the last round
    roundThread_ = std::thread([this] { runRendezvous(); });
  }

  // The rendezvous thread's whole life for one round. Nothing escapes it: an exception here
  // would end the process without stopping the workers.
  void runRendezvous() {
    auto fail = [this](int code, std::string message) {
      asio::post(io_, [this, code, message = std::move(message)] {
        onRendezvousError(code, message);
      });
    };
    try {
      rendezvous::JoinResult joined = rendezvous_.next();
      const bool member = std::holds_alternative<rendezvous::World>(joined);
      asio::post(io_, [this, joined = std::move(joined)] { onJoined(joined); });
      if (!member) return;
      asio::post(io_, [this, end = rendezvous_.awaitEnd()] { onRoundEnd(end); });
    } catch (const ConfigError& e) {
      fail(2, e.what());
    } catch (const std::exception& e) {
      fail(1, e.what());
    } catch (...) {
      fail(1, "the rendezvous failed with an unknown error");
    }
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
    log::debug("round " + std::to_string(world_.round) + " ended: " + end.describe());
    if (state_ == State::Finished || stopSignal_) return;
    if (metrics_) metrics_->view().roundEnded(end, Clock::now());
    publishJobEvent("round_ended", end.countsAsFailure() ? end.rank : -1, end.describe());
    roundEnd_ = end;
    if (state_ == State::Done) return endOfRound();
    if (state_ == State::Running && end.hang && hang_) return takeStacksThenStop(end);
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
    if (end.kind == Kind::Stopped) {
      log::info(end.report);
      return finish(end.exitCode);
    }
    if (end.countsAsFailure() && end.final) {
      [[maybe_unused]] auto n = ::write(STDERR_FILENO, end.report.data(), end.report.size());
      return finish(end.exitCode);
    }
    if (end.countsAsFailure()) {
      const std::string attempt = "attempt " + std::to_string(end.failures) + " of " +
                                  std::to_string(world_.maxRestarts);
      log::info("worker group failed (" + end.describe() + "); restarting, " + attempt);
      publishJobEvent("restart", -1, attempt + " after " + end.describe());
    }
    else
      log::info("re-rendezvous: " + end.describe());
    if (metrics_) metrics_->view().restarting(end);
    killLeftovers();
    beginRound();
  }

  void startAttempt(const rendezvous::World& world) {
    log::debug("round " + std::to_string(world.round) + ": group rank " +
               std::to_string(world.groupRank) + " of " + std::to_string(world.groupWorldSize) +
               ", ranks " + std::to_string(world.baseRank) + "+" +
               std::to_string(world.localWorldSize) + " of " + std::to_string(world.worldSize));
    state_ = State::Running;
    world_ = world;
    workers_.clear();
    retired_.clear();
    byPid_.clear();
    live_ = 0;
    liveEnding_ = 0;
    loneRestarts_ = 0;
    successReported_ = false;
    if (fileTimer_) fileTimer_->clear();
    expiredTimers_.clear();
    ++attempt_;
    try {
      prepareLaunches();
    } catch (const ConfigError& e) {
      return failToStart(2, e.what());
    } catch (const Error& e) {
      return failToStart(127, e.what());
    }
    starting_ = true;
    startSome(attempt_);
  }

  // Everything a start needs, before the first fork: the shared environment, built once; each
  // worker's launch; and every exec checked against the kernel's limits, so a large job never
  // fails half-way through its start.
  void prepareLaunches() {
    const ExecLimits limits = ExecLimits::ofThisProcess();
    std::string cluster;
    if (options_.tfConfig != TfConfigMode::Never) cluster = tfConfigCluster(world_);
    std::string longestType = "worker";
    for (const auto& role : world_.workerRoles)
      if (role.size() > longestType.size()) longestType = role;
    const TfConfigChoice tf = chooseTfConfig(options_.tfConfig, cluster, world_.worldSize,
                                             limits.maxString, longestType);
    if (!tf.warning.empty() && !tfConfigWarned_) {
      log::warn(tf.warning);
      tfConfigWarned_ = true;
    }
    const fs::path attemptDir = this->attemptDir();
    RoundSpec spec{.role = options_.role,
                   .maxRestarts = world_.maxRestarts,
                   .restartCount = world_.round,
                   .tfCluster = tf.set ? std::optional(std::move(cluster)) : std::nullopt,
                   .inheritTfConfig = options_.tfConfig == TfConfigMode::Never,
                   .services = services_,
                   .virtualLocalRank = options_.virtualLocalRank};
    if (hang_) hang_->prepareRound(attemptDir, options_.nprocPerNode, inherited_, spec);
    if (metrics_)
      metrics_->prepareRound(attemptDir, options_.nprocPerNode, hang_ ? hang_->board() : nullptr,
                             spec);
    environment_.emplace(inherited_, world_, std::move(spec));
    ExecSizes command;
    command.add(options_.command.front().size());  // the file name exec copies as well
    for (const auto& arg : options_.command) command.add(arg.size());
    launches_.clear();
    launches_.reserve(options_.nprocPerNode);
    for (int local = 0; local < options_.nprocPerNode; ++local) {
      WorkerLaunch launch = launchOf(attemptDir, local);
      ExecSizes sizes = environment_->sizes(local, launch.errorFile);
      sizes.add(command);
      if (!options_.localRankFlag.empty()) sizes.add(launch.argv.back().size());
      if (auto problem = execProblem(sizes, limits))
        throw Error("cannot execute " + options_.command.front() + " as rank " +
                    std::to_string(launch.rank) + ": " + *problem);
      launches_.push_back(std::move(launch));
    }
  }

  // Starts the next batch of workers, then lets the io_context run before the next one.
  void startSome(uint64_t attempt) {
    if (attempt != attempt_) return;  // a batch of a round that already ended
    if (state_ != State::Running) return doneStarting();
    const size_t end = std::min(launches_.size(), workers_.size() + kStartBatch);
    try {
      while (workers_.size() < end) {
        const int local = static_cast<int>(workers_.size());
        WorkerLaunch& launch = launches_[local];
        launch.envp = environment_->own(local, launch.errorFile);
        launch.sharedEnvp = environment_->shared();
        std::unique_ptr<Worker> worker = Worker::start(io_, std::move(launch));
        byPid_[worker->pid()] = worker.get();
        ++live_;
        if (!isService(local)) ++liveEnding_;
        workers_.push_back(std::move(worker));
      }
    } catch (const Error& e) {
      doneStarting();
      log::info(std::string("error: ") + e.what());
      exitCode_ = 127;
      signalWorkers(SIGKILL);
      state_ = State::Stopping;
      launchFailed_ = true;
      if (liveWorkers() == 0) finish(exitCode_);
      return;
    }
    if (workers_.size() < launches_.size()) {
      asio::post(io_, [this, attempt] { startSome(attempt); });
      return;
    }
    log::debug("started " + std::to_string(workers_.size()) + " workers");
    doneStarting();
    if (hang_) watchForHangs();
    if (metrics_)
      metrics_->view().roundStarted(world_, static_cast<int>(workers_.size()), Clock::now());
    publishStarted();
    watchStoreHost();
    // Every worker may have exited already, or this node may run services only.
    if (state_ == State::Running && liveEnding_ == 0) onSucceeded();
  }

  void doneStarting() {
    starting_ = false;
    launches_ = {};
    // A worker restarted alone gets the environment its first start had.
    if (!anyAlone()) environment_.reset();
  }

  fs::path attemptDir() const {
    return logRoot_ / world_.runId / ("attempt_" + std::to_string(world_.round));
  }

  const RoleSpec* roleOf(int local) const {
    return options_.roles.empty() ? nullptr : &roleOfLocal(options_.roles, local);
  }
  bool isService(int local) const {
    const RoleSpec* role = roleOf(local);
    return role != nullptr && role->service;
  }
  bool anyAlone() const {
    return std::any_of(options_.roles.begin(), options_.roles.end(),
                       [](const RoleSpec& role) { return role.alone; });
  }

  // A failed worker of an `alone` role while restarts are left: a new process takes its place
  // (same ranks and environment) and the round goes on. False when it must fail the round.
  bool restartAlone(const Worker& failed) {
    const int local = failed.localRank();
    const RoleSpec* role = roleOf(local);
    if (role == nullptr || !role->alone || !environment_ ||
        world_.failures + loneRestarts_ >= world_.maxRestarts)
      return false;
    WorkerLaunch launch = launchOf(attemptDir(), local);
    launch.envp = environment_->own(local, launch.errorFile);
    launch.sharedEnvp = environment_->shared();
    std::unique_ptr<Worker> worker;
    try {
      worker = Worker::start(io_, std::move(launch));
    } catch (const Error& e) {
      log::info("cannot restart rank " + std::to_string(failed.rank()) + ": " + e.what());
      return false;
    }
    ++loneRestarts_;
    const std::string what = "rank " + std::to_string(failed.rank()) + " (" + role->name +
                             ") " + failed.status().describe() + "; restarted alone, restart " +
                             std::to_string(world_.failures + loneRestarts_) + " of " +
                             std::to_string(world_.maxRestarts);
    log::info(what);
    publishEvent("restart", failed.rank(), what);
    byPid_.erase(failed.pid());
    byPid_[worker->pid()] = worker.get();
    ++live_;
    if (!role->service) ++liveEnding_;
    // `failed` stays until the next round: its output pumps may still hold its last lines.
    retired_.push_back(std::move(workers_[local]));
    workers_[local] = std::move(worker);
    return true;
  }

  // Nothing started: the round cannot begin on this node.
  void failToStart(int code, const std::string& message) {
    log::info("error: " + message);
    launchFailed_ = true;
    finish(code);
  }

  WorkerLaunch launchOf(const fs::path& attemptDir, int local) {
    WorkerLaunch launch;
    launch.localRank = local;
    launch.rank = world_.baseRank + local;
    launch.argv = options_.command;
    if (!options_.localRankFlag.empty())
      launch.argv.push_back(options_.localRankFlag + "=" +
                            std::to_string(options_.virtualLocalRank ? 0 : local));
    launch.output = outputFor(options_, local, launch.rank);
    WorkerOutput& output = launch.output;
    if (wantsDir(options_, output)) {
      output.dir = attemptDir / std::to_string(local);
      fs::create_directories(*output.dir);
      launch.errorFile = (*output.dir / "error.json").string();
      if (output.toFile != Streams::None) keepLogRoot_ = true;
    } else {
      launch.errorFile = (logRoot_ / ("error-" + std::to_string(world_.round) + "-" +
                                      std::to_string(local) + ".json")).string();
    }
    return launch;
  }

  void reap() {
    int status = 0;
    pid_t pid;
    bool exited = false;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      auto it = byPid_.find(pid);
      if (it != byPid_.end() && it->second->alive()) {
        onWorkerExit(*it->second, ExitStatus::fromWaitStatus(status));
        exited = true;
      }
    }
    // One node state for all the exits one SIGCHLD brings (thousands at a job's end), not one
    // each; a finished agent has published its last already.
    if (exited && state_ != State::Finished) publishNode(stateName());
  }

  void onWorkerExit(Worker& w, ExitStatus status) {
    w.exited(status);
    --live_;
    if (!isService(w.localRank())) --liveEnding_;
    if (metrics_) metrics_->view().workerExited(status.shellCode());
    if (state_ == State::Running && !status.success())
      publishEvent("worker_failed", w.rank(), status.describe());
    if (fileTimer_) fileTimer_->forget(w.pid());
    if (state_ == State::Running && !status.success()) {
      if (restartAlone(w)) return;
      reportFailure(w);
      stop(SIGTERM);
    }
    // While starting, the workers not yet started decide: startSome() checks at its end.
    if (state_ == State::Running) {
      if (!starting_ && liveEnding_ == 0) onSucceeded();
      return;
    }
    if (liveWorkers() > 0) return;
    if (state_ == State::Stopping) onStopped();
  }

  // Every worker that ends the job exited 0. Other nodes may still be running: the job is over
  // when the round ends as Finished, and this node's services serve until then.
  void onSucceeded() {
    if (!successReported_) {
      successReported_ = true;
      reportToRendezvous([&] { rendezvous_.reportSuccess(); });
    }
    if (liveWorkers() > 0) return;
    state_ = State::Done;
    if (roundEnd_) endOfRound();
  }

  void reportFailure(const Worker& w) {
    const auto timer = expiredTimers_.find(w.pid());
    const WorkerFailure failure{w.rank(), w.localRank(), options_.nodeName, w.status(),
                                readErrorFile(w.errorFile()), w.lastErrorLines(),
                                timer == expiredTimers_.end() ? "" : timer->second};
    rendezvous::RoundEnd end{.kind = rendezvous::RoundEnd::Kind::WorkerFailed,
                             .node = options_.nodeName,
                             .rank = w.rank(),
                             .exitCode = w.status().shellCode(),
                             .failures = world_.failures + loneRestarts_,
                             .report = formatFailureReport(failure, world_.failures)};
    flushEvents();
    reportToRendezvous([&] { rendezvous_.reportFailure(end); });
  }

  // This node's events reach the store before a report that ends the round, so the events of
  // the job (group rank 0 publishes the round's end and the restart) show the cause first. It
  // blocks, as the report itself does; a writer that cannot reach the store costs the bound.
  void flushEvents() {
    if (control_) control_->flush(std::chrono::milliseconds(500));
  }

  void watchForHangs() {
    std::vector<WatchedWorker> watched;
    for (const auto& w : workers_) watched.push_back({w->pid(), w->rank(), w->localRank()});
    hang_->watch(std::move(watched), [this](const HungWorker& hung) { onHang(hung); });
  }

  void onHang(const HungWorker& hung) {
    if (state_ != State::Running) return;
    std::ostringstream silent;
    silent << std::fixed << std::setprecision(1) << hung.silentSeconds;
    const std::string what =
        "rank " + std::to_string(hung.rank) +
        (options_.nodeName.empty() ? "" : " on " + options_.nodeName) +
        " made no progress for " + silent.str() + " s" +
        (hung.step ? " after step " + std::to_string(*hung.step) : "") + " (--hang-timeout)";
    log::info("hang: " + what);
    publishEvent("hang", hung.rank, what);
    keepLogRoot_ = true;  // the stacks go there
    if (hang_->options().action == HangAction::Report) {
      hang_->collect(false, true, [this, dir = hang_->stackDir()] {
        log::info("stacks are in " + dir.string() + "; the job goes on (--hang-action=report)");
      });
      return;
    }
    rendezvous::RoundEnd end{.kind = rendezvous::RoundEnd::Kind::WorkerFailed,
                             .node = options_.nodeName,
                             .rank = hung.rank,
                             .exitCode = kHangExitCode,
                             .final = hang_->options().action == HangAction::Exit,
                             .hang = true,
                             .report = "dlrun: hang: " + what + "; stacks of every rank are in " +
                                       hang_->stackDir().string() + " on each node\n"};
    flushEvents();
    reportToRendezvous([&] { rendezvous_.reportFailure(end); });
  }

  // Every node takes its workers' stacks while they still hang, then stops them; the node that
  // saw the hang prints the summary once every node's part is in.
  void takeStacksThenStop(const rendezvous::RoundEnd& end) {
    hang_->unwatch();
    keepLogRoot_ = true;
    log::info("taking the stacks of this node's workers into " + hang_->stackDir().string());
    hang_->collect(true, end.node == options_.nodeName, [this, end] {
      if (state_ != State::Running) return;
      // Hung workers heed no SIGTERM (those waiting in a collective never get to): no grace.
      log::info("stopping workers: " + end.describe());
      stop(SIGKILL);
    });
  }

  // A connection to the agent serving the workers' store that waits for nothing: it ends only
  // when that agent's process does (its sockets close with it).
  void watchStoreHost() {
    if (!options_.watchStoreHost || world_.groupRank == 0 || !world_.agentStore) return;
    storeHost_.emplace(io_);
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(world_.masterAddr, ec);
    if (ec) return;
    const std::string what = world_.masterAddr + ":" + std::to_string(world_.masterPort);
    storeHost_->async_connect(
        {address, world_.masterPort},
        [this, attempt = attempt_, what](const boost::system::error_code& error) {
          if (error || attempt != attempt_) return;  // never watched: the lease still is
          storeHost_->async_read_some(
              asio::buffer(storeHostByte_),
              [this, attempt, what](const boost::system::error_code& gone, size_t) {
                if (gone == asio::error::operation_aborted || attempt != attempt_ ||
                    state_ != State::Running)
                  return;
                log::info("the node serving the workers' store at " + what + " is gone");
                reportToRendezvous([&] {
                  rendezvous_.reportLost("the node serving the workers' store at " + what);
                });
              });
        });
  }

  // What the control plane shows of this node: its state and its workers'.
  void publishNode(const std::string& state) {
    if (!control_ && !metrics_) return;
    rendezvous::control::NodeState node{.name = options_.control ? options_.control->nodeName
                                                                 : options_.nodeName,
                                        .address = options_.control ? options_.control->address
                                                                    : "",
                                        .groupRank = world_.groupRank,
                                        .state = state,
                                        .round = world_.round,
                                        .logDir = logRoot_.string(),
                                        .updated = wallSeconds()};
    for (const auto& w : workers_) {
      const bool done = !w->alive();
      node.workers.push_back(
          {.rank = w->rank(),
           .localRank = w->localRank(),
           .pid = w->pid(),
           .state = !done ? "running"
                    : w->status().success() ? "succeeded"
                    : stopSignal_ || roundEnd_ ? "stopped"
                                               : "failed",
           .exit = done ? w->status().describe() : ""});
    }
    if (metrics_) metrics_->view().node(node);
    if (control_) control_->node(std::move(node));
  }

  const char* stateName() const {
    switch (state_) {
      case State::Joining: return "joining";
      case State::Running: return "running";
      case State::Done: return "done";
      case State::Stopping: return "stopping";
      case State::Finished: return "exited";
    }
    return "?";
  }

  void publishEvent(const std::string& kind, int rank, const std::string& detail,
                    bool toControl = true) {
    if (!(control_ && toControl) && !metrics_) return;
    rendezvous::control::JobEvent event{
        .time = wallSeconds(),
        .kind = kind,
        .node = options_.control ? options_.control->nodeName : options_.nodeName,
        .round = world_.round,
        .rank = rank,
        .detail = detail};
    if (metrics_) metrics_->view().event(event);
    if (control_ && toControl) control_->event(std::move(event));
  }

  // An event of the job as a whole: group rank 0 speaks for every node to the control plane;
  // every node's page shows what it saw.
  void publishJobEvent(const std::string& kind, int rank, const std::string& detail) {
    if (attempt_ > 0) publishEvent(kind, rank, detail, world_.groupRank == 0);
  }

  void publishStarted() {
    if ((!control_ && !metrics_) || workers_.empty()) return;
    publishNode("running");
    publishJobEvent("round_closed", -1,
                    "round " + std::to_string(world_.round) + ": " +
                        std::to_string(world_.groupWorldSize) + " nodes, " +
                        std::to_string(world_.worldSize) + " workers");
    publishEvent("worker_started", -1,
                 "ranks " + std::to_string(world_.baseRank) + "-" +
                     std::to_string(world_.baseRank + world_.localWorldSize - 1) + " started");
  }

  static double wallSeconds() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
        .count();
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

  size_t liveWorkers() const { return live_; }

  void signalWorkers(int sig) {
    for (const auto& w : workers_) w->signal(sig);
  }

  void stop(int sig) {
    state_ = State::Stopping;
    if (storeHost_) storeHost_.reset();
    if (hang_) hang_->unwatch();
    signalWorkers(sig);
    if (liveWorkers() == 0) return onStopped();
    stopTimer_.expires_after(options_.stopTimeout);
    stopTimer_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      for (const auto& w : workers_) {
        if (w->alive())
          log::info("rank " + std::to_string(w->rank()) + " did not stop within " +
                    std::to_string(options_.stopTimeout.count()) + " ms; sending SIGKILL");
      }
      signalWorkers(SIGKILL);
    });
  }

  void onStopped() {
    stopTimer_.cancel();
    if (launchFailed_) return finish(exitCode_);
    if (stopSignal_) {
      const bool stopped = stopEnd_ && stopEnd_->kind == rendezvous::RoundEnd::Kind::Stopped;
      if (stopped) log::info(stopEnd_->report);
      return finish(stopped ? stopEnd_->exitCode : 128 + *stopSignal_);
    }
    state_ = State::Done;  // no workers; the round's end decides what follows
    if (roundEnd_) endOfRound();
  }

  // Whatever the workers left behind in their process groups goes with them, so no job leaves
  // orphans, whether it failed or succeeded.
  void killLeftovers() {
    for (const auto& w : workers_) w->killGroup();
  }

  void finish(int code) {
    killLeftovers();
    state_ = State::Finished;
    exitCode_ = code;
    publishNode("exited");
    publishJobEvent("job_ended", -1, "every agent exits with " + std::to_string(code));
    stopTimer_.cancel();
    signals_.cancel();
    launcherLink_.close();
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

  // torch's file-based timer, served as torch's agent serves it: when the agent's environment
  // has TORCHELASTIC_ENABLE_FILE_TIMER=1, at TORCHELASTIC_TIMER_FILE if set, and the workers get
  // that variable. One FIFO for the whole job; its timers go with each round's workers.
  void serveFileTimer() {
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
  void onTimerExpired(const TimerExpiry& expiry) {
    const std::string timer = "timer '" + expiry.scope + "' expired";
    auto it = byPid_.find(expiry.pid);
    if (it == byPid_.end()) it = byPid_.find(::getpgid(expiry.pid));
    if (it == byPid_.end() || !it->second->alive()) {
      log::info("pid " + std::to_string(expiry.pid) + ": " + timer +
                ", but it is not one of this node's workers; not signalled");
      return;
    }
    const std::string who = "rank " + std::to_string(it->second->rank()) + " (pid " +
                            std::to_string(expiry.pid) + ")";
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

  void cleanUpLogRoot() {
    if (keepLogRoot_) {
      if (!options_.logDir) log::info("worker logs are in " + logRoot_.string());
      return;
    }
    std::error_code ec;
    fs::remove_all(logRoot_, ec);
  }

  AgentOptions options_;
  rendezvous::Rendezvous& rendezvous_;
  asio::io_context io_{1};
  asio::signal_set signals_;
  asio::posix::stream_descriptor launcherLink_;  // --control-stdin
  std::array<char, 256> launcherBuffer_{};
  LineSplitter launcherLines_;
  asio::steady_timer stopTimer_;
  const Environment inherited_;
  State state_ = State::Joining;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unordered_map<pid_t, Worker*> byPid_;  // the round's workers, for reaping
  std::vector<std::unique_ptr<Worker>> retired_;  // replaced by restartAlone()
  size_t live_ = 0;                           // workers not yet reaped
  size_t liveEnding_ = 0;  // of those, the ones not of a service role (they end the job)
  int loneRestarts_ = 0;   // this round's workers restarted alone (restartAlone)
  bool successReported_ = false;
  // Starting the round's workers (startSome): its number, what is left to start.
  static constexpr size_t kStartBatch = 64;
  uint64_t attempt_ = 0;
  bool starting_ = false;
  std::optional<NodeEnvironment> environment_;
  std::vector<WorkerLaunch> launches_;
  bool tfConfigWarned_ = false;
  std::optional<int> stopSignal_;
  std::optional<rendezvous::RoundEnd> stopEnd_;  // how this node's stop ends the job
  bool launchFailed_ = false;
  rendezvous::World world_;  // the current round's
  std::optional<rendezvous::RoundEnd> roundEnd_;
  std::thread roundThread_;  // the rendezvous's blocking calls (runRendezvous)
  std::optional<HangWatcher> hang_;  // with --hang-timeout
  std::unique_ptr<ControlPublisher> control_;  // with the control plane
  std::optional<AgentMetrics> metrics_;  // --metrics-port
  std::optional<asio::ip::tcp::socket> storeHost_;  // watchStoreHost's connection
  std::array<char, 1> storeHostByte_{};
  int exitCode_ = 0;
  fs::path logRoot_;
  bool keepLogRoot_ = false;
  Environment services_;  // the agent's services' variables for its workers (RoundSpec)
  const std::vector<int> stopSignals_;  // --signals-to-handle
  std::optional<FileTimerServer> fileTimer_;
  std::unordered_map<pid_t, std::string> expiredTimers_;  // by worker: why dlrun signalled it
};

}  // namespace detail

Agent::Agent(AgentOptions options, rendezvous::Rendezvous& rendezvous)
    : impl_(std::make_unique<detail::AgentImpl>(std::move(options), rendezvous)) {}

Agent::~Agent() = default;

int Agent::run() { return impl_->run(); }

}  // namespace dlrun::agents
