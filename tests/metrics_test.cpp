// The pure parts of --metrics-port: Prometheus's text format and the store's metrics.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "metrics/exposition.h"
#include "metrics/store_metrics.h"

namespace dlrun::metrics {
namespace {

TEST(Exposition, FamiliesAndSamplesWithEscapedLabels) {
  Exposition out;
  out.family("dlrun_x_total", "counter", "Things\nand \\ more");
  out.sample("dlrun_x_total", {{"node", "a\"b\\c\nd"}, {"op", "SET"}}, 3);
  out.sample("dlrun_x_total", 0.5);
  EXPECT_EQ(out.text(),
            "# HELP dlrun_x_total Things\\nand \\\\ more\n"
            "# TYPE dlrun_x_total counter\n"
            "dlrun_x_total{node=\"a\\\"b\\\\c\\nd\",op=\"SET\"} 3\n"
            "dlrun_x_total 0.5\n");
}

TEST(Exposition, ValuesAreExactAndShort) {
  EXPECT_EQ(formatValue(0), "0");
  EXPECT_EQ(formatValue(1234567890123), "1234567890123");
  EXPECT_EQ(formatValue(0.005), "0.005");
  EXPECT_EQ(formatValue(-2.5), "-2.5");
  EXPECT_EQ(formatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(formatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(formatValue(std::nan("")), "NaN");
  EXPECT_EQ(std::stod(formatValue(0.1 + 0.2)), 0.1 + 0.2);
}

TEST(Exposition, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1});
  h.observe(0.05);
  h.observe(0.1);  // on a bound: counted in it (le)
  h.observe(0.5);
  h.observe(7);
  Exposition out;
  out.histogram("dlrun_s_seconds", "S", h);
  EXPECT_EQ(out.text(),
            "# HELP dlrun_s_seconds S\n# TYPE dlrun_s_seconds histogram\n"
            "dlrun_s_seconds_bucket{le=\"0.1\"} 2\n"
            "dlrun_s_seconds_bucket{le=\"1\"} 3\n"
            "dlrun_s_seconds_bucket{le=\"+Inf\"} 4\n"
            "dlrun_s_seconds_sum 7.65\n"
            "dlrun_s_seconds_count 4\n");
}

TEST(StoreMetrics, EveryCountUnderItsNameAndOnlyOpsServed) {
  StoreStats stats{.connections = 5,
                   .foreign = 1,
                   .open = 2,
                   .refused = 1,
                   .bytesIn = 100,
                   .bytesOut = 40,
                   .keys = 7,
                   .waiters = 3};
  stats.ops[static_cast<size_t>(wire::Op::Set)] = 9;
  Exposition out;
  addStoreMetrics(out, stats);
  const std::string& text = out.text();
  for (const char* line :
       {"dlrun_store_connections_total 5\n", "dlrun_store_control_connections_total 1\n",
        "dlrun_store_connections 2\n", "dlrun_store_refused_connections_total 1\n",
        "dlrun_store_requests_total{op=\"SET\"} 9\n", "dlrun_store_received_bytes_total 100\n",
        "dlrun_store_sent_bytes_total 40\n", "dlrun_store_keys 7\n", "dlrun_store_waiters 3\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << " in\n" << text;
  EXPECT_EQ(text.find("op=\"GET\""), std::string::npos);
  EXPECT_EQ(storeJson(stats),
            R"({"bytes_in":100,"bytes_out":40,"connections":5,"keys":7,"open":2,)"
            R"("ops":{"SET":9},"refused":1,"rejected":0,"requests":9,"waiters":3})");
}

}  // namespace
}  // namespace dlrun::metrics
