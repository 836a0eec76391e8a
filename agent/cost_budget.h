// The agent's cost budget (DESIGN §4 "adaptive"): each window, the agent's own CPU plus its BPF
// run time (less its one-time work: unwind-table builds, symbolization) is compared with the
// watched processes' CPU on the node (at least one core's worth of the window);
// over budget it steps down — first half, then a quarter of the sampling rate, and only then
// node-side CFI unwinding off (kernel frame-pointer stacks, cut at the first return address that
// is not code) — and steps back up when well under budget for two windows. Each level also halves
// what sources with a knob of their own allow themselves (off-CPU stack captures: scaled_at). Pure
// logic, unit-tested.
// Why the rate goes first: a lower rate keeps every stack whole and cuts every per-sample cost
// (the copy, Python frames, normalizing); turning CFI off cuts only the walk's share and breaks the
// stacks of every frameless module (on a Debian PyTorch job, all of them: issue 15).
#pragma once

#include <cstdio>
#include <string>

namespace strata::agent {

// A cost share for people, with two decimals (0.0135022 -> "1.35%"): the budget is a few tenths of
// a percent, so hundredths tell cost and budget apart; more digits are noise.
inline std::string percent(double share) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", share * 100);
  return buf;
}

class CostBudget {
 public:
  static constexpr int kFull = 0;          // stack copies unwound with CFI on the node
  static constexpr int kHalfRate = 1;
  static constexpr int kQuarterRate = 2;
  static constexpr int kFramePointers = 3; // ... and kernel frame-pointer stacks only: the last resort

  // The default share: 0.2% of the watched ranks' CPU on the node. An always-on agent must cost
  // less than production profilers that run fleet-wide (SysOM-AI reports 0.4%), and 0.2% is what
  // issue 15 asks of the whole agent; `strata record` and `strata agent` run the same budget.
  static constexpr double kDefaultShare = 0.002;

  // `share`: the agent's cost as a fraction of the targets' CPU (0.002: 0.2% of a core per busy
  // thread); 0: no budget (the cost is still measured and reported).
  explicit CostBudget(double share = kDefaultShare) : share_(share) {}

  // Returns the level for the next window. The budget is per busy thread with at least one: a job
  // that mostly waits for its GPUs still allows the share of one core (else every GPU-bound job
  // would lose its CFI stacks to the budget).
  int update(double cost_s, double target_cpu_s, double wall_s) {
    double base = target_cpu_s > wall_s ? target_cpu_s : wall_s;
    if (base < 0.05) return level_;  // nothing to judge by
    double s = cost_s / base;
    last_share_ = s;
    if (share_ <= 0) return level_;  // --budget 0: cost measured and reported, never acted on
    if (s > share_ && level_ < kFramePointers) {
      ++level_;
      ++steps_down_;
      calm_ = 0;
    } else if (s < share_ / 3 && level_ > kFull) {
      if (++calm_ >= 2) {
        --level_;
        calm_ = 0;
      }
    } else {
      calm_ = 0;
    }
    if (level_ > max_level_) max_level_ = level_;
    return level_;
  }

  int level() const { return level_; }
  int max_level() const { return max_level_; }
  int steps_down() const { return steps_down_; }
  double last_share() const { return last_share_; }
  double budget() const { return share_; }

  // Whether the node unwinds stack copies with CFI at a level.
  static bool cfi_at(int level) { return level < kFramePointers; }

  // A per-second allowance of a source's own knob at a level (off-CPU stack captures): halved at
  // each level, never below 1.
  static unsigned scaled_at(int level, unsigned n) {
    unsigned r = level <= 0 ? n : level >= 31 ? 0 : n >> level;
    return r < 1 ? 1 : r;
  }

  // Sampling rate at a level, from the configured one (never below 10 Hz).
  static unsigned rate_at(int level, unsigned hz) {
    unsigned r = level >= kQuarterRate ? hz / 4 : level >= kHalfRate ? hz / 2 : hz;
    return r < 10 ? 10 : r;
  }

 private:
  double share_;
  int level_ = kFull;
  int max_level_ = kFull;
  int steps_down_ = 0;
  int calm_ = 0;
  double last_share_ = 0;
};

}  // namespace strata::agent
