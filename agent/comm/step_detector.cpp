#include "agent/comm/step_detector.h"

#include <algorithm>

namespace strata::agent {
namespace {

// Length of the union of intervals (the step's time in collectives, overlaps counted once).
uint64_t union_length(std::vector<std::pair<uint64_t, uint64_t>> iv) {
  std::sort(iv.begin(), iv.end());
  uint64_t total = 0, cur_start = 0, cur_end = 0;
  bool open = false;
  for (const auto& [s, e] : iv) {
    if (!open || s > cur_end) {
      if (open) total += cur_end - cur_start;
      cur_start = s;
      cur_end = e;
      open = true;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  if (open) total += cur_end - cur_start;
  return total;
}

}  // namespace

void StepDetector::add(CollectiveCall call) {
  call.done_ns = std::max({call.done_ns, call.exit_ns, call.enter_ns});
  calls_.push_back(std::move(call));
}

bool StepDetector::period_matches(size_t begin) const {
  // calls_[begin, begin + period_) repeats the period before it.
  if (begin < period_ || begin + period_ > calls_.size()) return false;
  for (size_t i = 0; i < period_; ++i) {
    if (calls_[begin + i].signature != calls_[begin - period_ + i].signature) return false;
  }
  return true;
}

// Median gap before the calls of each phase of a candidate period P, over the calls from `start`.
std::vector<uint64_t> StepDetector::phase_gaps(size_t start, size_t P) const {
  std::vector<uint64_t> med(P, 0);
  for (size_t j = 0; j < P; ++j) {
    std::vector<uint64_t> gaps;
    for (size_t i = start + j; i < calls_.size(); i += P) {
      if (i == 0) continue;
      const auto& prev = calls_[i - 1];
      gaps.push_back(calls_[i].enter_ns > prev.done_ns ? calls_[i].enter_ns - prev.done_ns : 0);
    }
    if (gaps.empty()) continue;
    std::nth_element(gaps.begin(), gaps.begin() + static_cast<long>(gaps.size() / 2), gaps.end());
    med[j] = gaps[gaps.size() / 2];
  }
  return med;
}

bool StepDetector::try_lock(bool final) {
  const size_t n = calls_.size() - next_;
  // The shortest run of signatures that repeats three times (two could be chance).
  for (size_t p = 1; p <= std::min(kMaxPeriod, n / 3); ++p) {
    bool periodic = true;
    for (size_t i = calls_.size() - 2 * p; i < calls_.size() && periodic; ++i) {
      periodic = calls_[i].signature == calls_[i - p].signature;
    }
    if (!periodic) continue;
    size_t start = calls_.size() - 3 * p;
    while (start > next_ && calls_[start - 1].signature == calls_[start - 1 + p].signature) --start;

    // Identical calls (DDP buckets of one size) repeat with a shorter period than the step: a step
    // is the multiple of p whose pattern has one dominant gap (data loading + forward).
    size_t chosen = 0, boundary = 0;
    bool undecided = false;
    for (size_t k = 1; k <= kMaxMultiple && k * p <= kMaxPeriod; ++k) {
      size_t P = k * p;
      if (calls_.size() - start < 3 * P) {
        undecided = true;
        break;
      }
      auto med = phase_gaps(start, P);
      size_t j = static_cast<size_t>(std::max_element(med.begin(), med.end()) - med.begin());
      uint64_t second = 0;
      for (size_t i = 0; i < P; ++i) {
        if (i != j) second = std::max(second, med[i]);
      }
      bool dominant = P > 1 && med[j] >= kMinBoundaryGapNs && med[j] >= 3 * second;
      if (dominant) {
        chosen = P;
        boundary = j;
        break;
      }
    }
    if (!chosen) {
      if (undecided && !final) return false;  // wait for more calls before deciding
      chosen = p;                   // no timing structure: the signature period it is
      auto med = phase_gaps(start, p);
      boundary = static_cast<size_t>(std::max_element(med.begin(), med.end()) - med.begin());
    }
    size_t first = start + boundary;
    // Calls before the pattern (initial broadcasts, a partial step) end the time before step 1.
    for (size_t i = next_; i < first; ++i) last_end_ns_ = std::max(last_end_ns_, calls_[i].done_ns);
    period_ = chosen;
    next_ = first;
    locked_ = true;
    return true;
  }
  return false;
}

std::vector<DetectedStep> StepDetector::take_steps(bool final) {
  std::vector<DetectedStep> out;
  if (!locked_ && !try_lock(final)) return out;
  // Every pass either emits a period or moves `next_` forward: bounded by the calls we hold.
  for (size_t guard = 0; guard <= calls_.size() + 1; ++guard) {
    size_t end = next_ + period_;
    if (end > calls_.size()) break;
    // A period is confirmed by the start of the next one (or the process ending).
    bool confirmed = end < calls_.size() || final;
    if (!confirmed) break;
    bool same = next_ < period_ || period_matches(next_);
    if (!same) {
      // The pattern changed (evaluation, a new phase): find it again from here.
      size_t old_next = next_, old_period = period_;
      locked_ = false;
      if (!try_lock(final)) break;
      if (next_ == old_next && period_ == old_period) {
        // Found the same pattern at the same place: this call belongs to no step; step over it.
        last_end_ns_ = std::max(last_end_ns_, calls_[next_].done_ns);
        ++next_;
      }
      continue;
    }
    DetectedStep s;
    s.step = ++emitted_;
    uint64_t first_enter = calls_[next_].enter_ns;
    s.start_ns = last_end_ns_ ? last_end_ns_ : (watch_start_ns_ ? std::min(watch_start_ns_, first_enter) : first_enter);
    std::vector<std::pair<uint64_t, uint64_t>> iv;
    for (size_t i = next_; i < end; ++i) {
      s.end_ns = std::max(s.end_ns, calls_[i].done_ns);
      s.device_collective_ns += calls_[i].device_ns;
      iv.emplace_back(calls_[i].enter_ns, calls_[i].done_ns);
    }
    s.collective_ns = union_length(std::move(iv));
    s.calls = period_;
    last_end_ns_ = s.end_ns;
    next_ = end;
    out.push_back(s);
  }
  // Keep the history bounded: what is emitted is only needed as the previous period.
  if (next_ > 2 * kMaxPeriod && calls_.size() > kMaxHistory / 2) {
    size_t drop = next_ - std::max(period_, size_t{1});
    calls_.erase(calls_.begin(), calls_.begin() + static_cast<long>(drop));
    next_ -= drop;
  }
  if (calls_.size() > kMaxHistory && !locked_) {
    size_t drop = calls_.size() - kMaxHistory / 2;
    calls_.erase(calls_.begin(), calls_.begin() + static_cast<long>(drop));
    next_ = next_ > drop ? next_ - drop : 0;
  }
  return out;
}

}  // namespace strata::agent
