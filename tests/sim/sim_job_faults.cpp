// The faults a schedule's job plans (sim_job_impl.h): at drawn times, and aimed at moments.
#include <algorithm>

#include "tests/sim/sim_job_impl.h"

namespace dlrun::sim::detail {

void Job::noteFault(Time at, bool workers) {
  if (workers) record_.workerFaults.push_back(at);
  record_.faults.push_back(at);
  record_.firstFault = std::min(record_.firstFault.value_or(Time::max()), at);
}

void Job::fault(Time at, const std::string& what, std::function<void()> act, bool workers) {
  noteFault(at, workers);
  const Planned& planned = planned_.emplace_back(Planned{at, workers});
  sim_.at(at, [this, &planned, what, act = std::move(act)] {
    if (planned.skipped) return;
    sim_.note("FAULT " + what);
    act();
  });
}

// The faults planned from now to `span` later do not strike, nor count for the checks.
void Job::skipFaults(Duration span) {
  auto forget = [](auto& list, auto same) {
    const auto it = std::find_if(list.begin(), list.end(), same);
    if (it != list.end()) list.erase(it);
  };
  for (Planned& p : planned_) {
    if (p.skipped || p.at <= sim_.now() || p.at > sim_.now() + span) continue;
    p.skipped = true;
    sim_.note("FAULT planned at " + std::to_string(p.at.time_since_epoch().count()) +
              " ms skipped");
    forget(record_.faults, [&](Time t) { return t == p.at; });
    if (p.workers) forget(record_.workerFaults, [&](Time t) { return t == p.at; });
    forget(record_.replyLoss, [&](const auto& s) { return s.first == p.at; });
    forget(record_.storeAway, [&](const auto& s) { return s.first == p.at; });
  }
}

// SIGKILL to an agent (its node lost): its workers and the workers' store it served go with it.
void Job::killAgent(Incarnation& a) {
  a.killed = true;
  a.endedAt = sim_.now();
  sim_.killOwner(a.owner);
  store_->cutLinksOf(a.owner);
  inProcess_->agentGone(a.owner);
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
                killAgent(a);
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

// Faults aimed at moments, not times: armed from the in-process generator (Job's constructor).
void Job::planTargetedFaults() {
  if (killFirstToLeave_) inProcess_->killFirstToLeave();
  // Its aftermath kept quiet (no planned fault until past the check's 20 s): checked, not
  // masked (sim_checks.cpp's kept workers), in the few schedules it strikes in.
  if (loseSourceNode_)
    inProcess_->loseSourceNode([this](int owner) {
      const Time now = sim_.now();
      skipFaults(Duration(25'000));
      noteFault(now, true);
      sim_.note("FAULT lose " + label(owner) + "'s node");
      killAgent(incarnation(owner));
    });
}

}  // namespace dlrun::sim::detail
