#include "grpc_runtime.h"

#include <mutex>

#include <absl/synchronization/mutex.h>

namespace dlrun::proto {

void prepareGrpc() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Debian builds Abseil with its Mutex deadlock detection on (a debugging aid): a lock-order
    // graph updated at every lock, some 3% of an agent's CPU in a rendezvous of 32 agents.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
}

}  // namespace dlrun::proto
