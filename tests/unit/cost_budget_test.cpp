// The agent's cost budget: steps down when over (keeping a step only if it cut a fifth of the
// cost), back up when well under for two windows.
#include <gtest/gtest.h>

#include "agent/cost_budget.h"

namespace strata::agent {
namespace {

TEST(CostBudget, StepsDownOverBudgetAndBackUpWhenCalm) {
  CostBudget b(0.005);  // 10 s windows, 10 s of the targets' CPU each: cost 0.05 s is 0.5%
  EXPECT_EQ(b.update(0.001, 10, 10), CostBudget::kFull) << "0.01%: fine";
  // The rate goes down first (stacks stay whole), CFI unwinding off only last.
  EXPECT_EQ(b.update(0.1, 10, 10), CostBudget::kHalfRate) << "1%: over 0.5%";
  EXPECT_TRUE(CostBudget::cfi_at(CostBudget::kHalfRate));
  EXPECT_EQ(b.update(0.07, 10, 10), CostBudget::kHalfRate) << "a trial lasts two windows and 20 s";
  EXPECT_EQ(b.update(0.07, 10, 10), CostBudget::kQuarterRate) << "0.7% after 1%: kept, and still over";
  EXPECT_TRUE(CostBudget::cfi_at(CostBudget::kQuarterRate));
  EXPECT_EQ(b.update(0.055, 10, 10), CostBudget::kQuarterRate);
  EXPECT_EQ(b.update(0.055, 10, 10), CostBudget::kFramePointers) << "0.55% after 0.7%: kept, still over";
  EXPECT_FALSE(CostBudget::cfi_at(CostBudget::kFramePointers));
  EXPECT_EQ(b.update(0.02, 10, 10), CostBudget::kFramePointers);
  EXPECT_EQ(b.update(0.02, 10, 10), CostBudget::kFramePointers) << "0.2% after 0.55%: kept";
  EXPECT_EQ(b.update(0.07, 10, 10), CostBudget::kFramePointers) << "the floor";
  EXPECT_EQ(b.update(0.001, 10, 10), CostBudget::kFramePointers) << "one calm window is not enough";
  EXPECT_EQ(b.update(0.001, 10, 10), CostBudget::kQuarterRate);
  EXPECT_EQ(b.update(0.03, 10, 10), CostBudget::kQuarterRate) << "between a third of the budget and the budget: hold";
  EXPECT_EQ(b.max_level(), CostBudget::kFramePointers);
  EXPECT_EQ(b.steps_down(), 3);
  EXPECT_EQ(b.useless_steps(), 0);
}

// The cost that stays when the sampling rate halves is what no level controls (per-switch
// accounting): stepping down would lose half the samples, or the CFI stacks, for nothing.
TEST(CostBudget, AStepThatBuysNothingIsUndoneAndNotTriedAgainForAWhile) {
  CostBudget b(0.005);
  EXPECT_EQ(b.update(0.1, 10, 10), CostBudget::kHalfRate) << "1%: over, try half the rate";
  EXPECT_EQ(b.update(0.095, 10, 10), CostBudget::kHalfRate);
  EXPECT_EQ(b.update(0.095, 10, 10), CostBudget::kFull) << "0.95% after 1%: a twentieth less, undone";
  EXPECT_EQ(b.useless_steps(), 1);
  EXPECT_EQ(b.last_useless().level, CostBudget::kHalfRate);
  EXPECT_NEAR(b.last_useless().before, 0.01, 1e-9);
  EXPECT_NEAR(b.last_useless().at_level, 0.0095, 1e-9);
  EXPECT_FALSE(b.held());
  EXPECT_EQ(b.update(0.1, 10, 10), CostBudget::kFull) << "still over budget: held at full fidelity";
  EXPECT_TRUE(b.held());
  // The hold lasts kHoldSeconds from the step's undoing, then the level below is tried again.
  int windows_held = 1;
  while (b.update(0.1, 10, 10) == CostBudget::kFull && windows_held < 1000) ++windows_held;
  EXPECT_EQ(windows_held, static_cast<int>(CostBudget::kHoldSeconds / 10) - 1);
  EXPECT_EQ(b.level(), CostBudget::kHalfRate);
  EXPECT_EQ(b.steps_down(), 2);
  EXPECT_EQ(b.max_level(), CostBudget::kHalfRate) << "never went further down than the trial";
}

TEST(CostBudget, AUselessLevelDoesNotStopTheLevelsAboveIt) {
  CostBudget b(0.005);
  // Half the rate cuts 1% to 0.6%; a quarter cuts nothing more: back to half, held there.
  EXPECT_EQ(b.update(0.1, 10, 10), CostBudget::kHalfRate);
  EXPECT_EQ(b.update(0.06, 10, 10), CostBudget::kHalfRate);
  EXPECT_EQ(b.update(0.06, 10, 10), CostBudget::kQuarterRate);
  EXPECT_EQ(b.update(0.058, 10, 10), CostBudget::kQuarterRate);
  EXPECT_EQ(b.update(0.058, 10, 10), CostBudget::kHalfRate) << "0.58% after 0.6%: undone";
  EXPECT_EQ(b.update(0.06, 10, 10), CostBudget::kHalfRate) << "held at half the rate, not back to full";
  EXPECT_TRUE(b.held());
  EXPECT_EQ(b.useless_steps(), 1);
}

TEST(CostBudget, ATrialIsJudgedByTimeAsWellAsWindows) {
  CostBudget b(0.005);
  // 1 s windows: the trial needs 20 of them, not 2.
  EXPECT_EQ(b.update(0.01, 1, 1), CostBudget::kHalfRate);
  for (int i = 0; i < 19; ++i) EXPECT_EQ(b.update(0.0099, 1, 1), CostBudget::kHalfRate) << i;
  EXPECT_EQ(b.update(0.0099, 1, 1), CostBudget::kFull) << "judged after 20 s";
}

TEST(CostBudget, ZeroMeansNoBudgetButTheCostIsStillMeasured) {
  CostBudget b(0);  // --budget 0
  EXPECT_EQ(b.update(5, 10, 10), CostBudget::kFull) << "50% of the targets' CPU: reported, never acted on";
  EXPECT_DOUBLE_EQ(b.last_share(), 0.5);
  EXPECT_EQ(b.steps_down(), 0);
}

TEST(CostBudget, IdleTargetsChangeNothing) {
  CostBudget b(0.005);
  EXPECT_EQ(b.update(0.5, 0.01, 0.01), CostBudget::kFull);
}

TEST(CostBudget, AJobWaitingOnItsGpusStillGetsOneCoresBudget) {
  CostBudget b(0.005);
  // 0.2 s of targets' CPU in a 10 s window: 30 ms of agent work is 15% of that, but 0.3% of a core.
  EXPECT_EQ(b.update(0.03, 0.2, 10), CostBudget::kFull);
  EXPECT_EQ(b.update(0.08, 0.2, 10), CostBudget::kHalfRate) << "0.8% of a core is over";
}

TEST(CostBudget, TheDefaultIsTwoTenthsOfAPercent) {
  CostBudget b;
  EXPECT_DOUBLE_EQ(b.budget(), 0.002);
  // 4 busy ranks for a 10 s window: 40 s of CPU allow 80 ms of agent work, not 100 ms.
  EXPECT_EQ(b.update(0.07, 40, 10), CostBudget::kFull);
  EXPECT_EQ(b.update(0.1, 40, 10), CostBudget::kHalfRate) << "0.25% is over 0.2%";
}

TEST(CostBudget, RatesNeverFallBelowTenHertz) {
  EXPECT_EQ(CostBudget::rate_at(CostBudget::kFull, 99), 99u);
  EXPECT_EQ(CostBudget::rate_at(CostBudget::kHalfRate, 99), 49u);
  EXPECT_EQ(CostBudget::rate_at(CostBudget::kFramePointers, 99), 24u) << "frame pointers at the quarter rate";
  EXPECT_EQ(CostBudget::rate_at(CostBudget::kQuarterRate, 99), 24u);
  EXPECT_EQ(CostBudget::rate_at(CostBudget::kQuarterRate, 19), 10u);
}

TEST(CostBudget, SourceAllowancesHalveAtEachLevelAndNeverReachZero) {
  EXPECT_EQ(CostBudget::scaled_at(CostBudget::kFull, 400), 400u);
  EXPECT_EQ(CostBudget::scaled_at(CostBudget::kHalfRate, 400), 200u);
  EXPECT_EQ(CostBudget::scaled_at(CostBudget::kQuarterRate, 400), 100u);
  EXPECT_EQ(CostBudget::scaled_at(CostBudget::kFramePointers, 400), 50u);
  EXPECT_EQ(CostBudget::scaled_at(CostBudget::kFramePointers, 3), 1u) << "never 0: a CPU still takes some stacks";
  EXPECT_EQ(CostBudget::scaled_at(40, 400), 1u) << "no shift past the width";
}

}  // namespace
}  // namespace strata::agent
