// --metrics-file's lines: one JSON object each, every field named.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "trainer/metrics_file.h"

namespace dlrun::trainer {
namespace {

TEST(MetricsLine, AStepLineHasEveryFieldAndNoAccuracy) {
  const std::string line = metricsLine({.kind = "step",
                                        .time = 1.5,
                                        .elapsed = 0.25,
                                        .step = 100,
                                        .epoch = 1,
                                        .loss = 0.5,
                                        .samplesPerSecond = 2000,
                                        .learningRate = 0.05,
                                        .worldSize = 4,
                                        .restart = 2});
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_EQ(line,
            R"({"kind":"step","time":1.5,"elapsed":0.25,"step":100,"epoch":1,"loss":0.5,)"
            R"("accuracy":null,"samples_per_sec":2000.0,"lr":0.05,"world_size":4,"restart":2})");
}

TEST(MetricsLine, AnEpochLineCarriesTheAccuracy) {
  const auto line = nlohmann::json::parse(
      metricsLine({.kind = "epoch", .step = 469, .epoch = 2, .accuracy = 0.875}));
  EXPECT_EQ(line["accuracy"], 0.875);
  EXPECT_EQ(line["epoch"], 2);
}

}  // namespace
}  // namespace dlrun::trainer
