// One schedule of the rendezvous simulation: a job of K agents (the production
// ElasticRendezvous, each driven as dlrun's agent drives it) against the simulated store, with
// the job's shape, the agents' arrivals, their workers' outcomes and the faults all drawn from
// one seed; then the invariants every schedule must keep (sim_checks.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlrun::sim {

struct Verdict {
  bool ok = true;
  std::string violation;           // the first invariant broken, in one line
  std::string summary;             // the schedule's shape and how it ended, in one line
  uint64_t digest = 0;             // of every step: equal digests, the same schedule
  std::vector<std::string> trace;  // every step, when kept
};

Verdict runSchedule(uint64_t seed, bool keepTrace);

}  // namespace dlrun::sim
