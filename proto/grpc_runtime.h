// What dlrun sets in the gRPC runtime before its first channel or server; see grpc_runtime.cpp.
// And which build of it the program has (proto/CMakeLists.txt): with TLS or without.
#pragma once

#include <grpcpp/security/credentials.h>

#include <memory>

namespace dlrun::proto {

// Idempotent and thread-safe: each user of gRPC calls it first.
void prepareGrpc();

// Whether this program's gRPC dials TLS: dlrun-tls's does, dlrun's does not.
bool hasTls();

// grpc::SslCredentials where hasTls(); elsewhere throws Error.
std::shared_ptr<grpc::ChannelCredentials> tlsCredentials(
    const grpc::SslCredentialsOptions& options);

}  // namespace dlrun::proto
