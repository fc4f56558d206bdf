#include "rendezvous/etcd/etcd_call.h"

#include "common/error.h"

namespace dlrun::rendezvous::etcd::detail {

std::chrono::system_clock::time_point grpcDeadline(Clock::time_point deadline) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(deadline - Clock::now());
}

std::string seconds(std::chrono::milliseconds duration) {
  const auto ms = duration.count();
  return ms % 1000 == 0 ? std::to_string(ms / 1000) + " s" : std::to_string(ms) + " ms";
}

namespace {

const char* codeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "ERROR";
  }
}

}  // namespace

std::string oneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

std::string statusText(const grpc::Status& status) {
  std::string text = codeName(status.error_code());
  if (!status.error_message().empty()) text += ": " + oneLine(status.error_message());
  return text;
}

[[noreturn]] void throwStatus(const grpc::Status& status, const std::string& message) {
  const std::string text = message + ": " + statusText(status);
  switch (status.error_code()) {
    case grpc::StatusCode::DEADLINE_EXCEEDED: throw TimeoutError(text);
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED: throw NetworkError(text);
    default: throw Error(text);
  }
}

KeyValue fromProto(const mvccpb::KeyValue& kv) {
  return {.key = kv.key(),
          .value = kv.value(),
          .createRevision = kv.create_revision(),
          .modRevision = kv.mod_revision(),
          .version = kv.version(),
          .lease = kv.lease()};
}

std::string quoted(const std::string& key) { return "'" + oneLine(key) + "'"; }

bool permanent(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::OUT_OF_RANGE: return true;
    default: return false;
  }
}

}  // namespace dlrun::rendezvous::etcd::detail
