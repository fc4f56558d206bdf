// The agent's state machine. One io_context, one thread; every event is a handler:
//
//   Joining --the round closed------------------> Running
//   Running --a worker fails--------------------> Stopping(failure)
//   Running --the round ended elsewhere---------> Stopping(round end)
//   Running --a node lost, workers kept---------> Joining (keeping them; agent_keep.cpp)
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
// Observers (agent_observer.h: --metrics-port, the control plane) are told each moment below.
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
//
// The rest of the agent lives in files named for it (agent_impl.h lists them): starting,
// restarting and reaping workers (agent_workers.cpp), stopping them (agent_stop.cpp), the links
// to the launcher and the store's node (agent_links.cpp), what observers are told
// (agent_publish.cpp), the log root and torch's file timer (agent_files.cpp).
#include "agents/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <thread>

#include "agents/agent_impl.h"
#include "agents/agent_observers.h"
#include "agents/failure_report.h"
#include "common/log.h"
#include "common/signal_name.h"

namespace dlrun::agents::detail {

AgentImpl::AgentImpl(AgentOptions options, rendezvous::Rendezvous& rendezvous)
    : options_(std::move(options)),
      rendezvous_(rendezvous),
      signals_(io_),
      launcherLink_(io_),
      stopTimer_(io_),
      inherited_(currentEnvironment()),
      recoveryTimer_(io_),
      keepTimer_(io_),
      crashLoop_(options_.crashLoopAttempts, kCrashLoopShortLife),
      quarantine_(options_.quarantine),
      stopSignals_(options_.signalsToHandle.value_or(kDefaultStopSignals)),
      replacementTimer_(io_) {
  // As torchrun 2.x, which gives every worker the list (its default four unless the flag
  // names others), for a worker that starts processes of its own through torch.
  std::string names;
  for (int sig : stopSignals_) names += (names.empty() ? "" : ",") + signalName(sig);
  services_["TORCHELASTIC_SIGNALS_TO_HANDLE"] = names;
  // `import dlrun.progress` works in every Python worker; the workers' own path comes first.
  if (const std::string dir = pythonModulesDir(); !dir.empty()) {
    auto it = inherited_.find("PYTHONPATH");
    services_["PYTHONPATH"] =
        it == inherited_.end() || it->second.empty() ? dir : it->second + ":" + dir;
  }
  if (readiesSpares())
    rendezvous_.whenSpare([this] {
      asio::post(io_, [this] {
        spareWaiting_ = true;
        readySpares();
      });
    });
  if (options_.hang)
    hang_.emplace(io_, *options_.hang,
                  options_.nodeName.empty() ? std::string("this node") : options_.nodeName,
                  rendezvous_);
}

int AgentImpl::run() {
  try {
    checkDescriptors(options_);
  } catch (const ConfigError& e) {
    log::info(std::string("error: ") + e.what());
    return 2;
  }
  if (options_.metrics) {
    try {
      observers_.push_back(
          std::make_unique<MetricsObserver>(io_, *options_.metrics, options_.nodeName));
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
  holdCheckpointMemory();
  if (options_.control)
    observers_.push_back(std::make_unique<ControlObserver>(
        *options_.control,
        [this](const ControlCommand& command) {
          asio::post(io_, [this, command] { onControlCommand(command); });
        },
        [this](const std::map<int, control::Straggler>& named) {
          asio::post(io_, [this, named] {
            for (const auto& observer : observers_) observer->onStragglers(named);
          });
        }));
  serveFileTimer();
  if (hang_ || !observers_.empty() || options_.crashLoopAttempts > 0)
    progress_.emplace(io_, [this](const ProgressSample& sample) {
      for (const auto& observer : observers_) observer->onProgress(sample);
    });
  if (options_.control && !options_.control->announce.empty())
    log::info(options_.control->announce);
  if (options_.nprocPerNode > 1 && !inherited_.contains("OMP_NUM_THREADS"))
    log::info(
        "setting OMP_NUM_THREADS=1 for each worker to avoid overloading the CPUs; "
        "set it yourself to tune");
  // Before the first round closes, so that the first attempt finds it ready, or nearly.
  if (options_.warmStart) startZygote();
  if (state_ != State::Finished) beginRound();
  io_.run();
  if (roundThread_.joinable()) {
    interruptPauses();
    rendezvous_.interrupt();
    roundThread_.join();
  }
  if (summaryThread_.joinable()) summaryThread_.join();  // bounded by its gather and the store
  zygote_.reset();
  closeAttemptSpace();
  cleanUpLogRoot();
  releaseCheckpointMemory();
  return exitCode_;
}

void AgentImpl::awaitSignal() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    onSignal(sig);
    if (state_ != State::Finished) awaitSignal();
  });
}

