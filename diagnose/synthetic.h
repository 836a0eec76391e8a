// Made-up job windows with planted faults: what each fault looks like in the summaries the loader
// produces (DESIGN §6), for any number of ranks. Deterministic for a seed.
#pragma once

#include <string>
#include <vector>

#include "diagnose/model.h"

namespace strata::diagnose {

struct PlantedFault {
  int rank = 0;        // kAllRanks: every rank alike (a job-wide fault)
  std::string cause;   // a DESIGN §6 cause class
  double ms = 40;      // extra time per step on that rank (the link's extra wait for network-slow)
  // hang: the rank's host stopped (a deadlock, a data loader that never returns) before it entered
  // the next collective, in a job without a device timeline; false: its GPU stopped (the ranks all
  // entered the collective, the hung rank's device finished its work first).
  bool on_host = false;
};

inline constexpr int kAllRanks = -1;

struct SyntheticSpec {
  size_t ranks = 8;
  double step_ms = 100;     // healthy step time
  double noise = 0.02;      // relative spread of per-rank times
  unsigned seed = 1;
  bool baseline = true;     // give the ranks a healthy history to compare with
  bool past = false;        // and a past per layer (JobBaseline of the same job without faults)
  // Per-step series (RankWindow::series): this many healthy baseline steps, then as many window
  // steps with the faults, per rank (at most kMaxSeriesStepsPerPhase each). 0: none, as before.
  size_t series_steps = 0;
  std::vector<PlantedFault> faults;
};

JobWindow make_synthetic_job(const SyntheticSpec& spec);

// The culprit name a planted fault should be reported with ("logrotate", "slow_augment", ...).
std::string planted_culprit(const PlantedFault& f);

}  // namespace strata::diagnose
