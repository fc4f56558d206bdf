#include "grpc_runtime.h"

#include <mutex>

#include <absl/synchronization/mutex.h>
#include <grpc/grpc.h>

namespace dlrun::proto {

void prepareGrpc() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Debian builds Abseil with its Mutex deadlock detection on (a debugging aid): a lock-order
    // graph updated at every lock, some 3% of an agent's CPU in a rendezvous of 32 agents.
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
    // One reference for the process's life: gRPC shuts itself down (joining its threads) when
    // its last object goes, and starts again (new threads) with the next; an agent's first
    // etcd connection goes before its rendezvous opens the next, which cost 8 ms each time.
    grpc_init();
  });
}

}  // namespace dlrun::proto
