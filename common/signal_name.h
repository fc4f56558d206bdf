// Signal names as users read them in messages, and as they write them.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dlrun {

// "SIGTERM" for SIGTERM; "signal 42" for numbers without a name.
std::string signalName(int signal);

// The signal `text` names: "USR1", "SIGUSR1", "sigusr1" or a number from 1 to SIGRTMAX;
// nullopt for anything else.
std::optional<int> parseSignal(std::string_view text);

}  // namespace dlrun
