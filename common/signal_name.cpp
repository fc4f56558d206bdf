#include "common/signal_name.h"

#include <signal.h>
#include <string.h>

#include <algorithm>
#include <cctype>

#include "common/text.h"

namespace dlrun {

std::string signalName(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

std::set<int> jobSignals(const std::vector<int>& stops) {
  std::set<int> signals{SIGUSR1, SIGUSR2};
  signals.insert(kDefaultStopSignals.begin(), kDefaultStopSignals.end());
  signals.insert(stops.begin(), stops.end());
  return signals;
}

std::optional<int> parseSignal(std::string_view text) {
  if (const auto number = parseInteger<int>(text))
    return *number >= 1 && *number <= SIGRTMAX ? number : std::nullopt;
  std::string name(text);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (name.starts_with("SIG")) name.erase(0, 3);
  for (int signal = 1; signal <= SIGRTMAX; ++signal) {
    const char* abbrev = ::sigabbrev_np(signal);
    if (abbrev && !name.empty() && name == abbrev) return signal;
  }
  return std::nullopt;
}

}  // namespace dlrun
