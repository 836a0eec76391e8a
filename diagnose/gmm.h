// A small Gaussian mixture with diagonal covariances, fitted by EM: the model eACGM fits over
// per-process metric vectors, used here by the second opinion over time (second_opinion.cpp).
// Pure functions, deterministic for their input: seeding is k-means++ driven by a fixed seed, so
// the same points always give the same mixture.
#pragma once

#include <cstddef>
#include <vector>

namespace strata::diagnose::gmm {

// Points, one row each, all of the same dimension. Callers normalise the axes first: the
// variance floor below is in the points' own units.
using Points = std::vector<std::vector<double>>;

struct Mixture {
  size_t dims = 0;
  std::vector<double> weight;             // per component, sums to 1
  std::vector<std::vector<double>> mean;  // per component, per axis
  std::vector<std::vector<double>> var;   // per component, per axis (diagonal covariance)
  // Per component: log weight - 1/2 sum log(2 pi var), kept with the parameters so a point's
  // density costs no logarithm.
  std::vector<double> log_norm;
  double log_likelihood = 0;              // of the points it was fitted on
  double bic = 0;                         // -2 log L + parameters * ln(points): lower is better
  size_t iterations = 0;
  size_t k() const { return weight.size(); }
};

// A component's variance never falls below this (in the normalised units the points come in,
// where the data's robust spread is about 1): a component over identical points (a constant
// metric, a timer's resolution) would otherwise shrink to zero width and an unbounded likelihood,
// and win every model choice.
inline constexpr double kVarianceFloor = 1e-2;
// EM stops when one iteration improves the mean log-likelihood per point by less than this: the
// mixture no longer moves in any way a report could show.
inline constexpr double kTolerance = 1e-6;
// And after this many iterations whatever happens: well-separated data converge in tens.
inline constexpr size_t kMaxIterations = 300;
// The largest k model choice tries: a baseline, a change and one more population (the ranks
// waiting for a changed one) are what a window holds; more components fit noise.
inline constexpr size_t kMaxComponents = 3;
// Seeding restarts per k (seeds kSeed, kSeed+1, ...): EM finds a local optimum, the best of a
// few k-means++ starts is the one kept.
inline constexpr unsigned kSeed = 20261201;
inline constexpr size_t kRestarts = 4;

// Fits k components (1 <= k <= points). Empty points or k == 0 give an empty mixture.
Mixture fit(const Points& x, size_t k);

// Fits k = 1..max_k and keeps the lowest BIC (ties: the smaller k). k is capped by the number of
// points.
Mixture fit_best(const Points& x, size_t max_k = kMaxComponents);

// log p(x | component c) + log weight_c.
double log_joint(const Mixture& m, size_t c, const std::vector<double>& x);
// The component most likely to have produced x.
size_t assign(const Mixture& m, const std::vector<double>& x);

}  // namespace strata::diagnose::gmm
