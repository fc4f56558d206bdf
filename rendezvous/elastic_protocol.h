// The pure half of the multi-node rendezvous (ARCHITECTURE.md section 4): the store keys of a job,
// what each agent publishes, how a closed round is turned into ranks, and why a round ended.
// No I/O, so tests reach every rule directly; ElasticRendezvous drives it over a store.
//
// Round r of job ID, keys under "dlrun/ID/":
//   current            the newest round number (advanced by compare-and-set, one step at a time)
//   shape              the job's --nnodes range and protocol; another shape or protocol is refused
//   r/R/joined         ADD 1 gives an agent its arrival index i (1-based)
//   r/R/node/I         the agent's NodeRecord, held under a lease: if the agent dies, the store
//                      deletes it and sets r/R/closed = "abort" and r/R/end = NodeLost
//   r/R/closer         the arrival index of the one agent that closes the round (compare-and-set)
//   r/R/closed         "N" when the round closed with arrivals 1..N as members, or "abort"
//   r/R/assign/ID      the Assignment of the member whose record has id ID (written before
//                      "closed", so O(1) reads after it). Keyed by an id the agent draws, not its
//                      arrival index, so the keys a member waits for are known before it joins
//   r/R/members        the members' ids in arrival order, one a line (written with them)
//   r/R/roster         every worker's "host:port" in RANK order (TF_CONFIG), and under --roles
//                      every worker's role
//   r/R/end            the RoundEnd; first writer wins. Everyone running waits on this key.
//   r/R/done/I         "1" once member I's workers all succeeded (set again by a report made
//                      again: a set of members, not a count, says when all did)
//   r/R/done           ADD 1 after each such mark (a hint: a report made again after its reply
//                      was lost adds twice); a member whose ADD reaches the round's size, and who
//                      finds every member's mark, sets end = Finished
//   r/R/spares         agents waiting for a place while round R runs at its maximum
//   lost/NAME          set by the store when the lease of node NAME lapsed or dropped: the id of
//                      the agent that held it (one that comes back alive is no lost node)
//   stop               the RoundEnd of a deliberate stop of the whole job (first writer wins);
//                      the stopper also sets the newest round's end, and its closed = "stop"
//                      so agents still waiting for that round to close wake up
//   r/R/names          the members' node names, in arrival order (for messages)
//   r/R/hang/I         member I's hang report (RoundEnd::hang): its ranks' progress and stacks
//   r/R/probe-at/I, r/R/probe/I  member I's network probe: where it answers, what it measured
//   r/R/failures/I     member I's failed workers once a final failure ended the job
//   failures           the job's count of failure restarts, raised (compare-and-set, never
//                      lower) by the member whose failure ended a round and by each node that
//                      reads that end; a closer gives the round the larger of it and its
//                      members' own counts
//   r/R/gave-up        names of the nodes whose join timeout ended their wait in round R, one
//                      a line (appended before each releases its record)
//   forgotten          the newest round whose keys are deleted: the closer of round R deletes
//                      those of rounds up to R - 2 once its workers run, so a long elastic job
//                      keeps the keys of its last two rounds (and of one forming)
//   expiry             etcd: when the job ended and the TTL its keys then got (Expiry), written
//                      by each agent leaving the ended job with the lease that expires them
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/rendezvous.h"
#include "rendezvous/round_end.h"
#include "rendezvous/world.h"

namespace dlrun::rendezvous::elastic {

class Keys {
 public:
  explicit Keys(const std::string& runId) : root_("dlrun/" + runId + "/") {}
  const std::string& root() const { return root_; }  // every key of the job starts with it
  std::string current() const { return root_ + "current"; }
  std::string shape() const { return root_ + "shape"; }
  std::string joined(int round) const { return roundKey(round, "joined"); }
  std::string node(int round, int index) const {
    return roundKey(round, "node/" + std::to_string(index));
  }
  std::string closed(int round) const { return roundKey(round, "closed"); }
  std::string closer(int round) const { return roundKey(round, "closer"); }
  std::string assignment(int round, const std::string& member) const {
    return roundKey(round, "assign/" + member);
  }
  std::string members(int round) const { return roundKey(round, "members"); }
  std::string roster(int round) const { return roundKey(round, "roster"); }
  std::string end(int round) const { return roundKey(round, "end"); }
  std::string done(int round) const { return roundKey(round, "done"); }
  std::string succeeded(int round, int index) const {
    return roundKey(round, "done/" + std::to_string(index));
  }
  std::string spares(int round) const { return roundKey(round, "spares"); }
  std::string lost(const std::string& node) const { return root_ + "lost/" + node; }
  std::string stop() const { return root_ + "stop"; }
  // The failure restarts the job used, as its last WorkerFailed end counted them: a round's
  // closer reads it, so the count holds when no member of the failed rounds is in the next.
  std::string failures() const { return root_ + "failures"; }
  std::string names(int round) const { return roundKey(round, "names"); }
  std::string gaveUp(int round) const { return roundKey(round, "gave-up"); }
  // What member `index` told the round's others (Rendezvous::shareWithRound).
  std::string shared(int round, RoundTopic topic, int index) const;
  std::string forgotten() const { return root_ + "forgotten"; }
  std::string expiry() const { return root_ + "expiry"; }
  // Every key round `round` may hold, when `joined` agents joined it and `members` (the ids in
  // Keys::members) closed it; the end last.
  std::vector<std::string> ofRound(int round, int joined,
                                   const std::vector<std::string>& members) const;

