#include "agents/recovery.h"

#include <fstream>

namespace dlrun::agents::recovery {

pid_t markedPid(const std::filesystem::path& dir, int localRank) {
  std::ifstream in(dir / std::to_string(localRank));
  long pid = 0;
  return in >> pid && pid > 0 ? static_cast<pid_t>(pid) : 0;
}

std::string refusal(const Failure& failure) {
  if (failure.exitCode == kFallbackCode)
    return "it asked for the whole-group restart (exit " + std::to_string(kFallbackCode) + ")";
  if (!failure.recovering.empty())
    return "a failure during the in-process recovery of local rank " +
           std::to_string(failure.recovering.front());
  if (!failure.marked) return "it had not started dlrun.recovery's loop";
  return "";
}

}  // namespace dlrun::agents::recovery
