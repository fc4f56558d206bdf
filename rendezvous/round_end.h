// Why a rendezvous round ended, as every agent of the job learns it. Failure restarts count
// against --max-restarts; membership changes do not.
#pragma once

#include <string>

namespace dlrun::rendezvous {

struct RoundEnd {
  enum class Kind { NodeLost, NodeJoined, WorkerFailed, Finished, StoreLost };
  Kind kind = Kind::Finished;
  std::string node;    // the node lost, joined, or whose worker failed
  // WorkerFailed only:
  int rank = 0;
  int exitCode = 0;    // the code every agent exits with when the failure is final
  int failures = 0;    // failure restarts used, counting this one
  bool final = false;  // no restart is left: every agent prints `report` and exits
  std::string report;  // the root-cause text every agent prints

  bool countsAsFailure() const { return kind == Kind::WorkerFailed; }
  // Makes this a worker failure that uses one more restart, after `before` of the job's
  // `maxRestarts`: the one rule for one node and for several.
  void countFailure(int before, int maxRestarts);
  std::string describe() const;  // one line for logs
};

}  // namespace dlrun::rendezvous
