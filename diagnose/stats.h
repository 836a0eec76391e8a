// Robust statistics over ranks: medians and MADs ignore unknown (NaN) values, so a rank without a
// layer never drags its peers' numbers.
#pragma once

#include <vector>

namespace strata::diagnose {

double median(std::vector<double> values);  // NaN when no known value
// Median absolute deviation scaled to a standard deviation (×1.4826); NaN when no known value.
double robust_sigma(const std::vector<double>& values, double median);

}  // namespace strata::diagnose
