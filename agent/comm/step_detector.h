// Finds training iterations of one process from its repeating collective pattern, with no help
// from the job: DDP issues the same buckets of all-reduce every step, FSDP the same all-gathers and
// reduce-scatters. The period is the shortest repeating run of call signatures; the step boundary is
// the largest gap in the pattern (data loading + forward happen there, before the collectives of
// the backward pass). Pure logic: fed with calls, it returns completed steps.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::agent {

struct CollectiveCall {
  std::string signature;   // op + bytes + communicator: what repeats every step
  uint64_t enter_ns = 0;
  uint64_t exit_ns = 0;    // the host call returned
  uint64_t done_ns = 0;    // completed (device end, or the next sync); >= exit_ns
  uint64_t device_ns = 0;  // device time of the collective, when known
};

struct DetectedStep {
  uint64_t step = 0;  // 1, 2, ...
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint64_t collective_ns = 0;         // union of [enter, done] of the step's calls
  uint64_t device_collective_ns = 0;  // sum of device time of its collectives
  size_t calls = 0;
};

class StepDetector {
 public:
  explicit StepDetector(uint64_t watch_start_ns = 0) : watch_start_ns_(watch_start_ns) {}

  void add(CollectiveCall call);
  // Steps completed since the last call. `final` (the process ended): the last full period counts
  // too even if no later call confirms it.
  std::vector<DetectedStep> take_steps(bool final = false);

  size_t period() const { return locked_ ? period_ : 0; }
  uint64_t steps_emitted() const { return emitted_; }

  static constexpr size_t kMaxPeriod = 512;  // collectives per step we can recognize
  static constexpr size_t kMaxHistory = 8192;
  static constexpr size_t kMaxMultiple = 8;             // step = up to 8 repeats of the shortest pattern
  static constexpr uint64_t kMinBoundaryGapNs = 100'000;  // a step boundary gap is at least 100 µs

 private:
  bool try_lock(bool final);
  bool period_matches(size_t begin) const;
  std::vector<uint64_t> phase_gaps(size_t start, size_t period) const;

  uint64_t watch_start_ns_;
  std::vector<CollectiveCall> calls_;
  bool locked_ = false;
  size_t period_ = 0;
  size_t next_ = 0;         // index of the first call of the next period to emit
  uint64_t emitted_ = 0;
  uint64_t last_end_ns_ = 0;  // end of the last emitted step (or of pre-pattern calls)
};

}  // namespace strata::agent
