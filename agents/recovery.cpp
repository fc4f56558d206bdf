#include "agents/recovery.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "store/store.h"

namespace dlrun::agents::recovery {

std::optional<Mark> parseMark(const std::string& text) {
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  try {
    Mark mark;
    mark.pid = j.at("pid").get<pid_t>();
    if (mark.pid <= 0) return std::nullopt;
    mark.generation = j.value("generation", 0);
    mark.at = j.value("at", 0.0);
    mark.done = j.value("done", false);
    mark.recovering = j.value("recovering", false);
    mark.stepSeconds = j.value("step_s", 0.0);
    if (const auto phases = j.find("phases"); phases != j.end() && phases->is_object())
      for (const auto& [name, seconds] : phases->items())
        if (seconds.is_number()) mark.phases[name] = seconds.get<double>();
    return mark;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::optional<Mark> readMark(const std::filesystem::path& dir, int localRank) {
  std::ifstream in(dir / std::to_string(localRank));
  if (!in) return std::nullopt;
  return parseMark(std::string(std::istreambuf_iterator<char>(in), {}));
}

pid_t markedPid(const std::filesystem::path& dir, int localRank) {
  const auto mark = readMark(dir, localRank);
  return mark ? mark->pid : 0;
}

std::string refusal(const Failure& failure) {
  if (failure.exitCode == kFallbackCode)
    return "it asked for the whole-group restart (exit " + std::to_string(kFallbackCode) + ")";
  const bool askedToBeReplaced = failure.exitCode == kReplaceCode && failure.recoveringItself;
  if (!failure.recovering.empty() && !askedToBeReplaced)
    return "a failure during the in-process recovery of local rank " +
           std::to_string(failure.recovering.front());
  if (!failure.marked) return "it had not started dlrun.recovery's loop";
  if (failure.recoveringItself && !askedToBeReplaced)
    return "it failed during its own in-process recovery";
  if (failure.done) return "it had left dlrun.recovery's loop";
  return "";
}

std::chrono::milliseconds keepGrace(double slowestStep) {
  // A marked time is the worker's word: one past an hour counts as an hour; none that is a
  // time (negative, not a number) as none.
  const double step = slowestStep > 0 ? std::min(slowestStep, 3600.0) : 0;
  return std::chrono::milliseconds(2'000 + static_cast<int64_t>(3'000 * step));
}

std::string describeRecovery(int rank, const Mark& mark, double startedAt) {
  auto phase = [&](const char* name) {
    const auto it = mark.phases.find(name);
    return it == mark.phases.end() ? 0.0 : it->second;
  };
  const double total = phase("total");
  char line[256];
  std::snprintf(line, sizeof line,
                "rank %d recovered in process, generation %d: start %.2f s, re-form %.2f s, "
                "state %.2f s; %.2f s after its failure",
                rank, mark.generation, mark.at - total - startedAt, phase("meet") + phase("group"),
                phase("state"), mark.at - startedAt);
  return line;
}

std::vector<std::pair<std::string, std::string>> moving(int generation, int round, int oldBaseRank,
                                                        int newBaseRank, int count, int worldSize) {
  const std::string keys = "/dlrun/recovery/" + std::to_string(generation) + "/";
  std::vector<std::pair<std::string, std::string>> out{
      {keys + "round" + std::to_string(round) + "/world", std::to_string(worldSize)}};
  for (int i = 0; i < count; ++i)
    out.emplace_back(moveKey(generation, oldBaseRank + i),
                     std::to_string(round * kMoveBase + newBaseRank + i + 1));
  return out;
}

void tellNews(Store& store, const std::string& news) {
  store.set(news + "/" + std::to_string(store.add(news, 1)), "1");
}

}  // namespace dlrun::agents::recovery
