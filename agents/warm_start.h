// Warm starts (--warm-start, --preload; docs/guides/warm-start.md): a start or restart of a worker
// forks a Python interpreter that has already started and imported the modules of --preload
// (the zygote), instead of paying for the interpreter and its imports again.
//
// One zygote per node, the agent's child, started with the agent (before the first round
// closes) under the workers' interpreter and options, with the node's common environment
// (zygoteEnvironment: libgomp reads OMP_NUM_THREADS when torch loads it), its control socket as
// stdin. Not one per local rank: nothing it imports depends on the rank (the rank's variables
// are set in the fork, before the program runs), and one copy of the imports is shared by every
// fork, copy-on-write. A start sends the worker's argv, environment, working directory, CPUs and
// its stdin, stdout, stderr (SCM_RIGHTS) over the socket (warm_start_wire.h); the zygote forks a
// child that forks the worker and exits, so the worker is reparented to the agent (a child
// subreaper) and reaped by its waitpid(-1) with its real exit code or signal. The worker leads
// its own process group before its pid is reported, and waits on a "go" socket that the agent
// writes to only once it has the pid; then it sets PR_SET_PDEATHSIG (its parent is the agent by
// then: the zygote reaped the middle child first), PR_SET_PTRACER and the rest, and runs the
// program as a fresh interpreter would. The agent's end of the go socket closing (the agent
// died) ends the worker. A zygote left without a request for a second forks a worker ahead the
// same way (a standby), up to one for each of the node's workers, and hands one the next
// request: nothing here tells the two apart. With --ready-spares a spare node's workers are
// forked ahead (reserve): they run the program until it makes dlrun.recovery's loop, which
// waits on the go socket for the worker's place, sent as a start's request once the node takes
// a lost node's ranks (start with `reserve`).
//
// The agent waits for the zygote at an attempt's start: a fresh worker would spend the same
// time importing the same modules, and every attempt of a warm job then starts the same way. A
// zygote that refuses (a preload cannot be imported, CUDA was initialised, Python threads were
// started) or ends before it is ready fails the launch in one line (exit 2). One that ends
// later is said in one line, and the workers start fresh from then on: the job goes on.
//
// Lives on the agent's io_context thread. start() blocks until the zygote has answered (the
// forks take milliseconds), as spawnProcess blocks until the exec.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "agents/process.h"
#include "agents/warm_start_wire.h"
#include "common/environment.h"

namespace boost::asio {
class io_context;
}

namespace dlrun::agents {

struct WarmStartOptions {
  // The workers' interpreter and its options (warm::parsePythonCommand), which the zygote runs
  // under too
  std::vector<std::string> interpreter;
  std::vector<std::string> preload;  // modules the zygote imports before it is ready
};

// The zygote's environment: `inherited` with the defaults every worker of a node of
// `localWorkers` gets unless set (OMP_NUM_THREADS, the NCCL error-handling pair, as
// NodeEnvironment), then the agent's `services` (pure).
Environment zygoteEnvironment(const Environment& inherited, int localWorkers,
                              const Environment& services);

// dlrun's zygote program, beside dlrun (a build tree) or installed with it; throws Error
// naming both places when it is in neither.
std::string zygoteProgram();

class Zygote {
 public:
  enum class State { Starting, Ready, Failed };

  // Starts the zygote: the options' interpreter on zygoteProgram(). Its arguments end with
  // `longestArgv`, the longest worker argv, so that each worker has room to show its own in
  // /proc/PID/cmdline (ps, pkill -f). It keeps up to `standbys` workers forked ahead (the
  // node's worker count: a restart of them all forks none). `onSettled` is posted to `io`
  // once, when it is ready or has failed before that. Throws Error (ConfigError where the
  // program is missing) when it cannot be started.
  Zygote(boost::asio::io_context& io, const WarmStartOptions& options,
         const Environment& environment, const std::vector<std::string>& longestArgv, int standbys,
         std::function<void()> onSettled);
  ~Zygote();  // kills and reaps the zygote
  Zygote(const Zygote&) = delete;
  Zygote& operator=(const Zygote&) = delete;

  State state() const;
  bool everReady() const;
  const std::string& problem() const;  // why it failed, one line
  pid_t pid() const;

  // Starts a worker as spawnProcess(request) would, forked from the zygote while it is ready,
  // else fresh; a zygote that fails to answer is killed, said in one line, and this and every
  // later worker start fresh. Throws Error when the zygote could not fork the worker.
  // `reserve` >= 0: the worker reserved for that local rank takes the request where one waits.
  SpawnedProcess start(const SpawnRequest& request, int reserve = -1);

  // --ready-spares: forks `request`'s worker now, to run until it makes dlrun.recovery's loop
  // and wait there for its place (start with `reserve` = `local`): its environment names no
  // ranks, and DLRUN_RECOVERY_RESERVE keeps its go socket open, over which the place comes.
  // Nothing while the zygote is not ready or a worker waits for `local` already; a fork that
  // fails is said in one line (the worker starts afresh when placed).
  void reserve(const SpawnRequest& request, int local);
  // The reserved workers that wait are killed (their process groups); reaped() takes their ends.
  void dropReserves();
  // Whether workers it dropped are not reaped yet (their GPU memory may not be free).
  bool dropping() const;

  // The agent reaped `pid`: whether that was the zygote (which then has failed) or a reserved
  // worker not placed (said in one line where it was not dropped).
  bool reaped(pid_t pid, const ExitStatus& status);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dlrun::agents
