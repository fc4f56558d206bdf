#include "metrics/exposition.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace dlrun::metrics {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

std::string formatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char text[32];
  // Counts stay exact up to 2^53; everything else in the fewest digits that read back the same
  // (0.005, not 0.0050000000000000001).
  if (value == std::floor(value) && std::fabs(value) < 9.007199254740992e15) {
    std::snprintf(text, sizeof(text), "%.0f", value);
    return text;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

std::string escapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

namespace {
// HELP text escapes only backslash and newline.
std::string escapeHelp(std::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}
}  // namespace

void Exposition::family(std::string_view name, std::string_view type, std::string_view help) {
  text_ += "# HELP ";
  text_ += name;
  text_ += ' ';
  text_ += escapeHelp(help);
  text_ += "\n# TYPE ";
  text_ += name;
  text_ += ' ';
  text_ += type;
  text_ += '\n';
}

void Exposition::sample(std::string_view name, const Labels& labels, double value) {
  text_ += name;
  if (!labels.empty()) {
    text_ += '{';
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) text_ += ',';
      text_ += labels[i].first;
      text_ += "=\"";
      text_ += escapeLabelValue(labels[i].second);
      text_ += '"';
    }
    text_ += '}';
  }
  text_ += ' ';
  text_ += formatValue(value);
  text_ += '\n';
}

void Exposition::histogram(std::string_view name, std::string_view help,
                           const Histogram& histogram) {
  family(name, "histogram", help);
  const std::string bucket = std::string(name) + "_bucket";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < histogram.bounds().size(); ++i) {
    cumulative += histogram.counts()[i];
    sample(bucket, {{"le", formatValue(histogram.bounds()[i])}}, static_cast<double>(cumulative));
  }
  sample(bucket, {{"le", "+Inf"}}, static_cast<double>(histogram.count()));
  sample(std::string(name) + "_sum", histogram.sum());
  sample(std::string(name) + "_count", static_cast<double>(histogram.count()));
}

}  // namespace dlrun::metrics
