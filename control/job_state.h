// What state a job is in, from the rendezvous keys its agents keep (ARCHITECTURE.md section 10).
// Pure: the Control service reads the keys, this decides, so tests reach every case directly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "control/state/control_state.h"
#include "dlrun/v1/control.pb.h"
#include "rendezvous/round_end.h"

namespace dlrun::control {

// The keys of job ID that decide its state (elastic_protocol.h), each empty when missing.
struct RoundKeys {
  std::string stop;            // stop: a deliberate stop of the whole job
  std::string current;         // current: the newest round; missing before any agent came
  std::string closed;          // r/CURRENT/closed
  std::string end;             // r/CURRENT/end
  std::string assignment;      // the first member's r/CURRENT/assign/ID: the restarts used before
  std::string previousClosed;  // r/CURRENT-1/closed
  std::string previousEnd;     // r/CURRENT-1/end
  std::string forgotten;       // forgotten: a closer deleted old rounds, so some round ran
};

struct JobStatus {
  v1::JobState state = v1::FORMING;
  int round = 0;
  int restartsUsed = 0;
  std::optional<rendezvous::RoundEnd> end;  // what ended the job, once it ended
};

// forming: no round closed yet; running: the newest round closed and has not ended;
// restarting: a round ended by a failure with restarts left or a change of members, and the
// next one has not closed; succeeded, failed (a final worker failure) and stopped: the job's
// end, as every agent follows it (an end of the newest round that ends the job first, since
// agents act on it, then the job's stop). Throws ProtocolError for a malformed value.
JobStatus jobStatus(const RoundKeys& keys);

// A single-node job's (control::kLocalBackend): its rendezvous keeps no rounds in
// the store, and the store goes with its one agent, so no end is ever read. Stopped once `stop`
// is written; else running in its node's round once the node published its state (`nodeRound`,
// at its workers' start), forming before; each round after the first was a restart.
JobStatus localJobStatus(const RoundKeys& keys, std::optional<int> nodeRound);

// One agent of the job as GetJob lists it: each registration (ctl/nodes) is an agent of its own.
struct AgentRecord {
  int64_t id = 0;                           // its index in ctl/nodes: unique in the job
  std::string name;                         // its host's name
  std::optional<control::NodeState> state;  // none before its first record landed
};

// For each agent (`agents` in registration order), the id of the later agent on its host that
// took its place (0: none): one whose first state is from a round after this agent's last. That
// is a new agent process on the host after this one was lost (it joins a round this one never
// saw); agents that share a host side by side join together and each keeps its own state. (One
// joining a host later, in an elastic job, marks an older one there until that one publishes
// the new round too.)
std::vector<int64_t> replacedBy(const std::vector<AgentRecord>& agents);

}  // namespace dlrun::control
