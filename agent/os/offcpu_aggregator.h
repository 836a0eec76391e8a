// Off-CPU blocks -> per-window stack counts (store::CountKind::kOffCpu, value = microseconds blocked).
// Blocks of the same thread with the same stack and reason add up. The reason is the leaf-most
// frame of the stored stack, a synthetic kernel frame of module "[offcpu]" named "[sleep]", "[io]",
// "[uninterruptible]", "[preempted]" or "[other]", so flame graphs end in why the thread was off CPU
// (folded: "...;schedule_[k];[sleep]_[k]"). Pure: tests feed it made-up events.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/events.h"
#include "agent/normalizer.h"
#include "common/frame.h"
#include "common/result.h"
#include "store/store.h"

namespace strata::agent::os {

struct OffCpuEvent {
  SampleEvent sample;       // pid, tid, comm, stacks (leaf first) as the on-CPU sampler's
  uint64_t blocked_ns = 0;  // switch-out to switch-in
  unsigned reason = 0;      // enum strata_offcpu_reason
};

// The synthetic leaf frame for a reason.
Frame reason_frame(unsigned reason);

class OffCpuAggregator {
 public:
  explicit OffCpuAggregator(Normalizer& normalizer) : normalizer_(normalizer) {}
  void add(const OffCpuEvent& e);
  // Writes the window's counts (interning its stacks) and starts a new window.
  Status flush(store::Writer& store, int64_t recording, uint64_t start_ns, uint64_t end_ns);
  uint64_t blocks() const { return blocks_; }           // events added, ever
  uint64_t stored_us() const { return stored_us_; }     // microseconds written, ever

 private:
  struct Key {
    uint32_t pid, tid, stack;
    std::string comm;
    bool operator==(const Key& o) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  Normalizer& normalizer_;
  UserStack user_;  // reused
  std::vector<Stack> stacks_;
  std::vector<store::UnwindMethod> methods_;  // per stacks_ entry
  std::unordered_map<uint64_t, uint32_t> raw_index_;  // hash of raw stack + reason -> stacks_ index
  std::unordered_map<Key, uint64_t, KeyHash> ns_;
  uint64_t blocks_ = 0;
  uint64_t stored_us_ = 0;
};

}  // namespace strata::agent::os
