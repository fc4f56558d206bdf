// What dlrun sets in the gRPC runtime before its first channel or server; see grpc_runtime.cpp.
#pragma once

namespace dlrun::proto {

// Idempotent and thread-safe: each user of gRPC calls it first.
void prepareGrpc();

}  // namespace dlrun::proto
