// Signal names as users read them in messages, and as they write them.
#pragma once

#include <csignal>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun {

// The signals that stop a job unless --signals-to-handle says otherwise (torchrun's).
inline const std::vector<int> kDefaultStopSignals{SIGTERM, SIGINT, SIGHUP, SIGQUIT};

// The signals a dlrun process running a job catches: those that stop it (`stops`), the
// default ones left out of them (ignored rather than left to kill dlrun), and SIGUSR1/SIGUSR2
// (forwarded to the workers).
std::set<int> jobSignals(const std::vector<int>& stops);

// "SIGTERM" for SIGTERM; "signal 42" for numbers without a name.
std::string signalName(int signal);

// The signal `text` names: "USR1", "SIGUSR1", "sigusr1" or a number from 1 to SIGRTMAX;
// nullopt for anything else.
std::optional<int> parseSignal(std::string_view text);

}  // namespace dlrun
