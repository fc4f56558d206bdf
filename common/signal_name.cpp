#include "common/signal_name.h"

#include <string.h>

#include <algorithm>
#include <cctype>
#include <charconv>

namespace dlrun {

std::string signalName(int signal) {
  const char* abbrev = ::sigabbrev_np(signal);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(signal);
}

std::optional<int> signalNumber(std::string_view name) {
  int number = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), number);
  if (!name.empty() && ec == std::errc() && end == name.data() + name.size())
    return number >= 1 && number <= 64 ? std::optional(number) : std::nullopt;
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (upper.starts_with("SIG")) upper.erase(0, 3);
  for (int signal = 1; signal <= 64; ++signal) {
    const char* abbrev = ::sigabbrev_np(signal);
    if (abbrev && upper == abbrev) return signal;
  }
  return std::nullopt;
}

}  // namespace dlrun
