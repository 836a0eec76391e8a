#include "agent/os/offcpu_aggregator.h"

#include "agent/os/os_metrics.h"

namespace strata::agent::os {

Frame reason_frame(unsigned reason) {
  Frame f;
  f.kind = FrameKind::kKernel;
  f.module = "[offcpu]";
  f.offset = reason + 1;  // frames are unique by (kind, build id, module, offset)
  f.function = std::string("[") + reason_name(reason) + "]";
  return f;
}

size_t OffCpuAggregator::KeyHash::operator()(const Key& k) const {
  return hash_mix(hash_mix(hash_mix(k.pid, k.tid), k.stack), std::hash<std::string>()(k.comm));
}

void OffCpuAggregator::add(const OffCpuEvent& e) {
  const SampleEvent& s = e.sample;
  // Unwind first (the stack copy with CFI, else the kernel's frame-pointer walk): blocks share a
  // stored stack when their unwound stacks are equal.
  normalizer_.unwind(s, user_);
  uint64_t h = unwound_stack_key(hash_mix(s.pid, e.reason), s, user_);
  auto it = raw_index_.find(h);
  uint32_t index;
  if (it != raw_index_.end()) {
    index = it->second;
  } else {
    Stack stack;
    stack.push_back(reason_frame(e.reason));
    normalizer_.normalize(s, user_, stack);
    index = static_cast<uint32_t>(stacks_.size());
    stacks_.push_back(std::move(stack));
    methods_.push_back(user_.method);
    raw_index_.emplace(h, index);
  }
  ns_[Key{s.pid, s.tid, index, s.comm}] += e.blocked_ns;
  blocks_++;
}

Status OffCpuAggregator::flush(store::Writer& store, int64_t recording, uint64_t start_ns, uint64_t end_ns) {
  if (!ns_.empty()) {
    std::vector<int64_t> ids(stacks_.size());
    for (size_t i = 0; i < stacks_.size(); ++i) {
      auto id = store.intern_stack(stacks_[i], methods_[i]);
      if (!id) return id.error();
      ids[i] = *id;
    }
    std::vector<store::StackCount> counts;
    counts.reserve(ns_.size());
    for (const auto& [k, ns] : ns_) {
      uint64_t us = (ns + 500) / 1000;
      if (us == 0) continue;
      counts.push_back(store::StackCount{k.pid, k.tid, k.comm, ids[k.stack], us});
      stored_us_ += us;
    }
    if (!counts.empty()) {
      if (auto st = store.put_window(recording, start_ns, end_ns, store::CountKind::kOffCpu, counts); !st) return st;
    }
  }
  stacks_.clear();
  methods_.clear();
  raw_index_.clear();
  ns_.clear();
  return {};
}

}  // namespace strata::agent::os
