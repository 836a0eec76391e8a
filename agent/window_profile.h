// One window's on-CPU samples, kept the same way by `strata record` and `strata agent`: each sample
// is unwound (its stack copy differs every time), each distinct unwound stack is normalized once per
// window (the rest of the per-sample cost is a hash), and samples are counted per (process, thread,
// stack). At the window's end the stacks are interned and the counts written.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/events.h"
#include "agent/normalizer.h"
#include "common/result.h"
#include "store/store.h"

namespace strata::agent {

class WindowProfile {
 public:
  explicit WindowProfile(Normalizer& normalizer) : normalizer_(normalizer) {}

  void add(const SampleEvent& e);

  size_t distinct_stacks() const { return stacks_.size(); }

  struct Written {
    uint64_t samples = 0;
    std::vector<int64_t> stack_ids;  // the store's id of each distinct stack
  };
  // Interns the window's stacks and writes its counts as [start_ns, end_ns) (nothing when empty),
  // inside the caller's transaction, with how they were taken (rate, unwinding); then starts the
  // next window.
  Result<Written> write(store::Writer& store, int64_t recording, uint64_t start_ns, uint64_t end_ns,
                        const store::WindowFidelity& fidelity = {});

 private:
  struct Key {
    uint32_t pid, tid, stack;
    std::string comm;
    bool operator==(const Key& o) const { return pid == o.pid && tid == o.tid && stack == o.stack && comm == o.comm; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };

  Normalizer& normalizer_;
  UserStack user_stack_;  // reused per sample
  std::vector<Stack> stacks_;
  std::vector<store::UnwindMethod> methods_;  // how each of stacks_ was unwound
  std::unordered_map<uint64_t, uint32_t> index_;  // unwound stack hash -> index into stacks_
  std::unordered_map<Key, uint64_t, KeyHash> counts_;
};

}  // namespace strata::agent
