// Signal names as users read them in messages.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dlrun {

// "SIGTERM" for SIGTERM; "signal 42" for numbers without a name.
std::string signalName(int signal);

// The signal a user names: "USR1", "SIGUSR1", "sigusr1" or a number (1 to 64); nullopt for
// anything else.
std::optional<int> signalNumber(std::string_view name);

}  // namespace dlrun
