#include "agent/os/histogram.h"

#include <bit>

namespace strata::agent::os {

unsigned hist_bucket(uint64_t v) {
  if (v < 4) return static_cast<unsigned>(v);
  unsigned e = static_cast<unsigned>(std::bit_width(v)) - 1;
  unsigned sub = static_cast<unsigned>(v >> (e - 2)) & 3;
  unsigned b = 4 + (e - 2) * 4 + sub;
  return b < kHistBuckets ? b : kHistBuckets - 1;
}

uint64_t hist_upper(unsigned b) {
  if (b < 4) return b + 1;
  if (b >= kHistBuckets - 1) return UINT64_MAX;  // the last bucket also holds everything larger
  unsigned e = (b - 4) / 4 + 2;
  uint64_t sub = (b - 4) % 4;
  return (5 + sub) << (e - 2);
}

HistSummary summarize(const std::vector<uint64_t>& buckets) {
  HistSummary s;
  for (uint64_t c : buckets) s.count += c;
  if (s.count == 0) return s;
  auto at = [&](double q) {
    // The smallest bucket whose cumulative count reaches q of the total.
    uint64_t need = static_cast<uint64_t>(q * static_cast<double>(s.count) + 0.999999);
    if (need == 0) need = 1;
    uint64_t cum = 0;
    for (unsigned b = 0; b < buckets.size(); ++b) {
      cum += buckets[b];
      if (cum >= need) return static_cast<double>(hist_upper(b));
    }
    return static_cast<double>(hist_upper(static_cast<unsigned>(buckets.size()) - 1));
  };
  s.p50 = at(0.50);
  s.p90 = at(0.90);
  s.p99 = at(0.99);
  for (unsigned b = static_cast<unsigned>(buckets.size()); b-- > 0;) {
    if (buckets[b]) {
      s.max = static_cast<double>(hist_upper(b));
      break;
    }
  }
  return s;
}

}  // namespace strata::agent::os
