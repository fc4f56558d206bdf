#include "control/state/progress_record.h"

#include <algorithm>
#include <cmath>

#include "store/json_fields.h"

namespace dlrun::control {

using json_fields::field;
using json_fields::json;
using json_fields::parse;

namespace {

constexpr const char* kWhat = "progress record";

// JSON has no NaN or infinity: a loss that diverged is sent as null (none).
json number(const std::optional<double>& value) {
  return value && std::isfinite(*value) ? json(*value) : json(nullptr);
}

std::optional<double> optionalNumber(const json& object, const char* name) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) throw ProtocolError(std::string(kWhat) + " has a malformed '" + name + "'");
  return it->get<double>();
}

}  // namespace

// Short names: the record is written every second by every agent of the job.
std::string encode(const NodeProgress& progress) {
  json ranks = json::array();
  for (const auto& r : progress.ranks) {
    json rank{{"r", r.rank},
              {"s", r.step},
              {"e", r.epoch},
              {"v", r.stepsPerSecond},
              {"a", r.sinceStep},
              {"l", number(r.loss)},
              {"c", number(r.accuracy)},
              {"n", r.samples}};
    if (r.exited) rank["x"] = 1;
    if (!r.metrics.empty()) {
      json metrics = json::object();
      for (const auto& [name, value] : r.metrics)
        if (std::isfinite(value)) metrics[name] = value;
      rank["m"] = std::move(metrics);
    }
    ranks.push_back(std::move(rank));
  }
  return json{
      {"t", progress.time}, {"round", progress.round}, {"p", progress.period}, {"ranks", ranks}}
      .dump();
}

NodeProgress decodeNodeProgress(std::string_view text) {
  const json j = parse(text, kWhat);
  NodeProgress out{.time = field<double>(j, "t", kWhat),
                   .round = field<int>(j, "round", kWhat),
                   .period = field<double>(j, "p", kWhat)};
  for (const auto& r : field<json>(j, "ranks", kWhat)) {
    if (!r.is_object()) throw ProtocolError(std::string(kWhat) + " has a malformed 'ranks'");
    RankProgress rank{.rank = field<int>(r, "r", kWhat),
                      .step = field<int64_t>(r, "s", kWhat),
                      .epoch = field<int64_t>(r, "e", kWhat),
                      .stepsPerSecond = field<double>(r, "v", kWhat),
                      .sinceStep = field<double>(r, "a", kWhat),
                      .loss = optionalNumber(r, "l"),
                      .accuracy = optionalNumber(r, "c"),
                      .samples = field<int64_t>(r, "n", kWhat)};
    rank.exited = r.contains("x");
    if (auto m = r.find("m"); m != r.end()) {
      if (!m->is_object()) throw ProtocolError(std::string(kWhat) + " has a malformed 'm'");
      for (const auto& [name, value] : m->items())
        if (value.is_number()) rank.metrics[name] = value.get<double>();
    }
    out.ranks.push_back(std::move(rank));
  }
  return out;
}

double recordPeriod(int agents) { return std::max(1.0, agents / kRecordsPerSecond); }

double secondsSinceStep(const RankProgress& rank, const NodeProgress& progress, double now) {
  return rank.sinceStep + std::max(0.0, now - progress.time - progress.period - 0.5);
}

}  // namespace dlrun::control
