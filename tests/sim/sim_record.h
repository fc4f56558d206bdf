// What a schedule's agents did, as the invariants need it: kept by sim_job.cpp as it happens,
// checked by sim_checks.cpp once the schedule is over.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/round_end.h"
#include "rendezvous/world.h"
#include "tests/sim/simulation.h"

namespace dlrun::sim {

// How the simulated nodes are reached: node N at nodeAddress(N), its workers at ports from
// kFirstWorkerPort; the workers' store at kStorePort of the round's group rank 0.
inline constexpr uint16_t kStorePort = 29400;
inline constexpr uint16_t kFirstWorkerPort = 29500;
inline std::string nodeAddress(int node) { return "10.0.0." + std::to_string(node); }

struct Shape {
  int nodes = 2;
  int minNodes = 1;
  int maxNodes = 2;
  int maxRestarts = 0;
  bool refuseLostNodes = false;
  Duration heartbeat{1'000};
  Duration leaseTtl{3'000};
  Duration lastCall{1'000};
  Duration joinTimeout{60'000};
  Duration storeOutage{20'000};
  bool inProcess = false;  // --recovery=in-process, the workers in dlrun.recovery's loop
  int steps = 0;           // their training steps, in process
};

// One process of an agent: a node's first, or one started again after it was killed.
struct Incarnation {
  int owner = 0;  // the simulation's owner number
  int node = 0;
  int life = 0;       // 0: the node's first process
  std::string label;  // "n2#1": node 2's second process
  bool killed = false;
  bool ended = false;
  Time endedAt{};
  std::optional<rendezvous::RoundEnd> end;  // how the job ended for it
  int endLife = 0;    // the store's life (restarts without its keys) of its last reply as it ended
  std::string error;  // or the error it ended with
  std::string errorKind;   // the error's type
  bool stopAsked = false;  // a stop (SIGTERM) was sent to it
};

// A round as the store knew it: its number, and the store's life it closed in (a store
// restarted without its keys may see a number again, while the nodes meet anew).
using RoundId = std::pair<int, int>;  // (store life, round)

struct Running {  // a node's workers of one round
  int owner;
  RoundId round;
  Time from;
  std::optional<Time> to;
};

// A worker replaced alone (in process), and when its recovery completed, if it did.
struct Replacement {
  RoundId round;  // the round it ran in
  RoundId space;  // its workers' key space and store: its round's, or a kept one's
  int owner = 0;
  int rank = 0;
  Time at{};
  Time failedAt{};  // the death (a kill) of the process it replaces
  std::optional<Time> recovered;
};

// A round that kept a node's running workers (a node lost, in process): the key space they run
// in (their first round's), the generation they had reached, and when a later one formed there.
struct Kept {
  RoundId round;
  RoundId space;
  int owner = 0;
  int generation = 0;
  Time since{};  // when the lost node's round's end was first seen
  Time at{};
  bool meeting = true;  // every one still in its meeting then (else past it: it cannot move)
  std::optional<Time> recovered;
};

struct Record {
  Shape shape;
  std::vector<Incarnation> agents;
  std::map<RoundId, std::vector<std::pair<int, rendezvous::World>>> worlds;   // (owner, World)
  std::map<RoundId, std::vector<std::pair<int, rendezvous::RoundEnd>>> ends;  // as awaitEnd saw
  std::map<RoundId, std::set<int>> succeeded;  // owners that reported success
  std::set<RoundId> failureReported;           // rounds some worker's failure was reported in
  std::vector<Running> running;
  std::vector<std::pair<int, std::pair<Time, Time>>> paused;  // owner, interval
  std::vector<std::pair<Time, Time>> storeAway;               // stopped or down
  std::vector<Time> faults;        // when each struck, planned or aimed at a moment
  std::optional<Time> firstFault;  // of those planned (a worker's failure comes after a round)
  std::vector<Time> starts;        // each node's first process's start
  int injectedFailures = 0;
  // When each fault struck that reaches the workers (all but the rendezvous store's own), a
  // worker's kill among them; the windows in which stores lost replies.
  std::vector<Time> workerFaults;
  std::vector<std::pair<Time, Time>> replyLoss;
  // In process: the replacements, the ranks each round's members replaced alone (by owner),
  // and what the model saw break as it happened (a step taken twice or lost, weights apart,
  // two generations at once).
  std::vector<Replacement> replacements;
  std::map<RoundId, std::map<int, int>> loneRestarts;
  std::set<RoundId> workerStoreCut;  // rounds whose workers' store had a connection cut
  std::map<RoundId, Time> leftLoop;  // when a rank of the round first left the loop
  std::map<RoundId, Time> fellBack;  // when a worker of the round first fell back (exit 75)
  std::vector<std::string> modelBreaks;
  std::vector<Kept> kept;
  std::map<RoundId, Time> endSeen;  // when a member first saw the round's end
};

// The first invariant `record` breaks, or nothing.
std::optional<std::string> firstViolation(const Record& record, const Simulation& sim);

}  // namespace dlrun::sim
