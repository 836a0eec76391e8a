// Robust statistics over ranks: medians and MADs ignore unknown (NaN) values, so a rank without a
// layer never drags its peers' numbers.
#pragma once

#include <vector>

namespace strata::diagnose {

double median(std::vector<double> values);  // NaN when no known value
// Median absolute deviation scaled to a standard deviation (×1.4826); NaN when no known value.
double robust_sigma(const std::vector<double>& values, double median);
// The median of `sorted` (ascending, known values) without one instance of `own` (when known: it
// is among them); NaN when nothing is left. The median of every other rank's value, for each rank,
// from one sorted column: a list of peers built for each rank is O(n^2) (about 15% of a
// collector's round at 8,000 ranks, where the hardware rules did that).
double median_without(const std::vector<double>& sorted, double own);

}  // namespace strata::diagnose
