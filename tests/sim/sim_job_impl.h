// The job of one schedule (sim_job.cpp: its agents, workers and run; sim_job_faults.cpp: the
// faults it plans), shared by the two files.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "rendezvous/elastic_rendezvous.h"
#include "tests/sim/sim_job.h"
#include "tests/sim/sim_record.h"
#include "tests/sim/sim_recovery.h"
#include "tests/sim/sim_store.h"

namespace dlrun::sim::detail {

using rendezvous::ElasticOptions;
using rendezvous::ElasticRendezvous;
using rendezvous::RoundEnd;
using rendezvous::World;

// The first fault comes within this; the job must be over a bound after the last one.
constexpr Duration kFaultWindow{120'000};
constexpr Duration kWorkLow{3'000}, kWorkHigh{25'000};

class Job {
 public:
  Job(uint64_t seed, bool keepTrace);
  ~Job();

  Verdict run();

 private:
  struct Agent;     // one incarnation's shared state between its tasks
  struct Planned {  // a fault planned at a time
    Time at;
    bool workers;
    bool skipped = false;  // skipFaults
  };

  std::string label(int owner) const {
    return owner < 0 ? "sim" : record_.agents[static_cast<size_t>(owner)].label;
  }
  Incarnation& incarnation(int owner) { return record_.agents[static_cast<size_t>(owner)]; }
  int start(int node, int life, Time at);
  ElasticOptions options(const Incarnation& me);
  void agentBody(int owner);
  void workerBody(const std::shared_ptr<Agent>& agent, World world, RoundId id);
  void inProcessBody(const std::shared_ptr<Agent>& agent, World world, RoundId id);
  void planWorkerKills();
  void planTargetedFaults();
  void planFaults();
  void fault(Time at, const std::string& what, std::function<void()> act, bool workers = true);
  void noteFault(Time at, bool workers);
  void skipFaults(Duration span);
  void loseReplies(Duration window);
  void reportFinished(Agent& agent, const std::string& who, RoundId id, int round);
  void stopWorkers(Agent& agent, bool kept = false);
  void watchKept(int owner, std::map<int, int> kept);
  void startWorkers(const std::shared_ptr<Agent>& agent, const World& world, RoundId id);
  void stopAgent(int owner);
  void killAgent(Incarnation& a);
  void end(int owner, std::optional<RoundEnd> end, const std::string& error = "",
           const std::string& kind = "");
  std::string summary() const;

  Simulation sim_;
  std::unique_ptr<SimBackend> store_;
  Record record_;
  std::unique_ptr<InProcess> inProcess_;
  double failureChance_ = 0;
  bool lossAtFinish_ = false;      // replies lost as the first node's workers finish
  bool killFirstToLeave_ = false;  // InProcess::killFirstToLeave
  bool loseSourceNode_ = false;    // InProcess::loseSourceNode
  std::deque<Planned> planned_;    // the faults planned at times (a deque: callbacks hold them)
  std::map<int, std::shared_ptr<Agent>> live_;  // by owner, while its agent task runs
};

struct Job::Agent {
  int owner;
  std::unique_ptr<ElasticRendezvous> rendezvous;
  bool workersRunning = false;
  bool stopWorkers = false;
  bool keeping = false;  // its workers run on while it joins the next round (in process)
  // The round its workers report to, and its world: a round that kept them moves them on.
  RoundId round;
  World world;
  bool reporting = false;  // the worker task is in a report
  int workerTasks = 0;
};

}  // namespace dlrun::sim::detail