 private:
  std::string roundKey(int round, const std::string& leaf) const {
    return root_ + "r/" + std::to_string(round) + "/" + leaf;
  }
  std::string root_;
};

inline constexpr std::string_view kAborted = "abort";
inline constexpr std::string_view kStopped = "stop";

// What an agent publishes when it joins a round.
struct NodeRecord {
  std::string id;               // drawn by the agent, unique in the job: the key of its assignment
  std::string addr;             // numeric address other nodes reach it at
  std::string name;             // hostname, for messages only (several nodes may share one)
  int nproc = 1;                // workers it runs
  std::optional<int> rankHint;  // --node-rank or the Slurm node id
  std::vector<uint16_t> workerPorts;  // one free port per local worker, for TF_CONFIG
  int failures = 0;                   // failure restarts this agent has seen in the job so far
  std::optional<int> lastGroupRank;   // its group rank in the round before, kept where possible
  // The port of the workers' store this agent serves on `addr` (etcd: no machine is special,
  // so whichever agent gets group rank 0 serves its round's workers); unset under c10d.
  std::optional<uint16_t> storePort;
  // Under --roles, each local worker's role name; empty: every worker has the node's --role.
  std::vector<std::string> roles;
  // The workers it keeps running from the round before (a node lost, --recovery=in-process);
  // its workerPorts are theirs then.
  std::optional<KeptWorkers> kept;
};

std::string encode(const NodeRecord& record);
NodeRecord decodeNodeRecord(std::string_view text);  // throws ProtocolError
// A node as messages name it: "host (address)".
std::string nodeName(const NodeRecord& record);

// One member's place in a closed round.
using Assignment = Placement;

std::string encode(const Assignment& assignment);
Assignment decodeAssignment(std::string_view text);

// Every worker of a round, in RANK order.
struct Roster {
  std::vector<std::string> endpoints;  // "host:port"
  std::vector<std::string> roles;      // role names under --roles; else empty
};

struct Plan {
  std::vector<Assignment> byArrival;  // index 0 is arrival 1
  Roster roster;
};

// Group ranks by (rank hint, numeric address, last group rank, arrival); base ranks are the prefix
// sums of the members' worker counts in group-rank order, so nodes may run different numbers of
// workers. When group rank 0 serves a workers' store (storePort), every assignment names its
// address and that port as the workers' MASTER_ADDR/MASTER_PORT.
//
// A round that can keep running workers does: when members kept their workers (NodeRecord::kept,
// all from one round) and the others fill exactly the places of the nodes lost (as many nodes,
// the same ranks), each keeper keeps its place and the newcomers take the lost places in the
// order above, their workers joining the kept ones (Placement::joins). A smaller round of
// keepers alone keeps them all, in their old order, their ranks renumbered from 0 (a node lost
// within --nnodes=MIN:MAX, no spare). Else (newcomers that do not fit, the workers' store gone
// with its node, --roles) the plan is the usual one, and the keepers restart their workers
// with everyone's.
Plan planRound(const std::vector<NodeRecord>& byArrival);

// A JSON array of endpoints, or {"endpoints":[...],"roles":[...]} under --roles; throws
// ProtocolError when malformed, or when some nodes ran --roles and others not.
std::string encodeRoster(const Roster& roster);
Roster decodeRoster(std::string_view text);

std::string encode(const RoundEnd& end);
RoundEnd decodeRoundEnd(std::string_view text);

// How a job that already ended did, from its keys: `stop` (Keys::stop()) and the end of its
// newest round (Keys::end(current)), either empty when missing. Nothing while the job runs or
// before it starts. A store that outlives its jobs (etcd) would otherwise hand a new job with
// the same id the old outcome at once.
std::optional<RoundEnd> endedJob(std::string_view stop, std::string_view newestEnd);

// When an ended job's keys go (Keys::expiry()): the job ended at `endedAt` (unix seconds, when
// the agent that wrote it left), and its keys then got a lease of `ttl` seconds.
struct Expiry {
  int64_t endedAt = 0;
  int64_t ttl = 0;
  bool operator==(const Expiry&) const = default;
};

std::string encode(const Expiry& expiry);  // "ENDED TTL"
// Nothing for empty or malformed text: it only words a message.
std::optional<Expiry> decodeExpiry(std::string_view text);
// "ended at HH:MM:SS (HOW); its keys expire at HH:MM:SS, in N s (--rdzv-conf job_ttl=TTL)", in
// local time, counted from `nowUnix`; `how` says how the job ended (RoundEnd::describe()).
std::string describe(const Expiry& expiry, int64_t nowUnix, const std::string& how);

// The rendezvous protocol these agents speak: the keys, the records and what they mean. Raised
// whenever one of them changes in a way another version's agent would misread, so that a job
// whose nodes run different dlrun versions is refused at once with one line, rather than
// failing later on a record one of them cannot read. 1: before it was stored; 2: node records
// carry an agent id, and assignments are keyed by it; 3: a member's success is marked under
// done/I, and the round finishes once every member's mark is there; 4: a record may keep
// running workers, and an assignment keeps or joins them.
inline constexpr int kProtocolVersion = 4;

// The job's --nnodes range and the protocol of the agent that wrote it, stored under
// Keys::shape(): a second job with another shape, or a node of another protocol, is refused.
struct Shape {
  int minNodes = 0;
  int maxNodes = 0;
  int protocol = kProtocolVersion;
  bool operator==(const Shape&) const = default;
};

// "min:max/pN"; protocol 1's agents wrote "min:max".
std::string encodeShape(const Shape& shape);
Shape decodeShape(std::string_view text);  // ProtocolError on anything else

// A closed round's members (Keys::members()): their agent ids in arrival order, a line each.
// Read by whoever deletes the round's keys and by the control plane, which names the first.
std::string encodeMembers(const std::vector<std::string>& ids);
std::vector<std::string> decodeMembers(std::string_view text);  // empty text: none

}  // namespace dlrun::rendezvous::elastic
