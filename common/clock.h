// The one clock dlrun measures deadlines, leases and durations with: monotonic, so a
// wall-clock step (NTP, a suspended VM) never fires or stretches a timeout.
#pragma once

#include <chrono>

namespace dlrun {

using Clock = std::chrono::steady_clock;

// Seconds since the Unix epoch on the wall clock: for times users read or other machines compare
// (records, events, metrics, torch's timer expirations), never for a deadline.
inline double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace dlrun
