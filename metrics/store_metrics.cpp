#include "metrics/store_metrics.h"

#include <nlohmann/json.hpp>

namespace dlrun::metrics {

void addStoreMetrics(Exposition& out, const StoreStats& stats) {
  const auto count = [](uint64_t n) { return static_cast<double>(n); };
  out.family("dlrun_store_connections_total", "counter", "Store connections accepted");
  out.sample("dlrun_store_connections_total", count(stats.connections));
  out.family("dlrun_store_control_connections_total", "counter",
             "Of those, connections handed to the gRPC control plane");
  out.sample("dlrun_store_control_connections_total", count(stats.foreign));
  out.family("dlrun_store_connections", "gauge", "Store connections open");
  out.sample("dlrun_store_connections", count(stats.open));
  out.family("dlrun_store_refused_connections_total", "counter",
             "Connections closed for breaking the protocol or a limit");
  out.sample("dlrun_store_refused_connections_total", count(stats.refused));
  out.family("dlrun_store_rejected_connections_total", "counter",
             "Connections closed unread: the peer is not among the job's hosts or allowed "
             "networks");
  out.sample("dlrun_store_rejected_connections_total", count(stats.rejected));
  out.family("dlrun_store_requests_total", "counter", "Store requests served, by operation");
  for (size_t op = 0; op < stats.ops.size(); ++op) {
    if (stats.ops[op] == 0) continue;  // an op never served is no series yet
    out.sample("dlrun_store_requests_total",
               {{"op", std::string(wire::opName(static_cast<wire::Op>(op)))}},
               count(stats.ops[op]));
  }
  out.family("dlrun_store_received_bytes_total", "counter", "Bytes read from store clients");
  out.sample("dlrun_store_received_bytes_total", count(stats.bytesIn));
  out.family("dlrun_store_sent_bytes_total", "counter", "Bytes written to store clients");
  out.sample("dlrun_store_sent_bytes_total", count(stats.bytesOut));
  out.family("dlrun_store_keys", "gauge", "Keys held by the store");
  out.sample("dlrun_store_keys", count(stats.keys));
  out.family("dlrun_store_waiters", "gauge", "WAIT requests not yet answered");
  out.sample("dlrun_store_waiters", count(stats.waiters));
}

std::string storeJson(const StoreStats& stats) {
  nlohmann::json ops = nlohmann::json::object();
  for (size_t op = 0; op < stats.ops.size(); ++op)
    if (stats.ops[op]) ops[std::string(wire::opName(static_cast<wire::Op>(op)))] = stats.ops[op];
  return nlohmann::json{{"connections", stats.connections}, {"open", stats.open},
                        {"refused", stats.refused},         {"rejected", stats.rejected},
                        {"requests", stats.requests()},     {"bytes_in", stats.bytesIn},
                        {"bytes_out", stats.bytesOut},      {"keys", stats.keys},
                        {"waiters", stats.waiters},         {"ops", ops}}
      .dump();
}

}  // namespace dlrun::metrics
