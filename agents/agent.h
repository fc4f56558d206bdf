// The per-node agent: starts this node's workers for each rendezvous round, supervises them,
// forwards signals, stops them (SIGTERM, a grace period, SIGKILL to each process group),
// restarts the group after a failure while restarts remain, and reports the root cause when
// none do. Single-threaded on its own io_context; run() returns the process exit code.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/rendezvous.h"

namespace boost::asio {
class io_context;
}

namespace dlrun::agents {

// Which of a worker's streams go to files (torchrun's Std: 0 none, 1 stdout, 2 stderr, 3 both).
enum class Streams : uint8_t { None = 0, Out = 1, Err = 2, Both = 3 };

// A Streams value for every local rank, or one for all (torchrun's "3" or "0:1,1:2").
struct StreamsByRank {
  Streams all = Streams::None;
  std::map<int, Streams> byRank;
  Streams forRank(int localRank) const;
};

struct AgentOptions {
  std::vector<std::string> command;  // what every worker runs
  int nprocPerNode = 1;
  std::string role = "default";
  int maxRestarts = 0;
  std::chrono::milliseconds stopTimeout{30'000};
  std::optional<std::string> logDir;  // else a temporary directory for error files
  StreamsByRank redirects;            // streams sent only to files
  StreamsByRank tee;                  // streams copied to files
  std::optional<std::set<int>> localRanksFilter;
  std::string logLinePrefixTemplate = "[${rank}]:";
  std::string nodeName;  // "host (address)" in a multi-node job's failure reports
};

namespace detail {
class AgentImpl;
}

class Agent {
 public:
  Agent(AgentOptions options, rendezvous::Rendezvous& rendezvous);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Runs attempts until the workers succeed, restarts run out, or a terminating signal
  // arrives. Returns 0, the root-cause worker's code (128 + signal for a signal), or 128 +
  // the signal that stopped dlrun.
  int run();

 private:
  std::unique_ptr<detail::AgentImpl> impl_;
};

}  // namespace dlrun::agents