// A signal that reached this agent, or its launcher (--control-stdin).
void AgentImpl::onSignal(int sig) {
  if (sig == SIGCHLD) return reap();
  if (std::find(stopSignals_.begin(), stopSignals_.end(), sig) != stopSignals_.end())
    return stopOn(sig);
  if (sig == SIGUSR1 || sig == SIGUSR2) return signalWorkers(sig);
  log::info("received " + signalName(sig) + ", which --signals-to-handle leaves out: ignored");
}

void AgentImpl::stopOn(int sig) {
  if (state_ == State::Stopping && stopSignal_) {
    signalToStop(SIGKILL);  // a second terminating signal: no more patience
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

void AgentImpl::onControlCommand(const ControlCommand& command) {
  if (state_ == State::Finished) return;
  if (command.kind == ControlCommand::Kind::Signal) {
    log::info("control plane: " + signalName(command.value) + " to every worker");
    return signalWorkers(command.value);
  }
  if (stopSignal_) return;
  log::info("control plane: stopping the job (exit code " + std::to_string(command.value) + ")");
  stopSignal_ = SIGTERM;
  reportToRendezvous([&] { stopEnd_ = rendezvous_.reportStop(SIGTERM); });
  // On one node the rendezvous knows nothing of the control plane's stop: its code stands.
  if (!stopEnd_) stopEnd_ = rendezvous::jobStopped(SIGTERM, options_.nodeName);
  stopEnd_->exitCode = command.value;
  stop(SIGTERM);
}

void AgentImpl::beginRound() {
  state_ = State::Joining;
  roundEnd_.reset();
  ownRoundEnded_ = false;
  if (roundThread_.joinable()) roundThread_.join();  // it ended with the last round
  std::optional<rendezvous::World> kept;             // the round whose workers run on (keep)
  if (keeping_) kept = world_;
  roundThread_ = std::thread([this, kept = std::move(kept)] {
    if (kept) freeKept(*kept);
    runRendezvous();
  });
}

// The rendezvous thread's whole life for one round. Nothing escapes it: an exception here
// would end the process without stopping the workers.
void AgentImpl::runRendezvous() {
  auto fail = [this](int code, std::string message) {
    asio::post(io_,
               [this, code, message = std::move(message)] { onRendezvousError(code, message); });
  };
  try {
    if (!awaitHealthy()) return;
    rendezvous::JoinResult joined = rendezvous_.next();
    auto* world = std::get_if<rendezvous::World>(&joined);
    if (world && !openAttemptSpace(*world)) {
      asio::post(io_, [this, world = *world] { sitOut(world); });
    } else {
      // The job's first round is measured before its workers start, on a quiet network; a
      // later one (a restart, a lost node's recovery) starts them first and is measured
      // after them: the time from a fault to the next step never waits on the probe. Its
      // round's end is heeded once it is done (within its deadline).
      std::optional<rendezvous::World> probeLater;
      if (world && world->round == 0) probeNetwork(*world, /*settle=*/false);
      if (world && world->round != 0) probeLater = *world;
      if (world && world->keptWorkers) moveKept(*world);
      asio::post(io_, [this, joined = std::move(joined)] { onJoined(joined); });
      if (probeLater) probeNetwork(*probeLater, /*settle=*/true);
    }
    if (!world) return;
    asio::post(io_, [this, end = rendezvous_.awaitEnd()] { onRoundEnd(end); });
  } catch (const ConfigError& e) {
    fail(2, e.what());
  } catch (const std::exception& e) {
    fail(1, e.what());
  } catch (...) {
    fail(1, "the rendezvous failed with an unknown error");
  }
}

void AgentImpl::onJoined(const rendezvous::JoinResult& joined) {
  if (state_ != State::Joining) return;  // a signal is ending dlrun
  if (const auto* end = std::get_if<rendezvous::RoundEnd>(&joined)) {
    roundEnd_ = *end;
    keeping_ = false;
    if (liveWorkers() > 0) return stop(SIGTERM);  // kept ones, for a round that never came
    return endOfRound();
  }
  const auto& world = std::get<rendezvous::World>(joined);
  if (keeping_ || liveWorkers() > 0) return afterKeeping(world);
  startAttempt(world);
}

void AgentImpl::onRoundEnd(const rendezvous::RoundEnd& end) {
  log::debug("round " + std::to_string(world_.round) + " ended: " + end.describe());
  if (state_ == State::Finished || stopSignal_) return;
  for (const auto& observer : observers_) observer->onRoundEnded(end, Clock::now());
  publishJobEvent("round_ended", end.countsAsFailure() ? end.rank : -1, end.describe());
  roundEnd_ = end;
  ownRoundEnded_ = true;
  if (state_ == State::Done) return endOfRound();
  if (state_ == State::Running && end.hang && hang_) return takeStacksThenStop(end);
  if (state_ == State::Running && keepThroughNextRound(end)) return;
  if (state_ == State::Running) {
    log::info("stopping workers: " + end.describe());
    stop(SIGTERM);
  }
  // Stopping: endOfRound() runs once the last worker is reaped.
}

void AgentImpl::onRendezvousError(int code, const std::string& message) {
  if (state_ == State::Finished) return;
  log::info("error: " + message);
  launchFailed_ = true;
  exitCode_ = code;
  if (state_ == State::Running) return stop(SIGTERM);
  if (liveWorkers() == 0) finish(code);
}

// Every worker is gone and the round's end is known: the job is over, or a new round begins.
void AgentImpl::endOfRound() {
  const rendezvous::RoundEnd& end = *roundEnd_;
  if (consoleDedup_) consoleDedup_->flush();  // the workers' lines before what is said of the end
  using Kind = rendezvous::RoundEnd::Kind;
  if (end.kind == Kind::Finished) return finish(0);
  if (end.kind == Kind::Stopped) {
    log::info(end.report);
    return finish(end.exitCode);
  }
  if (end.countsAsFailure()) crashLoop_.ended(attemptEnd());  // where another node's failed
  if (end.countsAsFailure() && end.final) {
    // The nodes' failures, the first in time first; a hang's report is its stacks'.
    if (!end.hang && ownRoundEnded_ && summarizeFailure(end)) return;
    [[maybe_unused]] auto n = ::write(STDERR_FILENO, end.report.data(), end.report.size());
    return finish(end.exitCode);
  }
  if (end.countsAsFailure()) {
    const std::string attempt = "attempt " + std::to_string(end.failures) + " of " +
                                std::to_string(world_.restarts.maxRestarts);
    log::info("worker group failed (" + end.describe() + "); restarting, " + attempt);
    publishJobEvent("restart", -1, attempt + " after " + end.describe());
  } else
    log::info("re-rendezvous: " + end.describe());
  for (const auto& observer : observers_) observer->onRestarting(end);
  killLeftovers();
  beginRound();
}

void AgentImpl::startAttempt(const rendezvous::World& world) {
  log::debug("round " + std::to_string(world.round) + ": group rank " +
             std::to_string(world.groupRank) + " of " + std::to_string(world.groupWorldSize) +
             ", ranks " + std::to_string(world.baseRank) + "+" +
             std::to_string(world.localWorldSize) + " of " + std::to_string(world.worldSize));
  state_ = State::Running;
  world_ = world;
  forgetWorkers();
  loneRestarts_ = 0;
  renumbered_ = false;
  kept_ = false;
  keptUnseeing_.clear();
  replaced_.clear();
  successReported_ = false;
  nodeFailures_ = {};
  stopSignalsSent_ = 0;
  if (fileTimer_) fileTimer_->clear();
  expiredTimers_.clear();
  ++attempt_;
  attemptStarted_ = Clock::now();
  sparesBeforeRound(world);
  try {
    prepareLaunches();
  } catch (const ConfigError& e) {
    return failToStart(2, e.what());
  } catch (const std::exception& e) {  // dlrun's errors, and the filesystem's (the log dir)
    return failToStart(127, e.what());
  }
  starting_ = true;
  // Else once it is ready (onZygoteSettled), and the spares' workers it dropped are reaped
  // (reap: their GPU memory freed before the round's workers take theirs).
  awaitingZygote_ = zygote_ && (zygote_->state() == Zygote::State::Starting || zygote_->dropping());
  if (!awaitingZygote_) startSome(attempt_);
}

void AgentImpl::onWorkerExit(Worker& w, ExitStatus status, int groupFd) {
  w.exited(status, groupFd);
  --live_;
  if (!isService(w.localRank())) --liveEnding_;
  for (const auto& observer : observers_) observer->onWorkerExited(status.shellCode());
  if (state_ == State::Running && !status.success())
    publishEvent("worker_failed", w.rank(), status.describe());
  if (fileTimer_) fileTimer_->forget(w.pid());
  const bool failed = state_ == State::Running && !status.success();
  if (failed && restartAlone(w)) return;  // replaced in its place: not of the job's end
  noteWorkerEnd(w);
  if (failed) {
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
void AgentImpl::onSucceeded() {
  if (!successReported_) {
    successReported_ = true;
    reportToRendezvous([&] { rendezvous_.reportSuccess(); });
  }
  if (liveWorkers() > 0) return;
  state_ = State::Done;
  if (roundEnd_) endOfRound();
}

void AgentImpl::reportFailure(const Worker& w) {
  const WorkerFailure failure = failureOf(w);
  if (quarantine_.failed(Clock::now())) noteQuarantined();
  const bool told = endsWithoutRestart(w.status());
  const bool looping = !told && crashLoop_.ended(attemptEnd());
  rendezvous::RoundEnd end{.kind = rendezvous::RoundEnd::Kind::WorkerFailed,
                           .node = options_.nodeName,
                           .rank = w.rank(),
                           .exitCode = w.status().shellCode(),
                           .signal = w.status().signaled ? w.status().value : 0,
                           .failures = world_.failures + loneRestarts_,
                           .final = told || looping,
                           .report = formatFailureReport(failure, world_.failures)};
  if (told) {
    end.report = "dlrun: rank " + std::to_string(w.rank()) + " exited with " +
                 std::to_string(options_.noRestartExitCode) +
                 ", --no-restart-exit-code: the job ends without a restart\n" + end.report;
  } else if (looping) {
    end.exitCode = options_.noRestartExitCode ? options_.noRestartExitCode : kCrashLoopExitCode;
    end.report = "dlrun: a crash loop: " + crashLoop_.describe() + " (the last: rank " +
                 std::to_string(w.rank()) + ", " + w.status().describe() + "); the job ends with " +
                 std::to_string(end.exitCode) + " instead of a restart (--crash-loop-attempts)\n" +
                 end.report;
  }
  flushEvents();
  reportToRendezvous([&] { rendezvous_.reportFailure(end); });
}

AttemptEnd AgentImpl::attemptEnd() const {
  AttemptEnd end{
      .attempt = attempt_,
      .livedSeconds = std::chrono::duration<double>(Clock::now() - attemptStarted_).count()};
  const ProgressBoard* board = progress_ ? progress_->board() : nullptr;
  for (int local = 0; board && local < board->workers(); ++local)
    if (const ProgressReading reading = board->read(local); reading.beats > 0)
      end.step = std::max(end.step.value_or(reading.step), reading.step);
  return end;
}

void AgentImpl::watchForHangs() {
  std::vector<WatchedWorker> watched;
  for (const auto& w : workers_) watched.push_back({w->pid(), w->rank(), w->localRank()});
  hang_->watch(std::move(watched), [this](const HungWorker& hung) { onHang(hung); });
}

void AgentImpl::onHang(const HungWorker& hung) {
  if (state_ != State::Running) return;
  std::ostringstream silent;
  silent << std::fixed << std::setprecision(1) << hung.silentSeconds;
  const std::string what = "rank " + std::to_string(hung.rank) +
                           (options_.nodeName.empty() ? "" : " on " + options_.nodeName) +
                           " made no progress for " + silent.str() + " s" +
                           (hung.step ? " after step " + std::to_string(*hung.step) : "") +
                           " (--hang-timeout)";
  log::info("hang: " + what);
  publishEvent("hang", hung.rank, what);
  keepLogRoot_ = true;  // the stacks go there
  if (hang_->options().action == HangAction::Report) {
    const HangWatcher::Collect what{.shareWithJob = false, .summarize = true};
    hang_->collect(what, [this, dir = hang_->stackDir()] {
      log::info("stacks are in " + dir.string() + "; the job goes on (--hang-action=report)");
    });
    return;
  }
  if (replaceHungInProcess(hung.rank)) return;
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

// --recovery=in-process: a hung worker whose program recovers in process is replaced alone
// once the node's stacks are taken: SIGKILLed (a stopped or stuck process heeds nothing else),
// its peers' collectives fail as its sockets close, and its exit takes restartAlone's path.
// False when the hang must end the round as without the flag.
bool AgentImpl::replaceHungInProcess(int rank) {
  if (!options_.inProcessRecovery || hang_->options().action == HangAction::Exit) return false;
  const auto hung = std::find_if(workers_.begin(), workers_.end(),
                                 [rank](const auto& w) { return w->rank() == rank; });
  if (hung == workers_.end() || !(*hung)->alive()) return false;
  if (const std::string why = inProcessRefusal(**hung); !why.empty()) {
    log::info("hang: no in-process recovery (" + why + "): the round ends");
    return false;
  }
  log::info("hang: taking this node's stacks into " + hang_->stackDir().string() +
            ", then replacing rank " + std::to_string(rank) + " in process");
  hang_->unwatch();
  const pid_t pid = (*hung)->pid();
  // Killed once every stack is taken: its peers' show what they wait on. Theirs are Python
  // stacks alone: a debugger walking a native stack stops the process for some 0.3 s of
  // libtorch's symbols, which would hold up the kill or, after it, the recovery.
  HangWatcher::Collect what{.shareWithJob = false, .summarize = true, .nativeOnlyOf = pid};
  what.taken = [this, rank, pid, attempt = attempt_] {
    if (state_ != State::Running || attempt != attempt_) return;
    const auto victim = byPid_.find(pid);
    if (victim == byPid_.end() || victim->second->rank() != rank) return;  // gone meanwhile
    victim->second->signal(SIGKILL);
  };
  hang_->collect(std::move(what), [] {});
  return true;
}

// Every node takes its workers' stacks while they still hang, then stops them; the node that
// saw the hang prints the summary once every node's part is in.
void AgentImpl::takeStacksThenStop(const rendezvous::RoundEnd& end) {
  hang_->unwatch();
  keepLogRoot_ = true;
  log::info("taking the stacks of this node's workers into " + hang_->stackDir().string());
  const HangWatcher::Collect what{.shareWithJob = true, .summarize = end.node == options_.nodeName};
  hang_->collect(what, [this, end, attempt = attempt_] {
    if (state_ != State::Running || attempt != attempt_) return;  // a later round's workers
    // Hung workers heed no SIGTERM (those waiting in a collective never get to): no grace.
    log::info("stopping workers: " + end.describe());
    stop(SIGKILL);
  });
}

}  // namespace dlrun::agents::detail

namespace dlrun::agents {

Agent::Agent(AgentOptions options, rendezvous::Rendezvous& rendezvous)
    : impl_(std::make_unique<detail::AgentImpl>(std::move(options), rendezvous)) {}

Agent::~Agent() = default;

int Agent::run() { return impl_->run(); }

}  // namespace dlrun::agents
