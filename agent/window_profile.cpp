#include "agent/window_profile.h"

namespace strata::agent {

size_t WindowProfile::KeyHash::operator()(const Key& k) const {
  return hash_mix(hash_mix(hash_mix(k.pid, k.tid), k.stack), std::hash<std::string>()(k.comm));
}

void WindowProfile::add(const SampleEvent& e) {
  normalizer_.unwind(e, user_stack_);
  uint64_t h = unwound_stack_key(e.pid, e, user_stack_);
  auto it = index_.find(h);
  uint32_t index;
  if (it != index_.end()) {
    index = it->second;
  } else {
    Stack stack;
    normalizer_.normalize(e, user_stack_, stack);
    index = static_cast<uint32_t>(stacks_.size());
    stacks_.push_back(std::move(stack));
    methods_.push_back(user_stack_.method);
    index_.emplace(h, index);
  }
  counts_[Key{e.pid, e.tid, index, e.comm}] += 1;
}

Result<WindowProfile::Written> WindowProfile::write(store::Writer& store, int64_t recording, uint64_t start_ns,
                                                    uint64_t end_ns, const store::WindowFidelity& fidelity) {
  Written w;
  w.stack_ids.resize(stacks_.size());
  for (size_t i = 0; i < stacks_.size(); ++i) {
    auto id = store.intern_stack(stacks_[i], methods_[i]);
    if (!id) return id.error();
    w.stack_ids[i] = *id;
  }
  std::vector<store::StackCount> counts;
  counts.reserve(counts_.size());
  for (const auto& [k, v] : counts_) {
    counts.push_back(store::StackCount{k.pid, k.tid, k.comm, w.stack_ids[k.stack], v});
    w.samples += v;
  }
  if (!counts.empty()) {
    if (auto st = store.put_window(recording, start_ns, end_ns, store::CountKind::kOnCpu, counts, fidelity); !st) return st.error();
  }
  stacks_.clear();
  methods_.clear();
  index_.clear();
  counts_.clear();
  return w;
}

}  // namespace strata::agent
