// The fan-out of a one-command launch: one ssh client per host, each running that host's dlrun
// agent (agent_command.h), supervised from this process until every one has ended.
//
// - Output: each client's stdout and stderr are cut into lines and written here with the host's
//   name in front ("node1: [0]:hello"), one write per line.
// - Stopping: a signal of `stopSignals` here (SIGINT, SIGTERM, SIGHUP, SIGQUIT unless
//   --signals-to-handle says) is written as a line ("SIGINT") to every client's stdin, which the
//   agent reads (--control-stdin) and follows as if the signal had reached it: the whole job
//   stops as with a Ctrl-C on one node, and this process waits for every agent. SIGUSR1 and
//   SIGUSR2 otherwise go the same way, and the agents forward them to their workers; one of the
//   default four left out is ignored, as the agents do.
//   The clients lead process groups of their own, so a terminal's Ctrl-C reaches them only
//   through here. A client that died (killed, or its connection lost) closes its agent's stdin,
//   and that agent stops the job as on SIGHUP; the others are told "HUP" too.
// - The end: `outcome` (the job's end as the rendezvous recorded it) gives the exit code and its
//   line; without one, a client that exited 255 before any worker started anywhere
//   (`workersStarted`) is an unreachable host (exit 2), else the first host that failed names
//   the code. Clients left after the agents' --stop-timeout plus a margin are killed.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/signal_name.h"
#include "rendezvous/round_end.h"

namespace dlrun::remote {

struct FanoutNode {
  std::string host;               // the prefix of its output, and in messages
  std::string where;              // "FILE line 3": where the user named it
  std::vector<std::string> argv;  // the ssh client's (sshArgv())
};

struct FanoutOptions {
  std::vector<FanoutNode> nodes;
  std::chrono::milliseconds stopTimeout{30'000};       // the agents' --stop-timeout
  std::vector<int> stopSignals = kDefaultStopSignals;  // the agents' --signals-to-handle
  // Whether any round of the job has closed, so workers may have started (unset: unknown).
  std::function<bool()> workersStarted;
  // How the job ended, as its rendezvous says (unset or nullopt: unknown).
  std::function<std::optional<rendezvous::RoundEnd>()> outcome;
};

// Runs the clients until all have ended; returns the launcher's exit code. Throws ConfigError
// naming the host when one was unreachable before any worker started.
int runFanout(const FanoutOptions& options);

}  // namespace dlrun::remote
