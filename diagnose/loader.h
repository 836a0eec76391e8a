// Fills a JobWindow from a store: the step timeline splits into the job's baseline and the window
// being diagnosed (where the job's step time changed), and every layer's data is summarized per rank
// and per step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/result.h"
#include "diagnose/model.h"
#include "store/store.h"

namespace strata::diagnose {

struct LoadOptions {
  std::string job;        // empty: the job with the most ranks in the latest recording
  int warmup_steps = 2;   // first steps of each rank are start-up, never a baseline
  // Every recording, not only the latest: a collector holds one per agent (node) and agent start,
  // and a job's ranks span them.
  bool all_recordings = false;
  // Only what overlaps [from_ns, to_ns) (unix ns; either end open) is read: steps, collectives,
  // device activity, metrics and the store windows of stacks. The cost is then bounded by the span,
  // not by what the store holds.
  std::optional<uint64_t> from_ns, to_ns;
};

Result<JobWindow> load_job_window(store::Store& store, const LoadOptions& options = {});

// Where the job's step time series (one value per step) rose: the index of the first slow step,
// or 0 when no rise stands out from the noise before it. Exposed for tests.
size_t find_change_point(const std::vector<double>& step_ms, double min_rise = 0.05);

}  // namespace strata::diagnose
