// A set that forgets all it holds once it holds `cap` entries. For remembered answers keyed by
// things a long-running node keeps seeing new ones of (files that carry no runtime, the files a
// process has mapped, call signatures tried as occasional): without a bound the set grows for as
// long as the agent runs. Forgetting costs a second look at an entry seen again, never a wrong
// answer: the user of the set must be able to recompute what an entry stood for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_set>
#include <utility>

namespace strata {

template <typename T, typename Hash = std::hash<T>>
class ForgetfulSet {
 public:
  explicit ForgetfulSet(size_t cap) : cap_(cap == 0 ? 1 : cap) {}

  bool contains(const T& v) const { return set_.count(v) != 0; }
  void insert(T v) {
    if (set_.size() >= cap_ && !set_.count(v)) {
      set_.clear();
      ++forgets_;
    }
    set_.insert(std::move(v));
  }
  // Keeps only the entries `keep` says yes to (a cheaper way back under the cap, when the caller
  // knows which entries still matter).
  template <typename Keep>
  void keep_if(Keep keep) {
    for (auto it = set_.begin(); it != set_.end();) it = keep(*it) ? std::next(it) : set_.erase(it);
  }
  size_t size() const { return set_.size(); }
  bool empty() const { return set_.empty(); }
  size_t cap() const { return cap_; }
  uint64_t forgets() const { return forgets_; }  // times it forgot everything

 private:
  size_t cap_;
  std::unordered_set<T, Hash> set_;
  uint64_t forgets_ = 0;
};

}  // namespace strata
