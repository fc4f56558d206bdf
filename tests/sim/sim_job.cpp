#include "tests/sim/sim_job.h"

#include <algorithm>
#include <csignal>
#include <map>
#include <memory>
#include <sstream>
#include <utility>

#include "agents/recovery.h"
#include "common/error.h"
#include "common/log.h"
#include "rendezvous/elastic_rendezvous.h"
#include "tests/sim/sim_etcd.h"
#include "tests/sim/sim_job_impl.h"
#include "tests/sim/sim_record.h"
#include "tests/sim/sim_recovery.h"
#include "tests/sim/sim_store.h"

namespace dlrun::sim::detail {

namespace {

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

}  // namespace

Job::Job(uint64_t seed, bool keepTrace) : sim_(seed, keepTrace) {
  record_.shape = drawShape(sim_);
  // From a generator of its own: a schedule without in-process recovery is the one it was
  // before the model came.
  std::mt19937_64 side(seed ^ 0x1f00dull);
  record_.shape.inProcess = side() % 2 == 0;
  record_.shape.steps = static_cast<int>(4 + side() % 24);
  // Faults aimed at a job's end, from it too: a schedule without them is the one it was.
  lossAtFinish_ = side() % 10 == 0;
  killFirstToLeave_ = record_.shape.inProcess && side() % 5 == 0;
  loseSourceNode_ = record_.shape.inProcess;  // where it can: see InProcess::loseSourceNode
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

Job::~Job() {
  sim_.unwind();  // before what its tasks' stacks refer to goes
  log::setThreadSink(nullptr);
}

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
                                ? inProcess_->keepable(owner)
                                : std::nullopt) {
        sim_.note(label(owner) + " keeps its workers through the re-rendezvous");
        agent->rendezvous->offerKept(*keep, [this, agent] {
          sim_.note(label(agent->owner) + "'s join went on without its kept workers: they stop");
          agent->keeping = false;
          stopWorkers(*agent);
        });
        agent->keeping = true;
        inProcess_->keeping(owner, record_.endSeen.at(id));
        sim_.spawn(owner, [this, owner, kept = inProcess_->keptGenerations(owner)] {
          watchKept(owner, kept);
        });
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

// AgentImpl::watchKept: the kept workers looked at every 5 ms for their grace (the simulation's
// steps take no time: 2 s); those that never saw the lost node's failure are killed then (their
// failure restarts the whole group).
void Job::watchKept(int owner, std::map<int, int> kept) {
  const Time deadline = sim_.now() + agents::recovery::keepGrace(0);
  while (!(kept = inProcess_->unseeing(owner, kept)).empty()) {
    if (sim_.now() >= deadline) return inProcess_->stopUnseeing(owner, kept);
    sim_.sleep(Duration(5));
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
      record_.faults.push_back(sim_.now());
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
  me.endLife = store_->lifeOfLastRead(owner);
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
  planTargetedFaults();
  Verdict verdict;
  bool idle = false;
  for (Time until{};;) {
    const auto last = std::max_element(record_.faults.begin(), record_.faults.end());
    const Time horizon = (last == record_.faults.end() ? Time{} : *last) + kBound;
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

}  // namespace dlrun::sim::detail

namespace dlrun::sim {

Verdict runSchedule(uint64_t seed, bool keepTrace) {
  detail::Job job(seed, keepTrace);
  return job.run();
}

}  // namespace dlrun::sim
