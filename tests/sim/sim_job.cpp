#include "tests/sim/sim_job.h"

#include <algorithm>
#include <csignal>
#include <map>
#include <memory>
#include <sstream>
#include <utility>

#include "common/error.h"
#include "common/log.h"
#include "rendezvous/elastic_rendezvous.h"
#include "tests/sim/sim_etcd.h"
#include "tests/sim/sim_record.h"
#include "tests/sim/sim_recovery.h"
#include "tests/sim/sim_store.h"

namespace dlrun::sim {

namespace {

using rendezvous::ElasticOptions;
using rendezvous::ElasticRendezvous;
using rendezvous::RoundEnd;
using rendezvous::World;

// The first fault comes within this; the job must be over a bound after the last one.
constexpr Duration kFaultWindow{120'000};
constexpr Duration kWorkLow{3'000}, kWorkHigh{25'000};

Shape drawShape(Simulation& sim) {
  Shape s;
  s.nodes = static_cast<int>(sim.uniform(2, 5));
  s.minNodes = static_cast<int>(sim.uniform(1, s.nodes));
  s.maxNodes = static_cast<int>(sim.uniform(s.minNodes, s.nodes));
  s.maxRestarts = static_cast<int>(sim.uniform(0, 3));
  s.refuseLostNodes = sim.chance(0.25);
  s.lastCall = sim.between(Duration(200), Duration(3'000));
  s.storeOutage = sim.between(Duration(8'000), Duration(30'000));
  return s;
}

std::string kindName(const std::exception& e) {
  if (dynamic_cast<const ConfigError*>(&e)) return "ConfigError";
  if (dynamic_cast<const TimeoutError*>(&e)) return "TimeoutError";
  if (dynamic_cast<const NetworkError*>(&e)) return "NetworkError";
  if (dynamic_cast<const ProtocolError*>(&e)) return "ProtocolError";
  if (dynamic_cast<const Error*>(&e)) return "Error";
  return "std::exception";
}

class Job {
 public:
  Job(uint64_t seed, bool keepTrace) : sim_(seed, keepTrace) {
    record_.shape = drawShape(sim_);
    // From a generator of its own: a schedule without in-process recovery is the one it was
    // before the model came.
    std::mt19937_64 side(seed ^ 0x1f00dull);
    record_.shape.inProcess = side() % 2 == 0;
    record_.shape.steps = static_cast<int>(4 + side() % 24);
    // Faults aimed at a job's end, from it too: a schedule without them is the one it was.
    lossAtFinish_ = side() % 10 == 0;
    killFirstToLeave_ = record_.shape.inProcess && side() % 5 == 0;
    const NetworkShape network{.replyTimeout = Duration(4'000), .connectTimeout = Duration(1'000)};
    inProcess_ = std::make_unique<InProcess>(sim_, record_, network);
    if (sim_.chance(0.5)) {
      store_ = std::make_unique<SimEtcd>(sim_, network);
    } else {
      store_ = std::make_unique<SimStoreServer>(sim_, network);
    }
    log::setThreadSink([this](std::string_view line) {
      sim_.note(label(sim_.owner()) + " says: " + std::string(line));
    });
  }
  ~Job() {
    sim_.unwind();  // before what its tasks' stacks refer to goes
    log::setThreadSink(nullptr);
  }

  Verdict run();

 private:
  struct Agent;  // one incarnation's shared state between its tasks

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
  void planFaults();
  void fault(Time at, const std::string& what, std::function<void()> act, bool workers = true);
  void noteFault(Time at, bool workers);
  void loseReplies(Duration window);
  void reportFinished(Agent& agent, const std::string& who, RoundId id, int round);
  void stopWorkers(Agent& agent, bool kept = false);
  std::optional<rendezvous::KeptWorkers> keepable(Agent& agent);
  void startWorkers(const std::shared_ptr<Agent>& agent, const World& world, RoundId id);
  void stopAgent(int owner);
  void end(int owner, std::optional<RoundEnd> end, const std::string& error = "",
           const std::string& kind = "");
  std::string summary() const;

  Simulation sim_;
  std::unique_ptr<SimBackend> store_;
  Record record_;
  std::unique_ptr<InProcess> inProcess_;
  double failureChance_ = 0;
  bool lossAtFinish_ = false;                   // replies lost as the first node's workers finish
  bool killFirstToLeave_ = false;               // InProcess::killFirstToLeave
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

int Job::start(int node, int life, Time at) {
  Incarnation me;
  me.owner = static_cast<int>(record_.agents.size());
  me.node = node;
  me.life = life;
  me.label = "n" + std::to_string(node) + "#" + std::to_string(life);
  record_.agents.push_back(me);
  const int owner = me.owner;
  sim_.at(at, [this, owner] {
    // A node started after its job ended starts another job, which these checks do not follow.
    for (const auto& a : record_.agents)
      if (a.ended && a.end && a.end->endsJob())
        return end(owner, std::nullopt, "not started: the job is over", "NotStarted");
    sim_.note(label(owner) + " starts");
    sim_.spawn(owner, [this, owner] { agentBody(owner); });
  });
  return owner;
}

ElasticOptions Job::options(const Incarnation& me) {
  const Shape& s = record_.shape;
  ElasticOptions o;
  o.runId = "job";
  o.minNodes = s.minNodes;
  o.maxNodes = s.maxNodes;
  o.restarts.maxRestarts = s.maxRestarts;
  o.self.addr = nodeAddress(me.node);
  o.self.name = "n" + std::to_string(me.node);
  o.self.nproc = 2;
  o.self.storePort = kStorePort;  // group rank 0 serves the workers' store, as over etcd
  o.lastCall = s.lastCall;
  o.joinTimeout = s.joinTimeout;
  o.heartbeat = s.heartbeat;
  o.leaseTtl = s.leaseTtl;
  o.storeOutage = s.storeOutage;
  o.refuseLostNodes = s.refuseLostNodes;
  o.memberId = "m" + std::to_string(me.owner);
  o.workerPorts = [](const std::string&, int count) {
    std::vector<uint16_t> ports;
    for (int i = 0; i < count; ++i) ports.push_back(static_cast<uint16_t>(kFirstWorkerPort + i));
    return ports;
  };
  const int owner = me.owner;
  o.store =
      rendezvous::StoreOpener{.name = "the store",
                              .open = [this, owner] { return store_->open(owner, label(owner)); },
                              .now = [this] { return sim_.now(); },
                              .pause = [this](std::chrono::milliseconds d) { sim_.sleep(d); }};
  return o;
}

void Job::agentBody(int owner) {
  auto agent = std::make_shared<Agent>();
  agent->owner = owner;
  live_[owner] = agent;
  struct Gone {
    std::map<int, std::shared_ptr<Agent>>& live;
    int owner;
    ~Gone() { live.erase(owner); }
  } gone{live_, owner};
  try {
    agent->rendezvous = std::make_unique<ElasticRendezvous>(options(incarnation(owner)));
    while (true) {
      rendezvous::JoinResult joined = agent->rendezvous->next();
      if (auto* over = std::get_if<RoundEnd>(&joined)) {
        sim_.note(label(owner) + " joined no round: the job ended (" + over->describe() + ")");
        stopWorkers(*agent);  // kept ones, for a round that never came
        return end(owner, *over);
      }
      const World world = std::get<World>(joined);
      sim_.note(label(owner) + " is in round " + std::to_string(world.round) + ": node rank " +
                std::to_string(world.groupRank) + " of " + std::to_string(world.groupWorldSize) +
                ", " + std::to_string(world.failures) + " failures before");
      const RoundId id{store_->lifeOfLastRead(owner), world.round};
      record_.worlds[id].emplace_back(owner, world);
      startWorkers(agent, world, id);
      const RoundEnd ended = agent->rendezvous->awaitEnd();
      sim_.note(label(owner) + " saw round " + std::to_string(world.round) +
                " end: " + ended.describe());
      record_.ends[id].emplace_back(owner, ended);
      record_.endSeen.emplace(id, sim_.now());
      // As AgentImpl::keepThroughNextRound: not where this node is the one lost.
      const std::string self = "n" + std::to_string(incarnation(owner).node) + " (" +
                               nodeAddress(incarnation(owner).node) + ")";
      if (const auto keep = ended.kind == RoundEnd::Kind::NodeLost && ended.node != self &&
                                    record_.shape.inProcess && agent->workersRunning
                                ? keepable(*agent)
                                : std::nullopt) {
        sim_.note(label(owner) + " keeps its workers through the re-rendezvous");
        agent->rendezvous->offerKept(*keep, [this, agent] {
          sim_.note(label(agent->owner) + " waits as a spare: its kept workers stop");
          agent->keeping = false;
          stopWorkers(*agent);
        });
        agent->keeping = true;
        inProcess_->keeping(owner, record_.endSeen.at(id));
        continue;
      }
      stopWorkers(*agent);
      if (ended.endsJob()) return end(owner, ended);
    }
  } catch (const Error& e) {
    stopWorkers(*agent);
    end(owner, std::nullopt, e.what(), kindName(e));
  } catch (const Killed&) {
    throw;
  } catch (const std::exception& e) {
    end(owner, std::nullopt, e.what(), kindName(e));
  }
}

// AgentImpl::awaitRecovering: the workers are kept once all are recovering, looked at every
// 20 ms for up to 2 s.
std::optional<rendezvous::KeptWorkers> Job::keepable(Agent& agent) {
  const Time deadline = sim_.now() + Duration(2'000);
  while (true) {
    bool notYet = false;
    if (auto kept = inProcess_->keepable(agent.owner, &notYet)) return kept;
    if (!notYet || sim_.now() >= deadline) return std::nullopt;
    sim_.sleep(Duration(20));
  }
}

// The round's workers: new ones, or (AgentImpl::afterKeeping) the kept ones running on in it,
// or, where a kept one died while it formed, none: a failure of the round.
void Job::startWorkers(const std::shared_ptr<Agent>& agent, const World& world, RoundId id) {
  const int owner = agent->owner;
  const bool kept = std::exchange(agent->keeping, false) && world.keptWorkers;
  agent->round = id;
  agent->world = world;
  if (kept && !agent->workersRunning) {
    stopWorkers(*agent);
    sim_.note(label(owner) + "'s kept workers failed while round " + std::to_string(world.round) +
              " formed");
    record_.failureReported.insert(id);
    try {
      agent->rendezvous->reportFailure(
          RoundEnd{.kind = RoundEnd::Kind::WorkerFailed,
                   .node = "n" + std::to_string(incarnation(owner).node),
                   .rank = world.baseRank,
                   .exitCode = 75,
                   .failures = world.failures,
                   .report = "a kept worker failed"});
    } catch (const Error& e) {
      sim_.note(label(owner) + " cannot report to the rendezvous store: " + e.what());
    }
    return;
  }
  if (kept) {
    sim_.note(label(owner) + " keeps its workers running in round " + std::to_string(world.round));
    stopWorkers(*agent, /*kept=*/true);  // their last round's running ends here
    inProcess_->adopt(owner, label(owner), world, id);
  } else {
    stopWorkers(*agent);  // kept ones the round could not keep
  }
  record_.running.push_back({owner, id, sim_.now(), std::nullopt});
  agent->workersRunning = true;
  if (kept) return;
  agent->stopWorkers = false;
  ++agent->workerTasks;
  sim_.spawn(owner, [this, agent, world, id] {
    record_.shape.inProcess ? inProcessBody(agent, world, id) : workerBody(agent, world, id);
  });
}

void Job::stopWorkers(Agent& agent, bool kept) {
  if (kept) {  // they go on in the next round: only their last round's running ends
    for (auto& r : record_.running)
      if (r.owner == agent.owner && !r.to) r.to = sim_.now();
    return;
  }
  agent.stopWorkers = true;
  if (agent.workersRunning) {
    agent.workersRunning = false;
    for (auto& r : record_.running)
      if (r.owner == agent.owner && !r.to) r.to = sim_.now();
  }
  // A report under way goes on (the agent's thread makes it); the next round waits for it.
  sim_.block([&agent] { return agent.workerTasks == 0; });
}

void Job::workerBody(const std::shared_ptr<Agent>& agent, World world, RoundId id) {
  struct Done {
    Agent& agent;
    ~Done() { --agent.workerTasks; }
  } done{*agent};
  const Duration work = sim_.between(kWorkLow, kWorkHigh);
  if (sim_.block([&] { return agent->stopWorkers; }, sim_.now() + work)) return;
  agent->workersRunning = false;
  for (auto& r : record_.running)
    if (r.owner == agent->owner && !r.to) r.to = sim_.now();
  const std::string who = label(agent->owner);
  const bool fail = sim_.now() < Time{} + kFaultWindow && sim_.chance(failureChance_);
  try {
    if (fail) {
      ++record_.injectedFailures;
      record_.failureReported.insert(id);
      record_.lastFault = std::max(record_.lastFault, sim_.now());
      sim_.note(who + "'s worker fails in round " + std::to_string(world.round));
      agent->rendezvous->reportFailure(
          RoundEnd{.kind = RoundEnd::Kind::WorkerFailed,
                   .node = "n" + std::to_string(incarnation(agent->owner).node),
                   .rank = world.baseRank,
                   .exitCode = 1,
                   .failures = world.failures,
                   .report = "worker failed"});
    } else {
      reportFinished(*agent, who, id, world.round);
    }
  } catch (const Error& e) {
    sim_.note(who + " cannot report to the rendezvous store: " + e.what());
  }
}

void Job::end(int owner, std::optional<RoundEnd> end, const std::string& error,
              const std::string& kind) {
  Incarnation& me = incarnation(owner);
  if (me.ended) return;
  me.ended = true;
  me.endedAt = sim_.now();
  me.end = std::move(end);
  me.error = error;
  me.errorKind = kind;
  sim_.note(me.label + " ends: " + (me.end ? me.end->describe() : kind + ": " + error));
}

// A node's workers finished the round: its report, in some schedules with replies lost from
// that moment (the first time only), when a report made again may count twice.
void Job::reportFinished(Agent& agent, const std::string& who, RoundId id, int round) {
  sim_.note(who + "'s workers finished round " + std::to_string(round));
  record_.succeeded[id].insert(agent.owner);
  if (std::exchange(lossAtFinish_, false)) {
    const Duration window = sim_.between(Duration(500), Duration(3'000));
    record_.replyLoss.push_back({sim_.now(), sim_.now() + window});
    noteFault(sim_.now(), true);
    sim_.note("FAULT lose replies for " + std::to_string(window.count()) + " ms as " + who +
              "'s workers finish");
    loseReplies(window);
  }
  agent.rendezvous->reportSuccess();
}

void Job::noteFault(Time at, bool workers) {
  if (workers) record_.workerFaults.push_back(at);
  record_.lastFault = std::max(record_.lastFault, at);
  record_.firstFault = std::min(record_.firstFault.value_or(Time::max()), at);
}

void Job::fault(Time at, const std::string& what, std::function<void()> act, bool workers) {
  noteFault(at, workers);
  sim_.at(at, [this, what, act = std::move(act)] {
    sim_.note("FAULT " + what);
    act();
  });
}

// Each store connection's replies lost, each with chance 0.2, for `window` from now.
void Job::loseReplies(Duration window) {
  store_->loseReplies(0.2);
  inProcess_->loseReplies(0.2);
  sim_.at(sim_.now() + window, [this] {
    store_->loseReplies(0);
    inProcess_->loseReplies(0);
  });
}

void Job::planFaults() {
  const int faults = static_cast<int>(sim_.uniform(0, 6));
  failureChance_ = sim_.chance(0.5) ? 0.3 : 0.0;
  for (int i = 0; i < faults; ++i) {
    const Time at = Time{} + sim_.between(Duration(0), kFaultWindow);
    const int kind = static_cast<int>(sim_.uniform(0, 99));
    const int node = static_cast<int>(sim_.uniform(1, record_.shape.nodes));
    const Duration d = sim_.between(Duration(300), Duration(12'000));
    if (kind < 15) {
      fault(at, "cut a connection", [this] {
        store_->cutRandomLink();
        inProcess_->cutRandomLink();
      });
    } else if (kind < 27) {
      const Duration window = sim_.between(Duration(500), Duration(5'000));
      record_.replyLoss.push_back({at, at + window});
      fault(at, "lose replies for " + std::to_string(window.count()) + " ms",
            [this, window] { loseReplies(window); });
    } else if (kind < 40) {
      record_.storeAway.push_back({at, at + d});
      fault(
          at, "stop the store", [this, d] { store_->pause(d); }, false);
    } else if (kind < 52) {
      record_.storeAway.push_back({at, at + d});
      fault(
          at, "restart the store", [this, d] { store_->restart(d); }, false);
    } else if (kind < 70) {
      fault(at,
            "stop n" + std::to_string(node) + "'s agent for " + std::to_string(d.count()) + " ms",
            [this, node, d] {
              for (auto& a : record_.agents)
                if (a.node == node && !a.killed && !a.ended) {
                  sim_.pauseOwner(a.owner, sim_.now() + d);
                  record_.paused.push_back({a.owner, {sim_.now(), sim_.now() + d}});
                }
            });
    } else if (kind < 95) {
      const bool again = sim_.chance(0.7);
      fault(at, "kill n" + std::to_string(node) + "'s agent" + (again ? ", start it again" : ""),
            [this, node, again, d] {
              for (size_t i = 0; i < record_.agents.size(); ++i) {
                Incarnation& a = record_.agents[i];
                if (a.node != node || a.killed || a.ended) continue;
                a.killed = true;
                a.endedAt = sim_.now();
                sim_.killOwner(a.owner);
                store_->cutLinksOf(a.owner);
                inProcess_->agentGone(a.owner);
                if (again) start(node, a.life + 1, sim_.now() + d);
                break;
              }
            });
    } else {
      fault(at, "SIGTERM to n" + std::to_string(node) + "'s agent", [this, node] {
        for (auto& a : record_.agents) {
          if (a.node != node || a.killed || a.ended) continue;
          a.stopAsked = true;
          const int owner = a.owner;
          sim_.spawn(owner, [this, owner] { stopAgent(owner); });
          break;
        }
      });
    }
  }
}

// In process, a worker's failure is its process killed at any moment (a fault like the others),
// not an exit at the end of its work.
void Job::planWorkerKills() {
  if (failureChance_ == 0) return;
  const int kills = static_cast<int>(sim_.uniform(1, 4));
  // While the first rounds train: a step takes 0.2 to 1.5 s.
  const Duration window(5'000 + record_.shape.steps * 1'500);
  for (int i = 0; i < kills; ++i) {
    const Time at = Time{} + sim_.between(Duration(0), window);
    const int node = static_cast<int>(sim_.uniform(1, record_.shape.nodes));
    fault(at, "kill a worker of n" + std::to_string(node), [this, node] {
      for (const auto& a : record_.agents)
        if (a.node == node && !a.killed && !a.ended && inProcess_->killWorker(a.owner)) {
          ++record_.injectedFailures;
          return;
        }
    });
  }
}

void Job::inProcessBody(const std::shared_ptr<Agent>& agent, World world, RoundId id) {
  struct Done {
    Agent& agent;
    ~Done() { --agent.workerTasks; }
  } done{*agent};
  const std::string who = label(agent->owner);
  const auto outcome =
      inProcess_->run(agent->owner, who, world, id, [agent] { return agent->stopWorkers; });
  if (outcome.kind == InProcess::Outcome::Kind::Stopped) return;
  agent->workersRunning = false;
  for (auto& r : record_.running)
    if (r.owner == agent->owner && !r.to) r.to = sim_.now();
  // A round that kept them may have moved them on since they started.
  world = agent->world;
  id = agent->round;
  try {
    if (outcome.kind == InProcess::Outcome::Kind::Finished) {
      reportFinished(*agent, who, id, world.round);
      return;
    }
    record_.failureReported.insert(id);
    agent->rendezvous->reportFailure(
        RoundEnd{.kind = RoundEnd::Kind::WorkerFailed,
                 .node = "n" + std::to_string(incarnation(agent->owner).node),
                 .rank = outcome.rank,
                 .exitCode = outcome.exitCode < 0 ? 137 : outcome.exitCode,
                 .failures = world.failures + outcome.loneRestarts,
                 .report = "worker failed: " + outcome.why});
  } catch (const Error& e) {
    sim_.note(who + " cannot report to the rendezvous store: " + e.what());
  }
}

void Job::stopAgent(int owner) {
  // dlrun on SIGTERM: it tells the job (the whole job stops), stops its workers and exits.
  const auto found = live_.find(owner);
  const auto agent = found == live_.end() ? nullptr : found->second;
  if (agent && agent->rendezvous) {
    try {
      const RoundEnd stop = agent->rendezvous->reportStop(SIGTERM);
      end(owner, stop);
    } catch (const Error& e) {
      end(owner, std::nullopt, std::string("stopped, the job not told: ") + e.what(), "Stopped");
    }
  } else {
    end(owner, std::nullopt, "stopped before it joined", "Stopped");
  }
  for (auto& r : record_.running)
    if (r.owner == owner && !r.to) r.to = sim_.now();
  store_->cutLinksOf(owner);
  inProcess_->agentGone(owner);
  sim_.killOwner(owner);  // its process exits: every task of it ends
}

std::string Job::summary() const {
  const Shape& s = record_.shape;
  std::ostringstream out;
  out << store_->name() << ", " << s.nodes << " nodes, --nnodes=" << s.minNodes << ":" << s.maxNodes
      << ", max_restarts " << s.maxRestarts << (s.refuseLostNodes ? ", lost nodes refused" : "")
      << "; ends:";
  for (const auto& a : record_.agents)
    out << " " << a.label << "="
        << (a.killed   ? "killed"
            : !a.ended ? "running"
            : a.end    ? std::string(a.end->endsJob() ? "" : "(") + a.end->describe()
                       : a.errorKind);
  return out.str();
}

Verdict Job::run() {
  constexpr Duration kBound{600'000};
  for (int node = 1; node <= record_.shape.nodes; ++node) {
    const Duration at = sim_.chance(0.2) ? sim_.between(Duration(5'000), Duration(60'000))
                                         : sim_.between(Duration(0), Duration(5'000));
    start(node, 0, Time{} + at);
    record_.starts.push_back(Time{} + at);
  }
  planFaults();
  if (record_.shape.inProcess) planWorkerKills();
  if (killFirstToLeave_) inProcess_->killFirstToLeave();
  Verdict verdict;
  bool idle = false;
  for (Time until{};;) {
    const Time horizon = record_.lastFault + kBound;
    if (horizon <= until) break;
    until = horizon;
    idle = sim_.run(until);
    if (idle) break;
  }
  std::optional<std::string> broken;
  for (const auto& a : record_.agents) {
    if (a.killed || a.ended) continue;
    broken = a.label + (idle ? " is blocked with nothing left to wake it"
                             : " had not ended " + std::to_string(kBound.count() / 1000) +
                                   " s after the last fault");
    break;
  }
  if (!broken) broken = firstViolation(record_, sim_);
  verdict.ok = !broken;
  verdict.violation = broken.value_or("");
  verdict.summary = summary();
  sim_.note("summary: " + verdict.summary);
  if (broken) sim_.note("VIOLATION: " + *broken);
  verdict.digest = sim_.digest();
  verdict.trace = sim_.trace();
  return verdict;
}

}  // namespace

Verdict runSchedule(uint64_t seed, bool keepTrace) {
  Job job(seed, keepTrace);
  return job.run();
}

}  // namespace dlrun::sim
