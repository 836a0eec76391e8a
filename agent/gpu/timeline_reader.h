// The GPU timing source: device work (kernels, copies, collectives' kernels) with start and end on
// the device. One interface, two producers of the same timeline file format (abi/gpu_timeline.h):
// strata's CUPTI injection library on real GPUs, the testbed's libcudart stand-in in tests.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "abi/gpu_timeline.h"
#include "common/result.h"

namespace strata::agent {

struct TimelineRecord {
  uint32_t kind = 0;  // enum strata_timeline_kind
  int device = 0;
  uint64_t start_ns = 0, end_ns = 0, api_ns = 0;  // CLOCK_MONOTONIC
  uint64_t correlation = 0;
  uint64_t func = 0;
  uint64_t stream = 0;
  uint64_t bytes = 0;
  int32_t api_tid = 0;
  std::string name;
};

class GpuTimingSource {
 public:
  virtual ~GpuTimingSource() = default;
  // New records since the last call; `lost` counts records the writer overwrote before we read them.
  virtual std::vector<TimelineRecord> read_new(uint64_t& lost) = 0;
};

// Opens the timeline file of process `pid`, looked up in the directory the process's environment
// names (STRATA_TIMELINE_DIR, else STRATA_TESTBED_DIR), then /tmp/strata-timeline and
// /tmp/strata-testbed. Error when the process has none (no GPU work seen yet, or no timing source).
Result<std::unique_ptr<GpuTimingSource>> open_timeline_for(uint32_t pid);
// The same, with the directories named by the process's environment read earlier (a process that
// has exited has no /proc/PID/environ any more).
Result<std::unique_ptr<GpuTimingSource>> open_timeline_for(uint32_t pid, const std::vector<std::string>& env_dirs);
// Those directories: STRATA_TIMELINE_DIR, STRATA_TESTBED_DIR from /proc/PID/environ.
std::vector<std::string> timeline_dirs_of(uint32_t pid);
Result<std::unique_ptr<GpuTimingSource>> open_timeline_file(const std::string& path);

}  // namespace strata::agent
