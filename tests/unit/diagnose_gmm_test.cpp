// The second opinion over time (issue 18): the diagonal Gaussian mixture on points whose structure
// is known, and the opinion on synthetic jobs whose per-step series hold a planted change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "diagnose/engine.h"
#include "diagnose/gmm.h"
#include "diagnose/render.h"
#include "diagnose/synthetic.h"
#include <sstream>

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


// A synthetic job with per-step series: kMaxSeriesStepsPerPhase healthy baseline steps per rank,
// then as many window steps with the faults.
JobWindow series_job(size_t ranks, std::vector<PlantedFault> faults, unsigned seed) {
  SyntheticSpec spec;
  spec.ranks = ranks;
  spec.seed = seed;
  spec.series_steps = kMaxSeriesStepsPerPhase;
  spec.faults = std::move(faults);
  return make_synthetic_job(spec);
}

std::string describe(const OverTimeOpinion& ot) {
  std::string s = ot.summary + "\n";
  for (const auto& n : ot.notes) s += "  " + n + "\n";
  return s;
}

TEST(DiagnoseOverTime, TwoRanksOneSlowsHalfwayNamesIt) {
  for (unsigned seed = 1; seed <= 10; ++seed) {
    // Rank 1's steps 30% slower in the window (30 ms more host time on a 100 ms step).
    JobWindow job = series_job(2, {{1, "host-hotspot", 30}}, seed);
    ASSERT_EQ(job.ranks[1].series.size(), 2 * kMaxSeriesStepsPerPhase);
    OverTimeOpinion ot = over_time_opinion(job);
    ASSERT_TRUE(ot.fitted) << describe(ot);
    ASSERT_EQ(ot.outlier_ranks, std::vector<int>{1}) << "seed " << seed << ": " << describe(ot);
    EXPECT_GT(ot.shares[0], 0.9) << describe(ot);
    EXPECT_FALSE(ot.job_wide) << describe(ot);
    // The note says what moved: busy time, by about the planted 30 ms.
    bool busy = false;
    for (const auto& n : ot.notes) busy = busy || (n.find("rank(s) 1:") != std::string::npos && n.find("busy") != std::string::npos);
    EXPECT_TRUE(busy) << describe(ot);
    // The z-scores have no opinion on 2 ranks; the engine's second opinion still carries this one.
    Diagnosis dx = diagnose(job);
    EXPECT_FALSE(dx.second.compared);
    EXPECT_EQ(dx.second.over_time.outlier_ranks, std::vector<int>{1});
  }
}

TEST(DiagnoseOverTime, HealthyJobsNameNobody) {
  for (size_t ranks : {size_t{1}, size_t{2}, size_t{8}}) {
    for (unsigned seed = 1; seed <= 10; ++seed) {
      OverTimeOpinion ot = over_time_opinion(series_job(ranks, {}, seed));
      ASSERT_TRUE(ot.fitted) << describe(ot);
      EXPECT_TRUE(ot.outlier_ranks.empty()) << ranks << " ranks, seed " << seed << ": " << describe(ot);
      EXPECT_FALSE(ot.job_wide) << ranks << " ranks, seed " << seed << ": " << describe(ot);
    }
  }
}

TEST(DiagnoseOverTime, EveryRankSlowingAlikeIsJobWide) {
  for (unsigned seed = 1; seed <= 10; ++seed) {
    // Shared storage got slow: every rank's input reads take 30 ms more per step.
    OverTimeOpinion ot = over_time_opinion(series_job(8, {{kAllRanks, "io-stall", 30}}, seed));
    ASSERT_TRUE(ot.fitted);
    EXPECT_TRUE(ot.job_wide) << "seed " << seed << ": " << describe(ot);
    EXPECT_TRUE(ot.outlier_ranks.empty()) << "seed " << seed << ": " << describe(ot);
  }
  // One rank alone: the job over time is all there is, and it moved.
  OverTimeOpinion one = over_time_opinion(series_job(1, {{0, "io-stall", 30}}, 3));
  EXPECT_TRUE(one.job_wide) << describe(one);
  EXPECT_TRUE(one.outlier_ranks.empty()) << describe(one);
}

TEST(DiagnoseOverTime, StragglerAmongEightIsNamedNotItsWaitingPeers) {
  for (unsigned seed = 1; seed <= 10; ++seed) {
    OverTimeOpinion ot = over_time_opinion(series_job(8, {{5, "gpu-slow", 30}}, seed));
    EXPECT_EQ(ot.outlier_ranks, std::vector<int>{5}) << "seed " << seed << ": " << describe(ot);
    EXPECT_FALSE(ot.job_wide) << describe(ot);
  }
}

TEST(DiagnoseOverTime, NoSeriesNoOpinionAndNoDisagreement) {
  SyntheticSpec spec;
  spec.ranks = 2;
  spec.faults = {{1, "host-hotspot", 30}};
  Diagnosis dx = diagnose(make_synthetic_job(spec));
  EXPECT_FALSE(dx.second.over_time.fitted);
  EXPECT_FALSE(dx.second.disagrees);
}

TEST(DiagnoseOverTime, EngineAgreesWhenBothSeeTheSameRank) {
  Diagnosis dx = diagnose(series_job(2, {{1, "host-hotspot", 30}}, 4));
  ASSERT_FALSE(dx.findings.empty());
  ASSERT_EQ(dx.findings[0].rank, 1);
  EXPECT_FALSE(dx.second.disagrees) << dx.second.summary;
  EXPECT_NE(dx.second.summary.find("over time: agrees"), std::string::npos) << dx.second.summary;
  // The JSON keeps its keys and adds the opinion over time; the text report shows it.
  std::ostringstream json, text;
  write_json(dx, json);
  write_text(dx, text);
  for (const char* key : {"\"second_opinion\":{\"outlier_ranks\":[]", "\"disagrees\":false", "\"summary\":",
                          "\"over_time\":{\"fitted\":true", "\"outlier_ranks\":[1]", "\"job_wide\":false"})
    EXPECT_NE(json.str().find(key), std::string::npos) << key << " in " << json.str();
  EXPECT_NE(text.str().find("over time (a Gaussian mixture"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("rank(s) 1 changed"), std::string::npos) << text.str();
}

TEST(DiagnoseOverTime, DisagreementStaysVisible) {
  // The summaries say rank 1 slowed (the rules name it), but the steps say rank 0 changed: the
  // two ranks' series swapped. The over-time opinion flags rank 0, the findings name rank 1.
  // (4 ranks: with fewer than 3 peers the rules read the steps too, and the steps decide.)
  JobWindow job = series_job(4, {{1, "host-hotspot", 30}}, 5);
  std::swap(job.ranks[0].series, job.ranks[1].series);
  Diagnosis dx = diagnose(job);
  ASSERT_FALSE(dx.findings.empty());
  ASSERT_EQ(dx.findings[0].rank, 1);
  EXPECT_EQ(dx.second.over_time.outlier_ranks, std::vector<int>{0});
  EXPECT_TRUE(dx.second.disagrees) << dx.second.summary;
  EXPECT_NE(dx.second.summary.find("rank(s) [0] changed"), std::string::npos) << dx.second.summary;
  // The ranks' spread (4 ranks) flags rank 1 as the rules do; over time, rank 0 is what changed.
  EXPECT_NE(dx.second.summary.find("which the layered diagnosis does not name"), std::string::npos) << dx.second.summary;
  std::ostringstream json;
  write_json(dx, json);
  EXPECT_NE(json.str().find("\"disagrees\":true"), std::string::npos) << json.str();
}

}  // namespace
}  // namespace strata::diagnose
