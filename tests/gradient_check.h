// Central differences against an analytic gradient, and how far two builds' results are
// apart, for the models' tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace dlrun::testing {

struct GradientCheck {
  double worst = 0;  // the largest relative error
  size_t worstIndex = 0;
  double largest = 0;  // the largest analytic |gradient|: a flat loss would pass otherwise
};

// Over parameters [begin, end): (loss(p + step) - loss(p - step)) / 2 step against analytic[i],
// relative with a floor so near-zero gradients compare absolutely. `lossAt(i, delta)` is the
// loss with parameter i moved by delta (and put back).
template <typename LossAt>
GradientCheck checkGradient(const std::vector<float>& analytic, size_t begin, size_t end,
                            double step, double floor, LossAt lossAt) {
  GradientCheck check{.worstIndex = begin};
  for (size_t i = begin; i < end; ++i) {
    const double numeric = (lossAt(i, step) - lossAt(i, -step)) / (2 * step);
    const double error = std::abs(numeric - analytic[i]) /
                         std::max({std::abs(numeric), std::abs(double{analytic[i]}), floor});
    if (error > check.worst) {
      check.worst = error;
      check.worstIndex = i;
    }
    check.largest = std::max(check.largest, std::abs(double{analytic[i]}));
  }
  return check;
}

// The largest |a[i] - b[i]| over the largest |a[i]|: float rounding when it is ~1e-6.
inline double relativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  double difference = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference = std::max(difference, double{std::abs(a[i] - b[i])});
    scale = std::max(scale, double{std::abs(a[i])});
  }
  return difference / scale;
}

}  // namespace dlrun::testing
