// --metrics-file: the run's numbers for the record, one JSON object a line (JSON Lines), which
// scripts/plot_metrics.py turns into curves. Rank 0 writes a line at each progress line
// (--progress-every steps) and at each epoch's end; a restarted run appends to the same file,
// its lines carrying the new restart count.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

namespace dlrun::trainer {

struct MetricsRecord {
  std::string kind;                // "step" or "epoch"
  double time = 0;                 // unix seconds
  double elapsed = 0;              // seconds since this run's training started
  int64_t step = 0;                // global steps so far
  int epoch = 0;                   // 1-based
  double loss = 0;                 // step: that step's; epoch: the epoch's mean training loss
  std::optional<double> accuracy;  // test accuracy, measured at an epoch's end
  double samplesPerSecond = 0;     // every rank's together, since the line before
  double learningRate = 0;
  int worldSize = 1;
  int restart = 0;  // TORCHELASTIC_RESTART_COUNT
};

// {"kind":..,"time":..,"elapsed":..,"step":..,"epoch":..,"loss":..,"accuracy":..,
//  "samples_per_sec":..,"lr":..,"world_size":..,"restart":..}; accuracy null on step lines.
std::string metricsLine(const MetricsRecord& record);

class MetricsFile {
 public:
  // Opens `path` for appending; throws ConfigError naming --metrics-file when it cannot.
  explicit MetricsFile(const std::string& path);
  void write(const MetricsRecord& record);  // one line, flushed: a killed run keeps its lines

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace dlrun::trainer
