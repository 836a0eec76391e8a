#include "diagnose/gmm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>
#include <random>

namespace strata::diagnose::gmm {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// Lloyd iterations that tidy the k-means++ seeds before EM: enough to move a seed from a cluster's
// edge to its middle; EM does the rest.
constexpr size_t kLloydIterations = 10;

double sq_dist(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t j = 0; j < a.size(); ++j) s += (a[j] - b[j]) * (a[j] - b[j]);
  return s;
}

// The per-component constants of the density, after the parameters changed.
void prepare(Mixture& m) {
  m.log_norm.assign(m.k(), kNegInf);
  for (size_t c = 0; c < m.k(); ++c) {
    if (m.weight[c] <= 0) continue;  // a component no point wants: density 0
    double s = std::log(m.weight[c]);
    for (size_t j = 0; j < m.dims; ++j) s -= 0.5 * std::log(2 * std::numbers::pi * m.var[c][j]);
    m.log_norm[c] = s;
  }
}

// A uniform double in [0, 1) from the generator's raw output: std::uniform_real_distribution
// differs between standard libraries, this does not.
double uniform(std::mt19937& rng) { return static_cast<double>(rng()) / 4294967296.0; }

// k-means++: the first centre a random point, each next one a point drawn with probability
// proportional to its squared distance from the nearest centre so far.
std::vector<std::vector<double>> kmeanspp(const Points& x, size_t k, std::mt19937& rng) {
  const size_t n = x.size();
  std::vector<std::vector<double>> centres{x[rng() % n]};
  std::vector<double> d2(n);
  while (centres.size() < k) {
    double total = 0;
    for (size_t i = 0; i < n; ++i) {
      d2[i] = std::numeric_limits<double>::infinity();
      for (const auto& c : centres) d2[i] = std::min(d2[i], sq_dist(x[i], c));
      total += d2[i];
    }
    size_t pick = 0;
    if (total > 0) {
      double u = uniform(rng) * total;
      for (pick = 0; pick + 1 < n && u >= d2[pick]; ++pick) u -= d2[pick];
    } else {
      pick = rng() % n;  // every point sits on a centre: any will do
    }
    centres.push_back(x[pick]);
  }
  return centres;
}

// The starting mixture: Lloyd's k-means from the seeds, then each cluster's weight, mean and
// variance.
Mixture start(const Points& x, size_t k, std::mt19937& rng) {
  const size_t n = x.size(), d = x[0].size();
  auto centres = kmeanspp(x, k, rng);
  std::vector<size_t> label(n, 0);
  for (size_t it = 0; it < kLloydIterations; ++it) {
    for (size_t i = 0; i < n; ++i) {
      double best = std::numeric_limits<double>::infinity();
      for (size_t c = 0; c < k; ++c) {
        double s = sq_dist(x[i], centres[c]);
        if (s < best) best = s, label[i] = c;
      }
    }
    std::vector<std::vector<double>> sum(k, std::vector<double>(d, 0));
    std::vector<size_t> count(k, 0);
    for (size_t i = 0; i < n; ++i) {
      ++count[label[i]];
      for (size_t j = 0; j < d; ++j) sum[label[i]][j] += x[i][j];
    }
    for (size_t c = 0; c < k; ++c) {
      if (count[c] == 0) continue;  // an empty cluster keeps its seed
      for (size_t j = 0; j < d; ++j) centres[c][j] = sum[c][j] / static_cast<double>(count[c]);
    }
  }
  Mixture m;
  m.dims = d;
  m.weight.assign(k, 0);
  m.mean = centres;
  m.var.resize(k);
  for (auto& v : m.var) v.assign(d, 0.0);  // (assign(k, vector) trips GCC 12's -Wfree-nonheap-object)
  std::vector<size_t> count(k, 0);
  for (size_t i = 0; i < n; ++i) {
    ++count[label[i]];
    for (size_t j = 0; j < d; ++j) m.var[label[i]][j] += (x[i][j] - centres[label[i]][j]) * (x[i][j] - centres[label[i]][j]);
  }
  for (size_t c = 0; c < k; ++c) {
    // An empty cluster still starts with a share: EM may yet give it points.
    m.weight[c] = static_cast<double>(std::max<size_t>(count[c], 1)) / static_cast<double>(n + k);
    for (size_t j = 0; j < d; ++j)
      m.var[c][j] = std::max(kVarianceFloor, count[c] > 1 ? m.var[c][j] / static_cast<double>(count[c]) : 1.0);
  }
  double w = 0;
  for (double v : m.weight) w += v;
  for (double& v : m.weight) v /= w;
  prepare(m);
  return m;
}

