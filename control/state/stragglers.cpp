#include "control/state/stragglers.h"

#include <algorithm>
#include <cstdio>

#include "store/json_fields.h"

namespace dlrun::control {

using json_fields::field;
using json_fields::json;
using json_fields::parse;

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  return (*std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid)) +
          upper) /
         2;
}

StragglerChanges StragglerTracker::observe(const std::vector<RankRate>& ranks, double now) {
  StragglerChanges changes;
  std::vector<double> rates;
  for (const auto& r : ranks)
    if (r.stepsPerSecond >= 0) rates.push_back(r.stepsPerSecond);
  const double middle = median(rates);
  // Two known rates at least, and a job that moves: a job stalled as a whole is a hang's
  // business (--hang-timeout), not a straggler's.
  const bool judged = rule_.fraction > 0 && rates.size() >= 2 && middle > 0;
  if (!judged) {
    // No median to judge by (the other ranks finished, or none moves): who was named stays
    // named while it runs; time below starts again once there is a median.
    below_.clear();
    for (auto it = named_.begin(); it != named_.end();) {
      const bool present = std::any_of(ranks.begin(), ranks.end(),
                                       [&](const RankRate& r) { return r.rank == it->first; });
      if (present) {
        ++it;
        continue;
      }
      Straggler gone = it->second;
      gone.stepsPerSecond = -1;
      changes.cleared.push_back(gone);
      it = named_.erase(it);
    }
    return changes;
  }
  std::map<int, double> below;
  std::map<int, Straggler> named;
  for (const auto& r : ranks) {
    if (!judged || r.stepsPerSecond < 0 || r.stepsPerSecond >= rule_.fraction * middle) continue;
    auto was = below_.find(r.rank);
    const double since = was == below_.end() ? now : was->second;
    below[r.rank] = since;
    if (now - since < rule_.window) continue;
    Straggler s{.rank = r.rank,
                .node = r.node,
                .stepsPerSecond = r.stepsPerSecond,
                .median = middle,
                .below = since};
    if (!named_.contains(r.rank)) changes.named.push_back(s);
    named[r.rank] = s;
  }
  for (const auto& [rank, s] : named_) {
    if (named.contains(rank)) continue;
    Straggler cleared = s;
    cleared.stepsPerSecond = -1;  // gone, unless it is still there
    for (const auto& r : ranks)
      if (r.rank == rank) cleared.stepsPerSecond = r.stepsPerSecond;
    cleared.median = middle;
    changes.cleared.push_back(cleared);
  }
  below_ = std::move(below);
  named_ = std::move(named);
  return changes;
}

void StragglerTracker::reset() {
  below_.clear();
  named_.clear();
}

std::string describe(const Straggler& s, double now) {
  char text[256];
  std::snprintf(text, sizeof(text),
                "rank %d on %s at %.2f steps/s, %.2f of the median %.2f, for %.0f s", s.rank,
                s.node.empty() ? "?" : s.node.c_str(), s.stepsPerSecond,
                s.median > 0 ? s.stepsPerSecond / s.median : 0.0, s.median, now - s.below);
  return text;
}

std::string encodeStragglers(const std::map<int, Straggler>& named) {
  json list = json::array();
  for (const auto& [rank, s] : named)
    list.push_back({{"rank", s.rank},
                    {"node", s.node},
                    {"rate", s.stepsPerSecond},
                    {"median", s.median},
                    {"below", s.below}});
  return json{{"stragglers", list}}.dump();
}

std::vector<Straggler> decodeStragglers(std::string_view text) {
  static constexpr const char* what = "straggler list";
  const json j = parse(text, what);
  std::vector<Straggler> out;
  for (const auto& s : field<json>(j, "stragglers", what)) {
    if (!s.is_object()) throw ProtocolError("straggler list has a malformed entry");
    out.push_back({.rank = field<int>(s, "rank", what),
                   .node = field<std::string>(s, "node", what),
                   .stepsPerSecond = field<double>(s, "rate", what),
                   .median = field<double>(s, "median", what),
                   .below = field<double>(s, "below", what)});
  }
  return out;
}

}  // namespace dlrun::control
