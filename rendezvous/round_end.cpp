#include "rendezvous/round_end.h"

#include <algorithm>

#include "common/signal_name.h"

namespace dlrun::rendezvous {

std::string RoundEnd::describe() const {
  switch (kind) {
    case Kind::NodeLost: return "node " + node + " was lost";
    case Kind::NodeJoined: return "node " + node + " asked to join";
    case Kind::NodeLeft: return "node " + node + " left the job";
    case Kind::WorkerFailed:
      // One wording with the failure report's (agents/failure_report.h).
      return "rank " + std::to_string(rank) + (node.empty() ? "" : " on " + node) +
             (hang     ? " made no progress (hang)"
              : signal ? " ended with signal " + signalName(signal)
                       : " ended with exit code " + std::to_string(exitCode));
    case Kind::Finished: return "every worker finished";
    case Kind::Stopped: return "node " + node + " stopped the job";
    case Kind::StoreLost: return node;  // a whole sentence: how the store was lost
  }
  return "";
}

void RoundEnd::countFailure(int before, const RestartPolicy& policy) {
  kind = Kind::WorkerFailed;
  failures = std::max(before, failures) + 1;
  final = final || !policy.allowsRestart(failures);
}

RoundEnd jobStopped(int signal, const std::string& node) {
  return RoundEnd{.kind = RoundEnd::Kind::Stopped,
                  .node = node,
                  .exitCode = 128 + signal,
                  .final = true,
                  .report = "job stopped: " + signalName(signal) + " on node " + node};
}

RoundEnd nodeLeft(const std::string& node) {
  return RoundEnd{.kind = RoundEnd::Kind::NodeLeft, .node = node};
}

}  // namespace dlrun::rendezvous
