// The agent's inside (agent.h), one class whose functions live in files named for what they
// do (each group below names its file); only those files include this.
#pragma once

#include <sys/types.h>

#include <array>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "agents/agent.h"
#include "agents/agent_observer.h"
#include "agents/checkpoint_courier.h"
#include "agents/checkpoint_memory.h"
#include "agents/checkpoint_peer.h"
#include "agents/console_dedup.h"
#include "agents/crash_loop.h"
#include "agents/failure_report.h"
#include "agents/failure_summary.h"
#include "agents/file_timer.h"
#include "agents/hang_watcher.h"
#include "agents/network_probe.h"
#include "agents/output.h"
#include "agents/process.h"
#include "common/asio.h"
#include "common/error.h"
#include "common/log.h"
#include "store/store_proxy.h"

namespace dlrun::agents::detail {

namespace asio = boost::asio;
namespace fs = std::filesystem;

class AgentImpl {
 public:
  AgentImpl(AgentOptions options, rendezvous::Rendezvous& rendezvous);
  int run();

 private:
  enum class State { Joining, Running, Done, Stopping, Finished };

  // agent.cpp: the state machine
  void awaitSignal();
  void onSignal(int sig);
  void stopOn(int sig);
  void onControlCommand(const ControlCommand& command);
  void beginRound();
  void runRendezvous();
  void onJoined(const rendezvous::JoinResult& joined);
  void onRoundEnd(const rendezvous::RoundEnd& end);
  void onRendezvousError(int code, const std::string& message);
  void endOfRound();
  void startAttempt(const rendezvous::World& world);
  void onWorkerExit(Worker& w, ExitStatus status, int groupFd);
  void onSucceeded();
  void reportFailure(const Worker& w);
  void watchForHangs();
  void onHang(const HungWorker& hung);
  void takeStacksThenStop(const rendezvous::RoundEnd& end);

  // agent_health.cpp: the node's checks before it joins a round (health_check.h), on the
  // rendezvous thread; false where the node is not to join (the agent ends)
  bool awaitHealthy();
  // A pause of the rendezvous thread that the agent's end cuts short; false where it did.
  bool pauseRoundThread(Clock::duration pause);
  void interruptPauses();
  // agent_probe.cpp: the network probe of a round just formed, on the rendezvous thread;
  // `settle`: a later round's, which waits a part of its bound first (agent_probe.cpp)
  void probeNetwork(const rendezvous::World& world, bool settle);

