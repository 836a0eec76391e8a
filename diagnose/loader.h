// Fills a JobWindow from a store: the step timeline splits into the job's baseline and the window
// being diagnosed (where the job's step time changed), and every layer's data is summarized per rank
// and per step.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "diagnose/model.h"
#include "store/store.h"

namespace strata::diagnose {

struct Stats;

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
  // The latest stretch of this length (ns): from the latest step the store holds (of the recording
  // read) back; with from_ns given, from_ns wins.
  std::optional<uint64_t> last_ns;
  // When set, what the load read is counted here (the rows each bounded read returned).
  struct Stats* stats = nullptr;
  // When the job made no progress for this long before the latest data, the ranks' stacks since
  // its last progress are read too (RankWindow::stall_oncpu/stall_offcpu): the evidence of a hang.
  // As the engine's Options::hang_s, so that only a job that may be hung pays for the extra reads.
  double stall_stacks_s = 10;
  // When set and true, the load stops at its next read and returns an error: a collector shutting
  // down does not wait for a round (or a request's diagnosis) of thousands of ranks to finish.
  const std::atomic<bool>* cancel = nullptr;
};

// Rows a load read, per kind: a round's cost, which must follow the span, not the store's age.
struct Stats {
  uint64_t steps = 0, collectives = 0, device = 0, metrics = 0, samples = 0, profiles = 0;
  uint64_t rows() const { return steps + collectives + device + metrics + samples; }
  void add(const Stats& o) {
    steps += o.steps, collectives += o.collectives, device += o.device, metrics += o.metrics, samples += o.samples;
    profiles += o.profiles;
  }
};

// `strata diagnose FILE.db` without a span: the latest stretch of `latest_ns`, against the
// `baseline_ns` before it as the job's healthy past (JobBaseline) when that stretch diagnoses
// healthy. Reads those two stretches, whatever else the store holds.
Result<JobWindow> load_latest_with_baseline(store::Reader& store, LoadOptions options, uint64_t latest_ns,
                                            uint64_t baseline_ns);

Result<JobWindow> load_job_window(store::Reader& store, const LoadOptions& options = {});

// The name of a job whose ranks have no RANK and no job name in their environment (a job started
// with torch.multiprocessing.spawn): the loader takes the processes that train under one parent as
// its ranks and names the job after that parent, "COMM-PID" ("job-PID" when the parent was not
// recorded). The collector names the jobs it diagnoses the same way.
std::string job_of_ranks_without_rank(const std::string& parent_comm, uint32_t parent);

// Where the job's step time series (one value per step) rose: the index of the first slow step,
// or 0 when no rise stands out from the noise before it. Exposed for tests.
size_t find_change_point(const std::vector<double>& step_ms, double min_rise = 0.05);

// The ranks of a synchronous job complete the same iterations in the same time; a rank whose steps
// (per rank, in order, after warm-up) number clearly more than the others' over the time they all
// cover was cut at a fraction of the iteration by the agent's step detector, and is re-cut at the
// boundaries of the rank with the fewest steps (its collective and device time shared out by
// overlap). Returns the indices of the ranks re-cut. Exposed for tests.
std::vector<size_t> align_step_cuts(std::vector<std::vector<store::StepRecord>>& steps);

}  // namespace strata::diagnose
