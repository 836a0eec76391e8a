// The user side of the OS layer's log-linear histograms (bpf/strata_hist.bpf.h): bucket bounds and
// percentiles. Values below 4 have a bucket each; above, each power of two is split in 4, so a
// percentile read here is within 25% of the truth (it reports the bucket's upper bound).
#pragma once

#include <cstdint>
#include <vector>

namespace strata::agent::os {

inline constexpr unsigned kHistBuckets = 128;  // STRATA_HIST_BUCKETS

// The bucket a value falls in, as the kernel side computes it.
unsigned hist_bucket(uint64_t value);
// The smallest value above the bucket (its exclusive upper bound); UINT64_MAX for the last one.
uint64_t hist_upper(unsigned bucket);

struct HistSummary {
  uint64_t count = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0;  // bucket upper bounds; 0 when count is 0
};

// Percentiles of a bucket-count array (any length up to kHistBuckets).
HistSummary summarize(const std::vector<uint64_t>& buckets);

}  // namespace strata::agent::os
