// Signal names as users read them in messages.
#pragma once

#include <string>

namespace dlrun {

// "SIGTERM" for SIGTERM; "signal 42" for numbers without a name.
std::string signalName(int signal);

}  // namespace dlrun
