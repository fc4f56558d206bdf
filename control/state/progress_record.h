// How far each rank got, as its agent publishes it for the job's one view (ARCHITECTURE.md
// section 10): one small record an agent, rewritten at most once a second while its workers
// report, so a job of 1,000 nodes costs its store well under 1% of a core. Pure: the record and
// its codec. Written by agents/control_publisher.h under ctl/prog/I (I the agent's id), read by
// the Control service (GetJob), the job's page and group rank 0's straggler watch.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::control {

struct RankProgress {
  int rank = 0;
  int64_t step = 0;
  int64_t epoch = 0;
  double stepsPerSecond = 0;  // over the last few seconds (agents/rank_rates.h)
  double sinceStep = 0;       // seconds from the rank's last new step to the record's time
  std::optional<double> loss;
  std::optional<double> accuracy;
  int64_t samples = 0;
  std::map<std::string, double> metrics;  // anything else the program reported by name
  bool exited = false;  // its worker is gone: its pace stays out of the job's median
};

struct NodeProgress {
  double time = 0;  // unix seconds when the agent wrote it
  int round = -1;
  std::vector<RankProgress> ranks;  // the ranks that reported at least once
};

std::string encode(const NodeProgress& progress);
// Throws ProtocolError naming the record for text that is not one.
NodeProgress decodeNodeProgress(std::string_view text);

// An agent rewrites its record within this many seconds of a new step: a record older than that
// means no rank of it stepped since (up to the refresh of a record that did not change).
inline constexpr double kRecordSlack = 1.5;

// Seconds since `rank` last stepped as of `now` (unix seconds), from a record written at
// `written`: its own figure, plus the time since beyond kRecordSlack. Clocks of different hosts
// only ever add, never go back past the record.
double secondsSinceStep(const RankProgress& rank, double written, double now);

}  // namespace dlrun::control