  // agent_summary.cpp: the first failure first (failure_summary.h): each worker's end noted;
  // a final failure's summary gathered by group rank 0 (true: under way, it finishes the agent)
  WorkerFailure failureOf(const Worker& w) const;
  void noteWorkerEnd(const Worker& w);
  bool summarizeFailure(const rendezvous::RoundEnd& end);
  // On the summary's thread: this node's list shared; group rank 0's summary, gathered.
  std::optional<FailureSummary> shareFailures(const NodeFailures& mine, bool gather,
                                              const std::vector<std::string>& endpoints);
  void publishSummary(const std::string& text);  // on the summary's thread
  void afterSummary(const rendezvous::RoundEnd& end, const std::optional<FailureSummary>& summary);
  // How long group rank 0 waits for the other nodes' lists once its own workers are gone.
  static constexpr std::chrono::milliseconds kSummaryGather{2'000};

  // agent_keep.cpp: the workers kept through a re-rendezvous (a node lost, in process)
  std::string keepRefusal(const rendezvous::RoundEnd& end) const;
  bool keepThroughNextRound(const rendezvous::RoundEnd& end);
  // The kept workers that have not seen the lost node's failure yet (pid -> the generation its
  // mark named when they were kept).
  std::map<pid_t, int> unseeing(const std::map<pid_t, int>& kept) const;
  void watchKept(std::map<pid_t, int> kept, Clock::time_point deadline,
                 std::chrono::milliseconds grace);
  void keep(const rendezvous::RoundEnd& end);
  // How often the kept workers are looked at (the time they have: recovery::keepGrace).
  static constexpr std::chrono::milliseconds kKeepLook{5};
  void afterKeeping(const rendezvous::World& world);
  void dropKept();
  void freeKept(const rendezvous::World& world);  // on the rendezvous thread
  void moveKept(const rendezvous::World& world);  // on the rendezvous thread

  // agent_spares.cpp: workers started ahead (Zygote::reserve): --ready-spares, a spare's;
  // --ready-replacements, a running node's, for a failed worker's replacement
  bool readiesSpares() const;
  void readySpares();
  bool placesSpares(const rendezvous::World& world) const;
  void sparesBeforeRound(const rendezvous::World& world);
  bool readiesReplacements() const;
  void readyReplacementsLater(int local);  // -1: every local rank (a round's start)
  void readyReplacements(uint64_t attempt);
  // A replacement is started ahead this long after its round's workers, or the replacement
  // that used the last one, started: not on the cores their own start needs.
  static constexpr std::chrono::seconds kReplacementDelay{2};

  // agent_links.cpp: --store-proxy's proxy, made or moved to where the round's store is; the
  // workers' world then names it
  void proxyStore(rendezvous::World& seen);

  // agent_workers.cpp: starting, restarting and reaping workers
  void prepareLaunches();
  std::vector<std::string> replacementEnvironment(int local, const std::string& errorFile) const;
  void startSome(uint64_t attempt);
  void doneStarting();
  fs::path attemptDir();
  const RoleSpec* roleOf(int local) const;
  bool isService(int local) const;
  bool anyAlone() const;
  bool restartAlone(const Worker& failed);
  // Empty when `failed` is replaced in process, else why not (the group restarts).
  std::string inProcessRefusal(const Worker& failed) const;
  bool replaceHungInProcess(int rank);
  // `startedAt` (unix seconds): when the replaced worker's failure was seen, or the round began
  // for workers that join a kept round.
  void followRecovery(int local, int rank, pid_t pid, double startedAt);
  void lookAtRecoveries();
  // Whether `status` is --no-restart-exit-code's: the job ends with it, without a restart.
  bool endsWithoutRestart(const ExitStatus& status) const {
    return options_.noRestartExitCode != 0 && !status.signaled &&
           status.value == options_.noRestartExitCode;
  }
  void failToStart(int code, const std::string& message);
  WorkerLaunch launchOf(const fs::path& attemptDir, int local);
  void reap();
  void startZygote();
  void onZygoteSettled();
  void startAfterZygote();

  // agent_stop.cpp: stopping them, finishing
  void signalWorkers(int sig);
  void signalToStop(int sig);  // signalWorkers, noted: a worker it ends was stopped by dlrun
  void stop(int sig);
  void onStopped();
  void killLeftovers();
  void forgetWorkers();
  void finish(int code);

  // agent_links.cpp: the launcher (--control-stdin), the node serving the store
  void followLauncher();
  void readLauncher();
  void watchStoreHost();
  bool openAttemptSpace(rendezvous::World& world);  // on the rendezvous thread
  void sitOut(const rendezvous::World& world);
  void closeAttemptSpace();

  // agent_publish.cpp: what the observers are told
  void publishNode(const std::string& state);
  const char* stateName() const;
  void publishEvent(const std::string& kind, int rank, const std::string& detail,
                    bool spokenHere = true);
  void publishJobEvent(const std::string& kind, int rank, const std::string& detail);
  void publishStarted();
  void flushEvents();

  // agent_files.cpp: the log root, torch's file timer
  void prepareLogRoot();
  void serveFileTimer();
  void onTimerExpired(const TimerExpiry& expiry);
  void cleanUpLogRoot();
  void holdCheckpointMemory();                 // checkpointMemory_ and its variable for the workers
  void releaseCheckpointMemory();              // written to --checkpoint-dir, then removed
  void serveCheckpointPeers(RoundSpec& spec);  // once the round has other nodes

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
  std::unordered_map<pid_t, Worker*> byPid_;      // the round's workers, for reaping
  std::vector<std::unique_ptr<Worker>> retired_;  // replaced by restartAlone()
  size_t live_ = 0;                               // workers not yet reaped
  size_t liveEnding_ = 0;  // of those, the ones not of a service role (they end the job)
  int loneRestarts_ = 0;   // this round's workers restarted alone (restartAlone)
  // --recovery=in-process: where the round's workers mark (agents/recovery.h), and the local
  // ranks replaced in process with their replacement's pid.
  fs::path recoveryDir_;
  std::unordered_map<int, pid_t> replaced_;
  // Replacements whose recovery the observers hear of once their mark says it is done.
  struct Following {
    pid_t pid;
    int rank;
    double startedAt;  // unix seconds
    uint64_t attempt;
  };
  std::unordered_map<int, Following> following_;  // by local rank
  asio::steady_timer recoveryTimer_;
  asio::steady_timer keepTimer_;  // watchKept's looks
  bool successReported_ = false;
  // The round's workers' ends (agent_summary.cpp), the signals dlrun sent to stop them (bits by
  // number), the summary's thread and its first line for the job_ended event.
  NodeFailures nodeFailures_;
  uint64_t stopSignalsSent_ = 0;
  std::thread summaryThread_;
  std::string summaryLine_;
  bool ownRoundEnded_ = false;  // the end came from the round this node ran, not while joining
  // --crash-loop-attempts: how failed attempts ended; the attempt's start, for its life
  CrashLoop crashLoop_;
  Quarantine quarantine_;  // --quarantine-after: this node's own failures
  Clock::time_point attemptStarted_;
  AttemptEnd attemptEnd() const;  // the attempt under way, as it ends (agent.cpp)
  // Starting the round's workers (startSome): its number, what is left to start.
  static constexpr size_t kStartBatch = 64;
  uint64_t attempt_ = 0;
  bool starting_ = false;
  std::optional<NodeEnvironment> environment_;
  std::vector<WorkerLaunch> launches_;
  // The round's --duplicate-*-filters copies, which its workers' output pumps share.
  std::shared_ptr<FilteredLog> filteredOut_, filteredErr_;
  bool tfConfigWarned_ = false;
  bool rankZeroStoreSaid_ = false;
  std::optional<int> stopSignal_;
  std::optional<rendezvous::RoundEnd> stopEnd_;  // how this node's stop ends the job
  bool launchFailed_ = false;
  rendezvous::World world_;  // the current round's
  bool keeping_ = false;     // the workers run on while this node joins the next round
  // What this node offered the round after a lost node (set before that round's thread starts,
  // which reads it), and whether that round gave its workers other ranks: a failure of one of
  // them then restarts the group (their environment is the old numbering's).
  std::optional<rendezvous::KeptWorkers> keptOffer_;
  bool renumbered_ = false;
  // A round kept the workers (afterKeeping): a replacement looks for its predecessor's move
  // (recovery::kKeptVariable). The attempt's, as renumbered_.
  bool kept_ = false;
  // Kept workers stopped as they never saw the lost node's failure (watchKept): theirs fails
  // the round, never replaced alone. The attempt's, as renumbered_.
  std::set<pid_t> keptUnseeing_;
  // The round that could not keep them: it starts once they stopped.
  std::optional<rendezvous::World> pendingWorld_;
  std::optional<rendezvous::RoundEnd> roundEnd_;
  std::thread roundThread_;  // the rendezvous's blocking calls (runRendezvous)
  // The rendezvous thread's pauses (a node sitting a round out waits for its next check, a
  // later round's probe for the recovery to pass); the agent's end wakes it.
  std::mutex pauseMutex_;
  std::condition_variable pauseWake_;
  bool pausesInterrupted_ = false;
  // Why this node sits out (agent_health.cpp, on the io_context): from a failed check until its
  // next workers start, it is in no round, so its state names no group rank and no workers.
  std::optional<control::SittingOut> sittingOut_;
  std::optional<HangWatcher> hang_;  // with --hang-timeout
  // The workers' progress board and its look twice a second, for the hang watch and the
  // observers: made when either is there.
  std::optional<ProgressSampler> progress_;
  // Told each moment, in this order: --metrics-port's, then the control plane's.
  std::vector<std::unique_ptr<AgentObserver>> observers_;
  std::optional<asio::ip::tcp::socket> storeHost_;  // watchStoreHost's connection
  std::array<char, 1> storeHostByte_{};
  int exitCode_ = 0;
  std::unique_ptr<StoreProxy> proxy_;  // --store-proxy
  std::string proxiedStore_;           // where proxy_ forwards to, HOST:PORT
  fs::path logRoot_;
  std::optional<fs::path> runDir_;  // LOG_ROOT/RUN_ID_XXXXXXXX, made on first use (agent_files.cpp)
  fs::path runDir();
  void noteQuarantined();  // this node's name added to --quarantine-file
  // A requeued job's run before it in --log-dir (the newest RUN_ID_* this group rank made), if any.
  std::optional<fs::path> requeuedRunDir();
  int firstAttempt_ = 0;  // the number of round 0's attempt_N: after a requeued run's last
  bool keepLogRoot_ = false;
  Environment services_;  // the agent's services' variables for its workers (RoundSpec)
  std::optional<CheckpointMemory> checkpointMemory_;     // dlrun.checkpoint's, while the agent runs
  std::optional<CheckpointCourier> checkpointCourier_;   // its copies to the directory, a peer
  std::optional<CheckpointPeerServer> checkpointPeers_;  // a job of several nodes: peers' copies
  std::shared_ptr<ConsoleDedup> consoleDedup_;  // --console-dedup, made at the first launch
  std::optional<ProbeServer> probeServer_;  // answers the network probe (--network-probe-timeout)
  const std::vector<int> stopSignals_;      // --signals-to-handle
  std::optional<FileTimerServer> fileTimer_;
  std::unordered_map<pid_t, std::string> expiredTimers_;  // by worker: why dlrun signalled it
  std::unique_ptr<Zygote> zygote_;                        // --warm-start
  // An attempt's start waits for it to be ready, and for the workers it dropped to be reaped.
  bool awaitingZygote_ = false;
  bool spareWaiting_ = false;  // this node waits as a spare (Rendezvous::whenSpare)
  bool sparesSaid_ = false;    // readySpares' line, once
  // --ready-replacements: the local ranks to start a replacement ahead for, when the timer
  // fires (one that ended before its place is not started again in its round)
  std::set<int> replacementsDue_;
  asio::steady_timer replacementTimer_;

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
};

}  // namespace dlrun::agents::detail