// log(sum(exp(v))), safe for large negative values.
double log_sum_exp(const std::vector<double>& v) {
  double top = *std::max_element(v.begin(), v.end());
  if (top == kNegInf) return kNegInf;
  double s = 0;
  for (double a : v) s += std::exp(a - top);
  return top + std::log(s);
}

// EM from a starting mixture until the likelihood stops improving.
void em(const Points& x, Mixture& m) {
  const size_t n = x.size(), d = m.dims, k = m.k();
  std::vector<std::vector<double>> resp(n, std::vector<double>(k));
  std::vector<double> lj(k);
  double prev = kNegInf;
  for (m.iterations = 0; m.iterations < kMaxIterations; ++m.iterations) {
    // E: each point's responsibilities, and the likelihood of the current parameters.
    double ll = 0;
    for (size_t i = 0; i < n; ++i) {
      for (size_t c = 0; c < k; ++c) lj[c] = log_joint(m, c, x[i]);
      double lse = log_sum_exp(lj);
      ll += lse;
      for (size_t c = 0; c < k; ++c) resp[i][c] = std::exp(lj[c] - lse);
    }
    m.log_likelihood = ll;
    if (ll - prev < kTolerance * static_cast<double>(n)) break;
    prev = ll;
    // M: weights, means and variances from the responsibilities.
    for (size_t c = 0; c < k; ++c) {
      double nk = 0;
      std::vector<double> mu(d, 0);
      for (size_t i = 0; i < n; ++i) {
        nk += resp[i][c];
        for (size_t j = 0; j < d; ++j) mu[j] += resp[i][c] * x[i][j];
      }
      m.weight[c] = nk / static_cast<double>(n);
      if (nk <= 0) continue;  // a component no point wants: weight 0, it no longer counts
      for (size_t j = 0; j < d; ++j) mu[j] /= nk;
      std::vector<double> var(d, 0);
      for (size_t i = 0; i < n; ++i) {
        for (size_t j = 0; j < d; ++j) var[j] += resp[i][c] * (x[i][j] - mu[j]) * (x[i][j] - mu[j]);
      }
      for (size_t j = 0; j < d; ++j) var[j] = std::max(kVarianceFloor, var[j] / nk);
      m.mean[c] = std::move(mu);
      m.var[c] = std::move(var);
    }
    prepare(m);
  }
}

}  // namespace

double log_joint(const Mixture& m, size_t c, const std::vector<double>& x) {
  double s = m.log_norm[c];
  if (s == kNegInf) return s;
  for (size_t j = 0; j < m.dims; ++j) {
    double dx = x[j] - m.mean[c][j];
    s -= 0.5 * dx * dx / m.var[c][j];
  }
  return s;
}

size_t assign(const Mixture& m, const std::vector<double>& x) {
  size_t best = 0;
  double top = kNegInf;
  for (size_t c = 0; c < m.k(); ++c) {
    double l = log_joint(m, c, x);
    if (l > top) top = l, best = c;
  }
  return best;
}

Mixture fit(const Points& x, size_t k) {
  if (x.empty() || k == 0 || x[0].empty()) return {};
  k = std::min(k, x.size());
  Mixture best;
  bool have = false;
  // One component needs no seeding: every start is the same.
  size_t restarts = k == 1 ? 1 : kRestarts;
  for (size_t r = 0; r < restarts; ++r) {
    std::mt19937 rng(kSeed + static_cast<unsigned>(r));
    Mixture m = start(x, k, rng);
    em(x, m);
    if (!have || m.log_likelihood > best.log_likelihood) best = std::move(m), have = true;
  }
  // Free parameters: a mean and a variance per axis per component, and k-1 weights.
  double params = static_cast<double>(k * 2 * best.dims + (k - 1));
  best.bic = -2 * best.log_likelihood + params * std::log(static_cast<double>(x.size()));
  return best;
}

Mixture fit_best(const Points& x, size_t max_k) {
  Mixture best;
  for (size_t k = 1; k <= std::min(max_k, x.size()); ++k) {
    Mixture m = fit(x, k);
    if (k == 1 || m.bic < best.bic) best = std::move(m);
  }
  return best;
}

}  // namespace strata::diagnose::gmm
