// What a store server has served (StoreStats), as Prometheus metrics and as the
// page's JSON. Pure.
#pragma once

#include <string>

#include "metrics/exposition.h"
#include "store/store_server.h"

namespace dlrun::metrics {

// dlrun_store_*: connections (accepted, open, refused, rejected), requests by op, bytes each way,
// keys, waiters.
void addStoreMetrics(Exposition& out, const StoreStats& stats);

// {"connections":N,"open":N,"refused":N,"requests":N,"bytes_in":N,"bytes_out":N,"keys":N,
//  "waiters":N,"ops":{"SET":N,...}} (ops served at least once).
std::string storeJson(const StoreStats& stats);

}  // namespace dlrun::metrics
