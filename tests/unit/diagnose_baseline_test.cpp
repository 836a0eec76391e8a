// JobBaseline: the job's own healthy past per rank and per layer, as the collector keeps it between
// rounds and the loader fills it from a recording's healthy stretch.
#include <gtest/gtest.h>

#include "diagnose/baseline.h"
#include "diagnose/synthetic.h"

namespace strata::diagnose {
namespace {

JobWindow healthy(unsigned seed, size_t ranks = 4) {
  SyntheticSpec spec;
  spec.ranks = ranks;
  spec.seed = seed;
  spec.baseline = false;
  return make_synthetic_job(spec);
}

double named(const JobWindow& w, const Values& v, const std::string& name) {
  for (const auto& e : v) {
    if (w.names.name(e.name) == name) return e.ms_per_step;
  }
  return 0;
}

TEST(JobBaseline, EmptyUntilAWindowIsAbsorbedAndAppliesNothing) {
  JobBaseline b;
  EXPECT_TRUE(b.empty());
  auto w = healthy(1);
  b.apply(w);
  EXPECT_EQ(w.ranks[0].past.windows, 0u);
  EXPECT_EQ(w.ranks[0].base.steps, 0u);
  b.absorb(w);
  EXPECT_FALSE(b.empty());
}

TEST(JobBaseline, AppliesTheMeanOfFewWindowsPerRankAndLayer) {
  JobBaseline b;
  auto a = healthy(1), c = healthy(2);
  b.absorb(a);
  b.absorb(c);
  auto w = healthy(3, 5);  // one rank more than the baseline saw
  b.apply(w);
  for (size_t i = 0; i < 4; ++i) {
    const auto& p = w.ranks[i].past;
    EXPECT_EQ(p.windows, 2u);
    EXPECT_NEAR(p.get(Os::kCpu), (a.ranks[i].get(Os::kCpu) + c.ranks[i].get(Os::kCpu)) / 2, 1e-9);
    EXPECT_NEAR(p.device_compute_ms, (a.ranks[i].now.device_compute_ms + c.ranks[i].now.device_compute_ms) / 2, 1e-9);
    double ka = named(a, a.ranks[i].kernels, "ampere_sgemm_128x64_tn");
    double kc = named(c, c.ranks[i].kernels, "ampere_sgemm_128x64_tn");
    ASSERT_GT(ka, 0);
    EXPECT_NEAR(named(w, p.kernels, "ampere_sgemm_128x64_tn"), (ka + kc) / 2, 1e-9);
    // The window had no step baseline of its own: the past gives one.
    EXPECT_EQ(w.ranks[i].base.steps, a.ranks[i].now.steps + c.ranks[i].now.steps);
    EXPECT_NEAR(w.ranks[i].base.step_ms, (a.ranks[i].now.step_ms + c.ranks[i].now.step_ms) / 2, 1e-9);
  }
  EXPECT_EQ(w.ranks[4].past.windows, 0u) << "a rank the baseline never saw has no past";
  EXPECT_EQ(w.ranks[4].base.steps, 0u);
}

TEST(JobBaseline, KeepsAWindowsOwnStepBaseline) {
  JobBaseline b;
  b.absorb(healthy(1));
  SyntheticSpec spec;
  spec.ranks = 4;
  auto w = make_synthetic_job(spec);  // with its own baseline stretch
  double own = w.ranks[0].base.step_ms;
  b.apply(w);
  EXPECT_EQ(w.ranks[0].base.step_ms, own);
  EXPECT_EQ(w.ranks[0].past.windows, 1u);
}

TEST(JobBaseline, FollowsADriftWithinItsHorizonAndForgetsWorkThatStopped) {
  JobBaseline b;
  auto w = healthy(1, 1);
  const double cpu = w.ranks[0].get(Os::kCpu);
  for (int i = 0; i < 20; ++i) b.absorb(w);
  // One window at twice the CPU moves the past by 1/kHorizon of the difference.
  auto hot = w;
  hot.ranks[0].set(Os::kCpu, 2 * cpu);
  hot.ranks[0].oncpu.clear();
  b.absorb(hot);
  auto out = healthy(1, 1);
  b.apply(out);
  EXPECT_NEAR(out.ranks[0].past.get(Os::kCpu), cpu + cpu / JobBaseline::kHorizon, 1e-9);
  double fwd = named(w, w.ranks[0].oncpu, "main;train;train_step;forward");
  ASSERT_GT(fwd, 0);
  EXPECT_NEAR(named(out, out.ranks[0].past.oncpu, "main;train;train_step;forward"), fwd * (1 - 1.0 / JobBaseline::kHorizon), 1e-9);
}

}  // namespace
}  // namespace strata::diagnose
