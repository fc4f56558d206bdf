#include "agents/hang_watch.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dlrun::agents {

void ProgressTrack::observe(ProgressSource source, const ProgressSighting& seen,
                            Clock::time_point now) {
  uint64_t& last = markers_[static_cast<size_t>(source)];
  if (seen.marker == 0 || seen.marker == last) return;
  last = seen.marker;
  reported_ = true;
  last_ = now;
  if (seen.step) step_ = seen.step;
  inCollective_ = seen.inCollective;
}

std::string encodeRankReports(const std::vector<RankReport>& reports) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : reports) {
    nlohmann::json one{{"rank", r.rank},
                       {"node", r.node},
                       {"reported", r.reported},
                       {"stopped", r.stopped},
                       {"silent", r.silentSeconds},
                       {"frames", r.topFrames},
                       {"stack", r.stackFile}};
    if (r.step) one["step"] = *r.step;
    if (r.collective) one["collective"] = *r.collective;
    if (r.lastCollective) one["last"] = *r.lastCollective;
    out.push_back(std::move(one));
  }
  return out.dump();
}

std::vector<RankReport> decodeRankReports(std::string_view text) {
  try {
    std::vector<RankReport> out;
    for (const auto& one : nlohmann::json::parse(text)) {
      RankReport r;
      r.rank = one.at("rank").get<int>();
      r.node = one.at("node").get<std::string>();
      r.reported = one.at("reported").get<bool>();
      r.stopped = one.value("stopped", false);
      r.silentSeconds = one.at("silent").get<double>();
      r.topFrames = one.at("frames").get<std::vector<std::string>>();
      r.stackFile = one.at("stack").get<std::string>();
      if (one.contains("step")) r.step = one.at("step").get<int64_t>();
      if (one.contains("collective")) r.collective = one.at("collective").get<std::string>();
      if (one.contains("last")) r.lastCollective = one.at("last").get<std::string>();
      out.push_back(std::move(r));
    }
    return out;
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError(std::string("malformed hang report in the rendezvous store: ") + e.what());
  }
}

std::optional<size_t> suspect(const std::vector<RankReport>& reports) {
  std::optional<size_t> best;
  auto before = [](const RankReport& a, const RankReport& b) {
    if (a.stopped != b.stopped) return a.stopped;
    if (a.step && b.step && *a.step != *b.step) return *a.step < *b.step;
    if (a.collective.has_value() != b.collective.has_value()) return !a.collective.has_value();
    if (a.silentSeconds != b.silentSeconds) return a.silentSeconds > b.silentSeconds;
    return a.rank < b.rank;
  };
  for (size_t i = 0; i < reports.size(); ++i) {
    if (!reports[i].reported) continue;
    if (!best || before(reports[i], reports[*best])) best = i;
  }
  return best;
}

namespace {

std::string seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", s);
  return text;
}

std::string where(const RankReport& r) {
  std::string out = "rank " + std::to_string(r.rank) + " on " + r.node;
  out += r.step ? ", last step " + std::to_string(*r.step) : ", no step reported";
  if (r.stopped) out += ", stopped";
  out += r.reported ? ", silent " + seconds(r.silentSeconds) : ", never reported progress";
  out += r.collective ? ", waiting in " + *r.collective : ", not in a collective";
  if (r.lastCollective) out += ", last collective " + *r.lastCollective;
  return out;
}

// Lines about the other ranks: enough to see the pattern, not thousands.
constexpr size_t kOtherLines = 16;

}  // namespace

std::string hangSummary(std::vector<RankReport> reports, double timeoutSeconds, int nodesReported,
                        int nodes) {
  std::string out = "hang: no progress for " + seconds(timeoutSeconds) + " (--hang-timeout)";
  const auto pick = suspect(reports);
  std::optional<int> suspectRank;
  if (pick) {
    const RankReport& s = reports[*pick];
    suspectRank = s.rank;
    out += "\n  suspect: " + where(s);
    for (const auto& frame : s.topFrames) out += "\n    " + frame;
    if (!s.stackFile.empty()) out += "\n    stack: " + s.stackFile;
  }
  std::sort(reports.begin(), reports.end(),
            [](const RankReport& a, const RankReport& b) { return a.rank < b.rank; });
  size_t others = 0;
  for (const auto& r : reports) {
    if (r.rank == suspectRank) continue;
    if (others++ < kOtherLines) out += "\n  " + where(r);
  }
  if (others > kOtherLines) out += "\n  ... and " + std::to_string(others - kOtherLines) + " more";
  if (nodesReported < nodes)
    out += "\n  (" + std::to_string(nodes - nodesReported) + " of " + std::to_string(nodes) +
           " nodes sent no report in time)";
  return out;
}

}  // namespace dlrun::agents
