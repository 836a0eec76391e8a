// The profile that exporters write: stacks with sample counts, read from a store and filtered.
// A plain model in common/: the store fills it and the exporters (report/) read it, so neither
// depends on the other (it lived in report/, which made the store include the exporters' folder).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/frame.h"

namespace strata {

struct ProfileSample {
  uint32_t stack_index = 0;  // into Profile::stacks; out of range reads as an empty stack
  uint32_t pid = 0;
  uint32_t tid = 0;
  std::string comm;    // thread name
  uint64_t count = 0;  // samples (on-CPU) or microseconds blocked (off-CPU)
  std::string node;    // where the process runs: pids repeat across nodes
  // The sampling period of the windows these samples came from (on-CPU): the cost budget lowers the
  // rate in some windows, and a sample at 24 Hz stands for four times the CPU time of one at 99 Hz.
  // 0: the profile's period_ns.
  uint64_t period_ns = 0;
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

  // Raw values: samples (on-CPU, at whatever rate each was taken) or microseconds (off-CPU).
  uint64_t total() const {
    uint64_t t = 0;
    for (const auto& s : samples) t += s.count;
    return t;
  }

  uint64_t period_of(const ProfileSample& s) const { return s.period_ns ? s.period_ns : period_ns; }

  // A sample's value in units of the profile's period: samples taken at a lower rate than the
  // profile's weigh more (a 24 Hz sample in a 99 Hz profile counts 99/24), so sums over windows of
  // different rates are CPU time, not sample counts. Off-CPU values (no period) are returned as is.
  double weighted(const ProfileSample& s) const {
    if (period_ns == 0 || s.period_ns == 0 || s.period_ns == period_ns) return static_cast<double>(s.count);
    return static_cast<double>(s.count) * static_cast<double>(s.period_ns) / static_cast<double>(period_ns);
  }
  double weighted_total() const {
    double t = 0;
    for (const auto& s : samples) t += weighted(s);
    return t;
  }
  // Whether some samples were taken at another period than the profile's.
  bool mixed_periods() const {
    for (const auto& s : samples)
      if (s.period_ns != 0 && s.period_ns != period_ns) return true;
    return false;
  }
};

}  // namespace strata
