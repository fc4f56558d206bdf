// The program's gRPC has TLS (proto/CMakeLists.txt, DLRUN_TLS).
#include "grpc_runtime.h"

namespace dlrun::proto {

bool hasTls() { return true; }

std::shared_ptr<grpc::ChannelCredentials> tlsCredentials(
    const grpc::SslCredentialsOptions& options) {
  return grpc::SslCredentials(options);
}

}  // namespace dlrun::proto
