// How far each rank got, as its agent publishes it for the job's one view (ARCHITECTURE.md
// section 10): one small record an agent, rewritten while its workers report at most once a
// recordPeriod(), so that the whole job writes at most kRecordsPerSecond records a second
// whatever its size, well under 1% of a core at its store. Pure: the record, its period and its
// codec. Written by agents/control_publisher.h under ctl/prog/I (I the agent's id), read by
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
  double period = 1;                // seconds between its agent's writes while its ranks step
  std::vector<RankProgress> ranks;  // the ranks that reported at least once
};

std::string encode(const NodeProgress& progress);
// Throws ProtocolError naming the record for text that is not one.
NodeProgress decodeNodeProgress(std::string_view text);

// The records a job's agents write a second at most, all together: a store spends 20 to 30 µs
// of CPU on a lone request (most of it waking up), so 200 a second cost it about 0.5% of a core
// (docs/benchmarks.md, "The job's one view").
inline constexpr double kRecordsPerSecond = 200;

// Seconds between one agent's records in a job of `agents`: 1, or more where the job is larger
// than kRecordsPerSecond agents.
double recordPeriod(int agents);

// Seconds since `rank` last stepped as of `now` (unix seconds), from a record `progress` written:
// its own figure, plus the time since beyond the record's period and half a second (a record that
// old means no rank of it stepped since, up to the refresh of a record that did not change).
// Clocks of different hosts only ever add, never go back past the record.
double secondsSinceStep(const RankProgress& rank, const NodeProgress& progress, double now);

}  // namespace dlrun::control
