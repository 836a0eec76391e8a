// The OS layer's per-process summary for `strata report --format text`: for each process (rank), the
// metrics of agent/os/os_metrics.h summed over the recording's windows, one short block each.
// Takes plain rows (no store dependency), so it is tested with made-up input.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace strata::report {

struct OsMetricRow {
  uint32_t pid = 0;
  std::string name;   // "os.runq_latency_us.hist", ...
  std::string label;  // "le=80", "sleep", "strata-hog:4411", ...
  double value = 0;   // one window's value
};

struct OsProcess {
  uint32_t pid = 0;
  int rank = -1;
  std::string comm;
};

// Prints nothing when there are no "os." rows. Counters and times are summed over windows;
// percentiles are read from the summed histograms (bucket upper bounds); neighbours are listed
// largest first (at most 5). Processes are in the order given.
void write_os_table(const std::vector<OsProcess>& processes, const std::vector<OsMetricRow>& rows,
                    std::ostream& out);

}  // namespace strata::report
