// The profile that exporters write: stacks with sample counts, read from a store and filtered.
// Exporters depend on this alone, never on the store.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/frame.h"

namespace strata::report {

struct ProfileSample {
  uint32_t stack_index = 0;  // into Profile::stacks; out of range reads as an empty stack
  uint32_t pid = 0;
  uint32_t tid = 0;
  std::string comm;    // thread name
  uint64_t count = 0;  // samples (on-CPU) or microseconds blocked (off-CPU)
  std::string node;    // where the process runs: pids repeat across nodes
};

// Who a process is in the job, for exporters' labels (pprof: rank, node, job), as the store has it.
struct ProcessLabels {
  int rank = -1;  // -1: not a training rank
  std::string node;
  std::string job;
};

struct Profile {
  std::string kind = "oncpu";        // oncpu | offcpu
  std::string value_unit = "count";  // pprof unit of sample values: count | microseconds
  uint64_t period_ns = 0;            // sampling period, for pprof's period field
  uint64_t start_ns = 0;             // wall-clock start of the data (unix ns)
  uint64_t duration_ns = 0;
  std::vector<Stack> stacks;  // each leaf first
  std::vector<ProfileSample> samples;
  // By pid, for the processes the samples name; a pid missing here gets no such labels (one pid on
  // two nodes of one export is ambiguous, so left out by whoever fills this).
  std::map<uint32_t, ProcessLabels> processes;

  uint64_t total() const {
    uint64_t t = 0;
    for (const auto& s : samples) t += s.count;
    return t;
  }
};

}  // namespace strata::report
