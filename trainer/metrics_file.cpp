#include "trainer/metrics_file.h"

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dlrun::trainer {

std::string metricsLine(const MetricsRecord& r) {
  nlohmann::ordered_json line = {{"kind", r.kind},       {"time", r.time},
                                 {"elapsed", r.elapsed}, {"step", r.step},
                                 {"epoch", r.epoch},     {"loss", r.loss},
                                 {"accuracy", nullptr},  {"samples_per_sec", r.samplesPerSecond},
                                 {"lr", r.learningRate}, {"world_size", r.worldSize},
                                 {"restart", r.restart}};
  if (r.accuracy) line["accuracy"] = *r.accuracy;
  return line.dump();
}

MetricsFile::MetricsFile(const std::string& path) : path_(path), out_(path, std::ios::app) {
  if (!out_)
    throw ConfigError("--metrics-file " + path +
                      ": cannot open for writing: " + std::strerror(errno));
}

void MetricsFile::write(const MetricsRecord& record) {
  out_ << metricsLine(record) << '\n';
  out_.flush();
  if (!out_) throw Error("--metrics-file " + path_ + ": cannot write: " + std::strerror(errno));
}

}  // namespace dlrun::trainer
