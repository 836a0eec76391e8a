#include "diagnose/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace strata::diagnose {

double median(std::vector<double> values) {
  std::erase_if(values, [](double v) { return std::isnan(v); });
  if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
  // nth_element keeps this O(n): it runs on 100k ranks per window.
  size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(mid), values.end());
  double hi = values[mid];
  if (values.size() % 2 == 1) return hi;
  double lo = *std::max_element(values.begin(), values.begin() + static_cast<long>(mid));
  return (lo + hi) / 2;
}

double median_without(const std::vector<double>& sorted, double own) {
  size_t skip = sorted.size();
  if (!std::isnan(own)) skip = static_cast<size_t>(std::lower_bound(sorted.begin(), sorted.end(), own) - sorted.begin());
  if (skip < sorted.size() && sorted[skip] != own) skip = sorted.size();  // not among them: nothing to leave out
  const size_t m = sorted.size() - (skip < sorted.size() ? 1 : 0);
  if (m == 0) return std::numeric_limits<double>::quiet_NaN();
  auto at = [&](size_t i) { return sorted[i < skip ? i : i + 1]; };
  return m % 2 == 1 ? at(m / 2) : (at(m / 2 - 1) + at(m / 2)) / 2;
}

double robust_sigma(const std::vector<double>& values, double med) {
  std::vector<double> dev;
  dev.reserve(values.size());
  for (double v : values) {
    if (!std::isnan(v)) dev.push_back(std::fabs(v - med));
  }
  return 1.4826 * median(std::move(dev));
}

}  // namespace strata::diagnose
