// The program's gRPC has no TLS (proto/CMakeLists.txt, DLRUN_TLS): it never loads OpenSSL.
#include "common/error.h"
#include "grpc_runtime.h"

namespace dlrun::proto {

bool hasTls() { return false; }

std::shared_ptr<grpc::ChannelCredentials> tlsCredentials(const grpc::SslCredentialsOptions&) {
  throw Error("this program's gRPC has no TLS: dlrun-tls dials etcd over TLS");
}

}  // namespace dlrun::proto
