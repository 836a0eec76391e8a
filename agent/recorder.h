// `strata record`: watch a process tree (started here, or given by pid) with the node pipeline
// (agent/pipeline.h), write each window to an SQLite store, and report the agent's own cost.
#pragma once

#include <cstdint>
#include <set>
#include <iosfwd>
#include <string>
#include <vector>

#include "agent/cost_budget.h"
#include "agent/oncpu_sampler.h"
#include "common/result.h"

namespace strata::agent {

struct RecordOptions {
  unsigned frequency_hz = 99;
  double budget_share = CostBudget::kDefaultShare;  // --budget; 0: none
  double window_s = 10;
  double duration_s = 0;            // 0: until the targets exit (or Ctrl-C)
  std::vector<uint32_t> pids;       // -p
  std::vector<std::string> command; // -- CMD ARGS...
  std::string output = "strata.db";
  std::string node;                 // default: hostname
  bool symbolize_each_window = false;  // else once at the end (symbol tables load off the target's time)
  std::set<std::string> layers = {"cpu", "offcpu", "os", "gpu", "comm"};  // --layers
  size_t unwind_table_bytes = 128u << 20;  // --unwind-tables-mb (normalizer.h)
  std::string save_events;  // --save-events: capture of what the pipeline read, for replay (capture.h)
};

struct RecordSummary {
  SamplerCounters counters;
  uint64_t samples_stored = 0;
  uint64_t windows = 0;
  uint64_t processes = 0;
  uint64_t threads = 0;
  uint64_t distinct_stacks = 0;
  double agent_cpu_s = 0;     // the agent's own CPU while the targets ran
  double agent_cpu_after_s = 0;  // after they ended: last window, symbolization
  double target_cpu_s = 0;    // the targets' CPU over the same time
  double wall_s = 0;
  double sources_kernel_s = 0;  // the other layers' BPF run time and uprobe traps
  int command_exit = -1;      // exit status of CMD (128+signal when killed), -1 with -p
  int command_signal = 0;     // the signal that killed CMD, 0 when it exited
};

Result<RecordSummary> run_record(const RecordOptions& opts, std::ostream& log);

// The closing lines printed after a recording: samples, losses, the agent's cost.
void print_summary(const RecordSummary& s, const std::string& output, std::ostream& out);

}  // namespace strata::agent
