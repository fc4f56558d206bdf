// Starting, restarting and reaping the round's workers: their launches (output, directories,
// error files), every exec checked against the kernel's limits before the first start, the
// batches of starts, a worker of an `alone` role started again in its place, and SIGCHLD's
// reaping.
#include <sys/wait.h>

#include <algorithm>

#include "agents/agent_impl.h"
#include "agents/recovery.h"
#include "agents/worker_args.h"
#include "common/clock.h"
#include "common/log.h"

namespace dlrun::agents {

Streams StreamsByRank::forRank(int localRank) const {
  auto it = byRank.find(localRank);
  return it == byRank.end() ? all : it->second;
}

namespace {

// How often the marks of replacements still recovering are looked at (the "recovered" event).
constexpr std::chrono::milliseconds kRecoveryLook{50};

// Where a worker's output goes; the caller sets its directory (where wantsDir says).
WorkerOutput outputFor(const AgentOptions& options, int local, int rank) {
  WorkerOutput output;
  const int redirected = static_cast<int>(options.redirects.forRank(local));
  const int teed = static_cast<int>(options.tee.forRank(local));
  // A stream both redirected and teed goes to the console too: --tee wins, as in torchrun.
  output.fileOnly = static_cast<Streams>(redirected & ~teed);
  output.toFile = static_cast<Streams>(redirected | teed);
  output.shown = !options.localRanksFilter || options.localRanksFilter->contains(local);
  const std::string& role =
      options.roles.empty() ? options.role : roleOfLocal(options.roles, local).name;
  output.prefix = expandPrefix(options.logLinePrefixTemplate, rank, local, role);
  if (options.consoleFormat == ConsoleFormat::Torchrun) {
    output.prefixed = static_cast<Streams>(teed);
    output.exactBytes = true;
    output.pythonText = true;
  }
  return output;
}

// The attempt's copy of the console lines holding any of `needles`; none without needles.
std::shared_ptr<FilteredLog> filteredLog(const std::filesystem::path& file,
                                         const std::vector<std::string>& needles) {
  if (needles.empty()) return nullptr;
  std::filesystem::create_directories(file.parent_path());
  return std::make_shared<FilteredLog>(file, needles);
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
  // torch's workers each open a client to the store at MASTER_ADDR: a store this process
  // serves, or its proxy (--store-proxy), holds each one's connection.
  needs.storeClients =
      options.nprocPerNode * ((options.servesStore ? 1 : 0) + (options.storeProxy ? 1 : 0));
  // --warm-start: the zygote's socket, and a start's "go" socket while it waits for its answer
  if (options.warmStart) needs.workerFiles += 2;
  // --ready-spares, --ready-replacements: the go socket of each worker started ahead, until it
  // is placed
  if (options.readySpares || options.readyReplacements) needs.workerFiles += options.nprocPerNode;
  return needs;
}

void checkDescriptors(const AgentOptions& options) {
  const size_t limit = raiseDescriptorLimit();
  if (auto problem = descriptorProblem(descriptorNeeds(options, openDescriptors()), limit))
    throw ConfigError(*problem);
}

}  // namespace dlrun::agents

namespace dlrun::agents::detail {

// Everything a start needs, before the first fork: the shared environment, built once; each
// worker's launch; and every exec checked against the kernel's limits, so a large job never
// fails half-way through its start.
void AgentImpl::prepareLaunches() {
  const ExecLimits limits = ExecLimits::ofThisProcess();
  std::string cluster;
  if (options_.tfConfig != TfConfigMode::Never) cluster = tfConfigCluster(world_);
  std::string longestType = "worker";
  for (const auto& role : world_.workerRoles)
    if (role.size() > longestType.size()) longestType = role;
  const TfConfigChoice tf =
      chooseTfConfig(options_.tfConfig, cluster, world_.worldSize, limits.maxString, longestType);
  if (!tf.warning.empty() && !tfConfigWarned_) {
    log::warn(tf.warning);
    tfConfigWarned_ = true;
  }
  const fs::path attemptDir = this->attemptDir();
  for (const auto& observer : observers_)
    observer->onAttemptFiles({.attempt = firstAttempt_ + world_.round,
                              .dir = attemptDir,
                              .baseRank = world_.baseRank,
                              .workers = options_.nprocPerNode});
  filteredOut_ = filteredLog(attemptDir / "filtered_stdout.log", options_.duplicateStdoutFilters);
  filteredErr_ = filteredLog(attemptDir / "filtered_stderr.log", options_.duplicateStderrFilters);
  if (filteredOut_ || filteredErr_) keepLogRoot_ = true;
  RoundSpec spec{.role = options_.role,
                 .restartCount = world_.round,
                 .tfCluster = tf.set ? std::optional(std::move(cluster)) : std::nullopt,
                 .inheritTfConfig = options_.tfConfig == TfConfigMode::Never,
                 .services = services_,
                 .virtualLocalRank = options_.virtualLocalRank};
  if (options_.inProcessRecovery) {
    recoveryDir_ = attemptDir / "recovery";
    fs::create_directories(recoveryDir_);
    spec.services[std::string(recovery::kDirVariable)] = recoveryDir_.string();
    spec.services[std::string(recovery::kFallbackVariable)] =
        std::to_string(recovery::kFallbackCode);
    spec.services[std::string(recovery::kReplaceVariable)] = std::to_string(recovery::kReplaceCode);
  }
  serveCheckpointPeers(spec);
  if (progress_) progress_->prepareRound(attemptDir, options_.nprocPerNode, spec);
  if (hang_) hang_->prepareRound(attemptDir, *progress_->board(), inherited_, spec);
  rendezvous::World seen = world_;  // the world as the workers see it
  if (options_.rankZeroStore) {
    if (!rankZeroStoreSaid_) log::info(*options_.rankZeroStore);
    rankZeroStoreSaid_ = true;
    serveStoreAtRankZero(seen);
  } else if (options_.storeProxy) {
    proxyStore(seen);
  }
  environment_.emplace(inherited_, seen, std::move(spec));
  // The command as given: substituting ${local_rank} only shortens an argument.
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
void AgentImpl::startSome(uint64_t attempt) {
  if (attempt != attempt_) return;  // a batch of a round that already ended
  if (state_ != State::Running) return doneStarting();
  const size_t end = std::min(launches_.size(), workers_.size() + kStartBatch);
  try {
    while (workers_.size() < end) {
      const int local = static_cast<int>(workers_.size());
      WorkerLaunch& launch = launches_[local];
      launch.envp = environment_->own(local, launch.errorFile);
      if (world_.joinInProcess) {  // in a lost node's place: joins the workers the round kept
        launch.envp.push_back(std::string(recovery::kJoinVariable) + "=1");
        launch.envp.push_back(std::string(recovery::kRoundVariable) + "=" +
                              std::to_string(world_.round));
      }
      launch.sharedEnvp = environment_->shared();
      std::unique_ptr<Worker> worker =
          Worker::start(io_, std::move(launch), zygote_.get(), placesSpares(world_));
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
  for (const auto& observer : observers_)
    observer->onRoundStarted(world_, static_cast<int>(workers_.size()), Clock::now());
  publishStarted();
  watchStoreHost();
  readyReplacementsLater(-1);
  if (world_.joinInProcess) {
    // From the round's start: a worker forked from the zygote starts its recovery before the
    // last of its node's workers is started.
    const double began =
        unixSeconds() - std::chrono::duration<double>(Clock::now() - attemptStarted_).count();
    for (const auto& w : workers_) followRecovery(w->localRank(), w->rank(), w->pid(), began);
  }
  // Every worker may have exited already, or this node may run services only.
  if (state_ == State::Running && liveEnding_ == 0) onSucceeded();
}

void AgentImpl::doneStarting() {
  starting_ = false;
  launches_ = {};
  // A worker restarted alone gets the environment its first start had.
  if (!anyAlone() && !options_.inProcessRecovery) environment_.reset();
}

fs::path AgentImpl::attemptDir() {
  const fs::path run = runDir();  // sets firstAttempt_ for a requeued job
  return run / ("attempt_" + std::to_string(firstAttempt_ + world_.round));
}

const RoleSpec* AgentImpl::roleOf(int local) const {
  return options_.roles.empty() ? nullptr : &roleOfLocal(options_.roles, local);
}

bool AgentImpl::isService(int local) const {
  const RoleSpec* role = roleOf(local);
  return role != nullptr && role->service;
}

bool AgentImpl::anyAlone() const {
  return std::any_of(options_.roles.begin(), options_.roles.end(),
                     [](const RoleSpec& role) { return role.alone; });
}

std::string AgentImpl::inProcessRefusal(const Worker& failed) const {
  if (renumbered_) return "this node's ranks were renumbered in process";
  if (keptUnseeing_.contains(failed.pid()))
    return "kept after a lost node, it never saw that node's failure";
  const auto mark = recovery::readMark(recoveryDir_, failed.localRank());
  const bool marked = mark && mark->pid == failed.pid();
  recovery::Failure failure{.exitCode = failed.status().signaled ? -1 : failed.status().value,
                            .marked = marked,
                            .done = marked && mark->done,
                            .recoveringItself = marked && mark->recovering};
  for (const auto& [local, pid] : replaced_)
    if (local != failed.localRank() && recovery::markedPid(recoveryDir_, local) != pid)
      failure.recovering.push_back(local);
  return recovery::refusal(failure);
}

// A failed worker of an `alone` role, or under --recovery=in-process one whose program recovers
// in process, while restarts are left: a new process takes its place (same ranks and
// environment; in process, joining the survivors) and the round goes on. False when it must
// fail the round.
bool AgentImpl::restartAlone(const Worker& failed) {
  if (roundEnd_) return false;  // the round has ended (a lost node's, its workers kept or not)
  const int local = failed.localRank();
  const RoleSpec* role = roleOf(local);
  const bool alone = role != nullptr && role->alone;
  if ((!alone && !options_.inProcessRecovery) || !environment_ ||
      endsWithoutRestart(failed.status()) ||
      !world_.restarts.allowsRestart(world_.failures + loneRestarts_ + 1))
    return false;
  const std::string ranks = "rank " + std::to_string(failed.rank()) + " (" +
                            (alone ? role->name : "local " + std::to_string(local)) + ") " +
                            failed.status().describe();
  if (!alone) {
    if (const std::string why = inProcessRefusal(failed); !why.empty()) {
      log::info(ranks + ": no in-process recovery (" + why + "): restarting the whole group");
      return false;
    }
  }
  std::unique_ptr<Worker> worker;
  try {
    WorkerLaunch launch = launchOf(attemptDir(), local);
    launch.envp = alone ? environment_->own(local, launch.errorFile)
                        : replacementEnvironment(local, launch.errorFile);
    launch.sharedEnvp = environment_->shared();
    worker = Worker::start(io_, std::move(launch), zygote_.get(), !alone);
  } catch (const std::exception& e) {  // dlrun's errors, and the filesystem's (the log dir)
    log::info("cannot restart rank " + std::to_string(failed.rank()) + ": " + e.what());
    return false;
  }
  ++loneRestarts_;
  const std::string count = "restart " + std::to_string(world_.failures + loneRestarts_) + " of " +
                            std::to_string(world_.restarts.maxRestarts);
  const std::string what = alone ? ranks + "; restarted alone, " + count
                                 : ranks + ": in-process recovery, its replacement started (" +
                                       count + "); the other ranks keep running";
  log::info(what);
  publishEvent("restart", failed.rank(), what);
  if (!alone) {
    replaced_[local] = worker->pid();
    followRecovery(local, failed.rank(), worker->pid(), unixSeconds());
    readyReplacementsLater(local);
  }
  byPid_.erase(failed.pid());
  byPid_[worker->pid()] = worker.get();
  ++live_;
  if (!isService(local)) ++liveEnding_;
  // `failed` stays until the next round: its output pumps may still hold its last lines.
  retired_.push_back(std::move(workers_[local]));
  workers_[local] = std::move(worker);
  if (hang_) watchForHangs();  // the replacement in its place, every silence counted anew
  return true;
}

// An in-process replacement's own environment: the worker's, joining the survivors.
std::vector<std::string> AgentImpl::replacementEnvironment(int local,
                                                           const std::string& errorFile) const {
  std::vector<std::string> envp = environment_->own(local, errorFile);
  envp.push_back(std::string(recovery::kJoinVariable) + "=1");
  if (kept_) envp.push_back(std::string(recovery::kKeptVariable) + "=1");
  return envp;
}

// Nothing started: the round cannot begin on this node.
void AgentImpl::failToStart(int code, const std::string& message) {
  log::info("error: " + message);
  launchFailed_ = true;
  finish(code);
}

WorkerLaunch AgentImpl::launchOf(const fs::path& attemptDir, int local) {
  WorkerLaunch launch;
  launch.localRank = local;
  launch.rank = world_.baseRank + local;
  launch.argv = workerArgv(options_.command, local, options_.localRankFlag,
                           options_.virtualLocalRank ? 0 : local);
  launch.output = outputFor(options_, local, launch.rank);
  if (!options_.cpuBinding.empty()) launch.cpus = options_.cpuBinding.at(local);
  WorkerOutput& output = launch.output;
  output.filteredOut = filteredOut_;
  output.filteredErr = filteredErr_;
  if (options_.consoleDedup && world_.localWorldSize >= options_.consoleDedupFrom) {
    if (!consoleDedup_)
      consoleDedup_ = std::make_shared<ConsoleDedup>(
          io_, LineGrouper::Limits{.window = *options_.consoleDedup});
    output.dedup = consoleDedup_;
  }
  if (wantsDir(options_, output)) {
    output.dir = attemptDir / std::to_string(local);
    fs::create_directories(*output.dir);
    launch.errorFile = (*output.dir / "error.json").string();
    if (output.toFile != Streams::None) keepLogRoot_ = true;
  } else {
    launch.errorFile = (logRoot_ / ("error-" + std::to_string(world_.round) + "-" +
                                    std::to_string(local) + ".json"))
                           .string();
  }
  return launch;
}

void AgentImpl::reap() {
  bool exited = false;
  // A worker's pidfd is kept past its reap, for killLeftovers (Worker::killGroup).
  auto isWorker = [this](pid_t pid) {
    auto it = byPid_.find(pid);
    return it != byPid_.end() && it->second->alive();
  };
  while (const auto child = reapChild(isWorker)) {
    if (zygote_ && zygote_->reaped(child->pid, child->status)) {
      startAfterZygote();
      continue;
    }
    if (!isWorker(child->pid)) continue;  // a descendant re-parented here
    onWorkerExit(*byPid_.at(child->pid), child->status, child->groupFd);
    exited = true;
  }
  // One node state for all the exits one SIGCHLD brings (thousands at a job's end), not one
  // each; a finished agent has published its last already.
  if (exited && state_ != State::Finished) publishNode(stateName());
}

// --warm-start: the zygote, with the node's common environment (warm_start.h). A zygote that
// cannot start fails the launch as a worker that cannot (127), or as a bad setting (2).
void AgentImpl::startZygote() {
  try {
    const int last = options_.nprocPerNode - 1;  // the longest ${local_rank}
    zygote_ = std::make_unique<Zygote>(
        io_, *options_.warmStart, zygoteEnvironment(inherited_, options_.nprocPerNode, services_),
        workerArgv(options_.command, last, options_.localRankFlag,
                   options_.virtualLocalRank ? 0 : last),
        options_.nprocPerNode, [this] { onZygoteSettled(); });
  } catch (const ConfigError& e) {
    failToStart(2, e.what());
  } catch (const Error& e) {
    failToStart(127, e.what());
  }
}

// The zygote is ready, or failed before it was: a failure ends the launch (no worker has
// started: attempts wait for it), readiness lets a waiting attempt start.
void AgentImpl::onZygoteSettled() {
  if (state_ == State::Finished) return;
  if (!zygote_->everReady()) return failToStart(2, zygote_->problem());
  readySpares();
  startAfterZygote();
}

// An attempt waiting for the zygote starts once it was ever ready and no worker it dropped is
// left to reap.
void AgentImpl::startAfterZygote() {
  if (!awaitingZygote_ || !zygote_->everReady() || zygote_->dropping()) return;
  awaitingZygote_ = false;
  startSome(attempt_);
}

// A replacement's recovery, said in one line and told to the observers ("recovered", with its
// phases) once its mark says it is done; the marks are looked at every kRecoveryLook while one is
// under way.
void AgentImpl::followRecovery(int local, int rank, pid_t pid, double startedAt) {
  const bool idle = following_.empty();
  following_[local] = {pid, rank, startedAt, attempt_};
  if (idle) lookAtRecoveries();
}

void AgentImpl::lookAtRecoveries() {
  recoveryTimer_.expires_after(kRecoveryLook);
  recoveryTimer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return following_.clear();
    for (auto it = following_.begin(); it != following_.end();) {
      const Following& f = it->second;
      // Followed while its round runs and it lives, until its mark is its own.
      const bool current = f.attempt == attempt_;
      const auto mark = current ? recovery::readMark(recoveryDir_, it->first) : std::nullopt;
      const bool done = mark && mark->pid == f.pid;
      if (done) {
        const std::string line = recovery::describeRecovery(f.rank, *mark, f.startedAt);
        log::info(line);
        publishEvent("recovered", f.rank, line);
      }
      it = current && !done && byPid_.count(f.pid) ? std::next(it) : following_.erase(it);
    }
    if (!following_.empty()) lookAtRecoveries();
  });
}

}  // namespace dlrun::agents::detail
