#include "rendezvous/round_end.h"

namespace dlrun::rendezvous {

std::string RoundEnd::describe() const {
  switch (kind) {
    case Kind::NodeLost: return "node " + node + " was lost";
    case Kind::NodeJoined: return "node " + node + " asked to join";
    case Kind::WorkerFailed:
      return "rank " + std::to_string(rank) + (node.empty() ? "" : " on " + node) +
             " failed (exit code " + std::to_string(exitCode) + ")";
    case Kind::Finished: return "every worker finished";
    case Kind::StoreLost: return "lost the rendezvous store: " + node;
  }
  return "";
}

void RoundEnd::countFailure(int before, int maxRestarts) {
  kind = Kind::WorkerFailed;
  failures = before + 1;
  final = failures > maxRestarts;
}

}  // namespace dlrun::rendezvous
