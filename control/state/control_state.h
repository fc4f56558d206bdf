// What a job's agents publish for the control plane (ARCHITECTURE.md section 10), in the same
// store as the job's rendezvous, and how it reads back. Pure: keys and codecs, no I/O. Agents
// write (agents/control_publisher.h), the Control service reads (control/).
//
// Keys under "dlrun/ID/" (elastic_protocol.h's root), plus one registry of every job:
//   dlrun/jobs          job ids, one a line, appended by the job's first agent (ctl/nodes' 1);
//                       readers drop repeats (lines())
//   ctl/meta            the job's settings (ControlMeta), written by the job's first agent
//   ctl/nodes           how many agents registered (ADD: each agent once, at its first write)
//   ctl/nodes/I         the host name of agent I (from 1), written with its first state: a count
//                       and a key each, not one list every agent appends to (on etcd an append
//                       is a compare-and-swap loop, O(agents^2) tries for a job)
//   ctl/node/I          agent I's state (NodeState), rewritten on each change: O(1) a change.
//                       Keyed by the agent, not its host: agents that share a host (a GPU group
//                       each) and one that comes back after a loss each keep their own
//   ctl/prog/I          how far agent I's ranks got (progress_record.h), rewritten at most once
//                       a second while they report
//   ctl/stragglers      the ranks named slow now (stragglers.h), written by group rank 0
//   ctl/seq             the number of events so far (ADD); event n is at ctl/ev/n
//   ctl/ev/N            event N (JobEvent), written once right after its ADD
//   ctl/signals         the number of signals sent to the job (ADD); ctl/signal/N is the Nth
//   ctl/signal/N        a command to every agent (ControlCommand): a signal to forward to its
//                       workers, a stop (StopJob writes it beside the rendezvous's stop key,
//                       which a single-node job does not follow), or a request for output
//                       (`dlrun logs`: log_mailbox.h's keys)
//   ctl/summary         the failure summary of a job that failed (plain text, agents/
//                       failure_summary.h), written by group rank 0 before its job_ended event:
//                       GetJob's root cause once there
// A deliberate stop of the whole job is the rendezvous's own `stop` key (elastic_protocol.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::control {

class Keys {
 public:
  explicit Keys(const std::string& runId) : root_("dlrun/" + runId + "/"), ctl_(root_ + "ctl/") {}
  static std::string jobs() { return "dlrun/jobs"; }
  std::string meta() const { return ctl_ + "meta"; }
  std::string nodes() const { return ctl_ + "nodes"; }
  std::string nodeAt(int64_t i) const { return ctl_ + "nodes/" + std::to_string(i); }
  std::string node(int64_t agent) const { return ctl_ + "node/" + std::to_string(agent); }
  std::string progress(int64_t agent) const { return ctl_ + "prog/" + std::to_string(agent); }
  std::string stragglers() const { return ctl_ + "stragglers"; }
  std::string seq() const { return ctl_ + "seq"; }
  std::string event(int64_t n) const { return ctl_ + "ev/" + std::to_string(n); }
  std::string signals() const { return ctl_ + "signals"; }
  std::string signal(int64_t n) const { return ctl_ + "signal/" + std::to_string(n); }
  std::string summary() const { return ctl_ + "summary"; }

 private:
  std::string root_;
  std::string ctl_;
};

// ControlMeta::backend of a single-node job (LocalRendezvous), whose store holds no rounds.
inline constexpr char kLocalBackend[] = "local";

struct ControlMeta {
  std::string backend;  // c10d, etcd, static, or kLocalBackend
  int minNodes = 1;
  int maxNodes = 1;
  int maxRestarts = 0;
  std::string tokenHash;  // hex SHA-256 of the job's token; empty: started without one
};

struct WorkerState {
  int rank = 0;
  int localRank = 0;
  int pid = 0;
  std::string state;        // running, succeeded, failed, stopped
  std::string exit;         // "exit code 3", "signal SIGKILL"; empty while it runs
  int64_t step = -1;        // last reported step (-1: none)
  double progressTime = 0;  // unix seconds of that report
};

// Why a node sits the rounds out (NodeState's state kSittingOut): it is in none, so it has no
// group rank and no workers; a spare or fewer nodes run without it (docs/guides/health-checks.md).
struct SittingOut {
  std::string cause;   // kHealthCheck or kQuarantine: a word, the metric's label
  std::string reason;  // one line for people, as the node said it on stderr
};
inline constexpr char kSittingOut[] = "sitting_out";
inline constexpr char kHealthCheck[] = "health_check";  // its checks failed
inline constexpr char kQuarantine[] = "quarantine";     // its workers failed too often

struct NodeState {
  std::string name;
  std::string address;
  int groupRank = -1;
  std::string state;  // joining, running, stopping, done, exited, or kSittingOut
  int round = -1;
  std::string logDir;
  std::vector<WorkerState> workers;
  double updated = 0;   // unix seconds
  int firstRound = -1;  // the round of this agent's first state in a round: when it joined
  std::optional<SittingOut> sittingOut;  // while the state is kSittingOut
};

struct JobEvent {
  int64_t seq = 0;
  double time = 0;
  std::string kind;  // see proto/dlrun/v1/control.proto's Event
  std::string node;
  int round = -1;
  int rank = -1;
  std::string detail;
  int agent = 0;  // the agent that wrote it, its id in `dlrun status` (0: the control plane)
};

// A command sent to the job through the control plane.
struct ControlCommand {
  enum class Kind { Signal, Stop, Logs };
  Kind kind = Kind::Signal;
  int value = 0;  // the signal, the exit code every agent ends with, or the log request
};

// A command's text under ctl/signal/N: a signal number, "stop:CODE" or "logs:N".
std::string encodeCommand(const ControlCommand& command);
std::optional<ControlCommand> decodeCommand(std::string_view text);

std::string encode(const ControlMeta& meta);
std::string encode(const NodeState& node);
std::string encode(const JobEvent& event);
// Each throws ProtocolError naming what it decodes for text that is not one.
ControlMeta decodeMeta(std::string_view text);
NodeState decodeNodeState(std::string_view text);
JobEvent decodeEvent(std::string_view text);

// The lines of an appended list (dlrun/jobs), each once, in first-seen order.
std::vector<std::string> lines(std::string_view text);

}  // namespace dlrun::control
