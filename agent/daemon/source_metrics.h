// The layers' own counters (Source::stats: "gpu_comm.probe_entries", "offcpu_blocks", ...) as
// Prometheus families for the agent's /metrics: one family per stat, counter or gauge, with its unit
// in the name (seconds, bytes) and `_total` on counters. The stat keys themselves stay as they are:
// the store's stats table and `strata report` use them.
#pragma once

#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace strata::agent::daemon {

struct SourceMetric {
  const char* key;   // the stat key a source writes
  const char* name;  // the Prometheus family; "" when the page shows it under another name already
  const char* type;  // "counter" or "gauge"
  double scale;      // stat value x scale = value in the family's unit (ms, us -> seconds)
  const char* help;
};

// Every stat key the sources write, described. A key not listed here still shows, as a gauge named
// after its key with kUndescribedHelp in its HELP, so a new stat is never silently missing.
const std::vector<SourceMetric>& source_metrics();
inline constexpr const char* kUndescribedHelp = "(not described in agent/daemon/source_metrics.cpp)";

// HELP, TYPE and sample for each stat, in the order given.
void write_source_metrics(std::ostream& o, const std::vector<std::pair<std::string, double>>& stats);

}  // namespace strata::agent::daemon
