// Prometheus's text exposition format (0.0.4): families with HELP and TYPE, samples with
// labels, histograms with cumulative buckets. Pure: the callers own their counts and write
// them out here when scraped, so a count costs nothing between scrapes. Written here rather than
// through prometheus-cpp, whose registry would keep a second copy of counts dlrun already keeps
// and whose exposer runs an HTTP server with threads of its own.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dlrun::metrics {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Buckets by upper bound (seconds, bytes, ...); counts are kept per bucket and made cumulative
// when written.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);  // O(log buckets)
  const std::vector<double>& bounds() const { return bounds_; }
  const std::vector<uint64_t>& counts() const { return counts_; }  // last one: above every bound
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Exposition {
 public:
  // Starts a family; `type` is counter, gauge or histogram. Its samples follow.
  void family(std::string_view name, std::string_view type, std::string_view help);
  void sample(std::string_view name, const Labels& labels, double value);
  void sample(std::string_view name, double value) { sample(name, {}, value); }
  // A whole histogram family: NAME_bucket{le=...}, NAME_sum, NAME_count.
  void histogram(std::string_view name, std::string_view help, const Histogram& histogram);

  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// A sample value as the format wants it: integers exactly, +Inf, -Inf, NaN.
std::string formatValue(double value);
// A label value with backslash, double quote and newline escaped.
std::string escapeLabelValue(std::string_view value);

// The Content-Type of the text format.
inline constexpr std::string_view kContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace dlrun::metrics
