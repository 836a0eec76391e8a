// The job's own healthy past, per rank and per layer (DESIGN §6, issue 17): a rolling summary of
// the recent windows in which the job was healthy. The collector keeps one per job between rounds
// (absorb() each healthy round, apply() before diagnosing the next); the loader fills one from the
// healthy stretch before a recording's change point. The engine compares every layer of a window
// with it as well as across peers, so a slowdown on every rank can still name its layer.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "diagnose/model.h"

namespace strata::diagnose {

class JobBaseline {
 public:
  // Folds one window the caller judged healthy into each of its ranks' summaries (by rank number).
  void absorb(const JobWindow& healthy);
  // Gives each rank of `w` that the baseline has seen its past (RankWindow::past), and its step
  // baseline (RankWindow::base) where the window brought none. Ranks never seen keep no past.
  void apply(JobWindow& w) const;
  bool empty() const { return ranks_.empty(); }

  // Recent windows weigh this many to one: the summary follows a job whose healthy speed drifts
  // (a new input shard, a warmer cache) within a few windows, while one odd healthy window moves
  // it by at most a sixth. Until then every window absorbed weighs the same (a plain mean).
  static constexpr uint32_t kHorizon = 6;

 private:
  using ByName = std::unordered_map<std::string, double>;
  struct Summary {
    uint32_t windows = 0;
    uint64_t steps = 0;
    double step_ms = kUnknown, step_mad_ms = kUnknown, wait_ms = kUnknown, device_compute_ms = kUnknown,
           gpu_idle_ms = kUnknown;
    std::array<double, kOsCount> os;
    ByName kernels, oncpu, offcpu, neighbours;
    Summary() { os.fill(kUnknown); }
  };
  std::map<int, Summary> ranks_;
};

}  // namespace strata::diagnose
