// Why a rendezvous round ended, as every agent of the job learns it. Failure restarts count
// against --max-restarts; membership changes do not. A job ends for every node with one exit
// code and one message: Finished (0), a final WorkerFailed (the worker's code and its report)
// or Stopped (128 + the signal, "job stopped: SIGINT on node NAME").
#pragma once

#include <string>

namespace dlrun::rendezvous {

// --max-restarts, held once per layer's options and passed whole.
struct RestartPolicy {
  int maxRestarts = 0;  // failure restarts the job allows
  // Whether the job restarts after its `failures`-th failure (counting it): the one rule, for
  // the rendezvous (one node and several) and for the agent's lone restarts (roles.h).
  bool allowsRestart(int failures) const { return failures <= maxRestarts; }
};

struct RoundEnd {
  enum class Kind { NodeLost, NodeJoined, NodeLeft, WorkerFailed, Finished, Stopped, StoreLost };
  Kind kind = Kind::Finished;
  std::string node;    // the node lost, joined, left, stopped, or whose worker failed
  int rank = 0;        // WorkerFailed: the root-cause rank
  int exitCode = 0;    // WorkerFailed, Stopped: the code every agent exits with when it ends
  int signal = 0;      // WorkerFailed: the signal that ended the worker; 0: it exited
  int failures = 0;    // WorkerFailed: failure restarts used, counting this one
  bool final = false;  // WorkerFailed: no restart is left; Stopped is always final
  // WorkerFailed: a hang (--hang-timeout), not an exit: every node dumps its workers' stacks
  // before it stops them.
  bool hang = false;
  std::string report;  // the text every agent prints when the job ends this way

  bool countsAsFailure() const { return kind == Kind::WorkerFailed; }
  // Whether every node's agent exits on it: the job is over.
  bool endsJob() const {
    return kind == Kind::Finished || kind == Kind::Stopped || (countsAsFailure() && final);
  }
  // Makes this a worker failure that uses one more restart, after `before` used, final where
  // `policy` allows no more. One already final stays final (--hang-action=exit); `failures`
  // already set counts when higher than `before` (the restarts a node's agent made alone,
  // roles.h).
  void countFailure(int before, const RestartPolicy& policy);
  std::string describe() const;  // one line for logs
};

// The deliberate stop of a whole job: `signal` reached dlrun on node `node`.
RoundEnd jobStopped(int signal, const std::string& node);
// The deliberate departure of one node from an elastic job (--rdzv-conf stop_policy=node).
RoundEnd nodeLeft(const std::string& node);

}  // namespace dlrun::rendezvous
