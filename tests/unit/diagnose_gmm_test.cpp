// The second opinion over time (issue 18): the diagonal Gaussian mixture on points whose structure
// is known, and the opinion on synthetic jobs whose per-step series hold a planted change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "diagnose/gmm.h"

namespace strata::diagnose {
namespace {

gmm::Points blob(std::mt19937_64& rng, size_t n, double mx, double my, double sx, double sy) {
  std::normal_distribution<double> g(0, 1);
  gmm::Points p;
  for (size_t i = 0; i < n; ++i) p.push_back({mx + sx * g(rng), my + sy * g(rng)});
  return p;
}

TEST(DiagnoseGmm, RecoversTwoSeparatedClusters) {
  for (unsigned seed = 1; seed <= 5; ++seed) {
    std::mt19937_64 rng(seed);
    // 300 points around (0,0) and 100 around (8,-5): weights 0.75 / 0.25.
    gmm::Points x = blob(rng, 300, 0, 0, 1.0, 0.5);
    gmm::Points b = blob(rng, 100, 8, -5, 0.7, 1.2);
    x.insert(x.end(), b.begin(), b.end());
    gmm::Mixture m = gmm::fit(x, 2);
    ASSERT_EQ(m.k(), 2u);
    size_t big = m.weight[0] > m.weight[1] ? 0 : 1, small = 1 - big;
    EXPECT_NEAR(m.weight[big], 0.75, 0.03) << "seed " << seed;
    EXPECT_NEAR(m.weight[small], 0.25, 0.03) << "seed " << seed;
    EXPECT_NEAR(m.mean[big][0], 0, 0.2) << "seed " << seed;
    EXPECT_NEAR(m.mean[big][1], 0, 0.2) << "seed " << seed;
    EXPECT_NEAR(m.mean[small][0], 8, 0.3) << "seed " << seed;
    EXPECT_NEAR(m.mean[small][1], -5, 0.3) << "seed " << seed;
    // Diagonal variances recovered too (sd 1.0/0.5 and 0.7/1.2).
    EXPECT_NEAR(std::sqrt(m.var[big][0]), 1.0, 0.15) << "seed " << seed;
    EXPECT_NEAR(std::sqrt(m.var[big][1]), 0.5, 0.1) << "seed " << seed;
    EXPECT_NEAR(std::sqrt(m.var[small][1]), 1.2, 0.25) << "seed " << seed;
    // And BIC prefers two components here.
    EXPECT_EQ(gmm::fit_best(x).k(), 2u) << "seed " << seed;
    // Each blob's centre is assigned to its own component.
    EXPECT_EQ(gmm::assign(m, {0, 0}), big);
    EXPECT_EQ(gmm::assign(m, {8, -5}), small);
  }
}

TEST(DiagnoseGmm, BicPicksOneComponentForOneBlob) {
  for (unsigned seed = 1; seed <= 5; ++seed) {
    std::mt19937_64 rng(100 + seed);
    gmm::Points x = blob(rng, 400, 3, -1, 1.0, 2.0);
    gmm::Mixture m = gmm::fit_best(x);
    ASSERT_EQ(m.k(), 1u) << "seed " << seed;
    EXPECT_NEAR(m.mean[0][0], 3, 0.2);
    EXPECT_NEAR(m.mean[0][1], -1, 0.3);
  }
}

TEST(DiagnoseGmm, DeterministicAndSafeOnDegenerateInput) {
  std::mt19937_64 rng(7);
  gmm::Points x = blob(rng, 200, 0, 0, 1, 1);
  gmm::Mixture a = gmm::fit_best(x), b = gmm::fit_best(x);
  ASSERT_EQ(a.k(), b.k());
  EXPECT_EQ(a.log_likelihood, b.log_likelihood);
  EXPECT_EQ(a.mean, b.mean);
  // Identical points: the variance floor keeps the likelihood finite and one component wins.
  gmm::Points same(50, {1.0, 2.0});
  gmm::Mixture s = gmm::fit_best(same);
  ASSERT_EQ(s.k(), 1u);
  EXPECT_TRUE(std::isfinite(s.log_likelihood));
  EXPECT_DOUBLE_EQ(s.var[0][0], gmm::kVarianceFloor);
  EXPECT_EQ(gmm::fit_best({}).k(), 0u);
}

}  // namespace
}  // namespace strata::diagnose
