// The one clock dlrun measures deadlines, leases and durations with: monotonic, so a
// wall-clock step (NTP, a suspended VM) never fires or stretches a timeout.
#pragma once

#include <chrono>

namespace dlrun {

using Clock = std::chrono::steady_clock;

}  // namespace dlrun
