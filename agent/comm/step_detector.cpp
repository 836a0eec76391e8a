#include "agent/comm/step_detector.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <set>

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
  if (inner_) {
    if (!occasional_.count(call.signature)) return inner_->add(std::move(call));
    extras_.push_back(std::move(call));
    if (extras_.size() > kMaxHistory) extras_.erase(extras_.begin(), extras_.begin() + kMaxHistory / 2);
    return;
  }
  // The gap before a call: time since every earlier collective was done (gloo runs a step's
  // buckets on two worker threads, so a call can start before the previous one returned).
  gaps_.push_back(max_done_ && call.enter_ns > max_done_ ? call.enter_ns - max_done_ : 0);
  max_done_ = std::max(max_done_, call.done_ns);
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

std::pair<uint64_t, size_t> StepDetector::gap_cut(size_t from, size_t end, size_t min_steps) const {
  if (end <= from + 1) return {0, 0};
  std::vector<uint64_t> sorted(gaps_.begin() + static_cast<long>(from) + 1, gaps_.begin() + static_cast<long>(end));
  std::sort(sorted.begin(), sorted.end());
  // From the largest gaps down (fewest cuts first, as choose_alike prefers the largest period): the
  // first jump of kDominance in the sorted gaps whose steps are iterations. A jump in the whole
  // distribution, not per step: a cut chosen per step would fit any noise (a threshold always
  // separates the gaps it cuts at from those it does not).
  for (size_t i = sorted.size() - 1; i > 0; --i) {
    const uint64_t hi = sorted[i], lo = sorted[i - 1];
    if (hi < kMinBoundaryGapNs) break;
    if (static_cast<double>(hi) < kDominance * static_cast<double>(lo)) continue;
    size_t begin = 0, steps = 0, multi = 0;
    std::map<size_t, size_t> lengths;  // calls per step -> steps
    for (size_t j = from + 1; j < end; ++j) {
      if (gaps_[j] < hi) continue;
      if (begin) {  // a whole step [begin, j)
        ++steps;
        ++lengths[j - begin];
        if (j - begin >= kMinCutCalls) ++multi;
      }
      begin = j;
    }
    if (steps < min_steps || static_cast<double>(multi) < kMinWinShare * static_cast<double>(steps)) continue;
    size_t common = 0, most = 0;
    for (const auto& [len, n] : lengths) {
      if (n > most) {
        most = n;
        common = len;
      }
    }
    // The cut between the two gaps: a boundary a little shorter than every one seen is still one.
    return {lo + (hi - lo) / 2, common};
  }
  return {0, 0};
}

size_t StepDetector::next_cut(size_t begin) const {
  for (size_t j = begin + 1; j < calls_.size(); ++j) {
    if (gaps_[j] >= cut_ns_) return j;
  }
  return calls_.size();
}

void StepDetector::drop_front(size_t drop) {
  calls_.erase(calls_.begin(), calls_.begin() + static_cast<long>(drop));
  gaps_.erase(gaps_.begin(), gaps_.begin() + static_cast<long>(drop));
  base_ += drop;
  next_ = next_ > drop ? next_ - drop : 0;
  pattern_start_ = pattern_start_ > drop ? pattern_start_ - drop : 0;
}

bool StepDetector::all_alike(size_t from, size_t to) const {
  for (size_t i = from + 1; i < to; ++i) {
    if (calls_[i].signature != calls_[from].signature) return false;
  }
  return true;
}

bool StepDetector::part_of_longer(size_t p, size_t start) const {
  // calls_[start, end) repeat with period p and calls_[start - 1] breaks it. A longer q that repeats
  // over the same calls and the one before them too holds p's run inside its own: p is a part of
  // the step (a pipeline stage's microbatches, [recv A A A] x 4 then [A A A send] x 4 then the
  // step's all-reduce, whose p = 4 run ends where the step's next part begins), not the step. A
  // multiple of p cannot hold where p breaks, so q is never p's own multiple.
  if (start <= next_) return false;
  const size_t n = calls_.size() - next_;
  for (size_t q = p + 1; q <= std::min(kMaxPeriod, n / 3); ++q) {
    // Over the last 2q calls at least (q repeats at the end), and back to the call before p's run.
    const size_t from = std::min(start - 1 + q, calls_.size() - q);
    bool periodic = true;
    for (size_t i = calls_.size(); i-- > from && periodic;) periodic = calls_[i].signature == calls_[i - q].signature;
    if (periodic && !all_alike(calls_.size() - 2 * q, calls_.size())) return true;
  }
  return false;
}

void StepDetector::phase_wins(size_t P, size_t end, size_t cycles, PhaseWins& w) const {
  w.start = end - cycles * P;
  w.wins.assign(P, 0);
  w.seen.assign(P, 0);
  w.total.assign(P, 0);
  // Largest gap inside each candidate step (b, b + P): a sliding-window maximum, O(window).
  std::deque<size_t> inner;  // indices with decreasing gaps
  size_t next_in = w.start + 1;
  for (size_t b = w.start; b + P <= end; ++b) {
    for (; next_in < b + P; ++next_in) {
      while (!inner.empty() && gaps_[inner.back()] <= gaps_[next_in]) inner.pop_back();
      inner.push_back(next_in);
    }
    while (!inner.empty() && inner.front() <= b) inner.pop_front();
    const uint64_t largest_inner = inner.empty() ? 0 : gaps_[inner.front()];
    const size_t j = (b - w.start) % P;
    if (base_ + b == 0) continue;  // the first call ever seen: no gap before it is known
    ++w.seen[j];
    w.total[j] += gaps_[b];
    if (gaps_[b] >= kMinBoundaryGapNs &&
        static_cast<double>(gaps_[b]) >= kDominance * static_cast<double>(largest_inner))
      ++w.wins[j];
  }
}

StepDetector::Fit StepDetector::score(size_t P, size_t end, size_t cycles) const {
  Fit f;
  f.period = P;
  if (P == 0 || cycles == 0 || end < cycles * P || end > calls_.size()) return f;
  f.boundary = end - cycles * P;
  if (P < 2) return f;  // one call per cycle: no other gap to compare with
  PhaseWins w;
  phase_wins(P, end, cycles, w);
  size_t best = 0;
  for (size_t j = 1; j < P; ++j) {
    // Most cycles won; among equals (none won: no timing structure), the largest gaps.
    if (w.wins[j] > w.wins[best] || (w.wins[j] == w.wins[best] && w.total[j] > w.total[best])) best = j;
  }
  f.boundary = w.start + best;
  f.share = w.seen[best] ? static_cast<double>(w.wins[best]) / static_cast<double>(w.seen[best]) : 0;
  f.fits = f.share >= kMinWinShare;
  return f;
}

double StepDetector::share_at(size_t P, size_t end, size_t cycles, size_t boundary) const {
  if (P < 2 || cycles == 0 || end < cycles * P || end > calls_.size()) return 0;
  PhaseWins w;
  phase_wins(P, end, cycles, w);
  const size_t j = (boundary + P - w.start % P) % P;
  return w.seen[j] ? static_cast<double>(w.wins[j]) / static_cast<double>(w.seen[j]) : 0;
}

StepDetector::Fit StepDetector::choose_alike(size_t from, size_t end, size_t p, size_t min_cycles,
                                             size_t max_cycles) const {
  Fit chosen;
  for (size_t P = p; P <= largest_candidate(p); P += p) {
    const size_t cycles = std::min(max_cycles, (end - from) / P);
    if (cycles < min_cycles) continue;
    Fit f = score(P, end, cycles);
    // The largest that fits: a fraction of the step fits as well when the bucket gaps have a fixed
    // order of sizes (4 buckets with gaps 1300, 500, 400, 30 ms fit P = 2), while a multiple of the
    // step holds two boundaries and fits only if every other boundary is 1.5x the next.
    if (f.fits) chosen = f;
  }
  return chosen;
}

size_t StepDetector::recheck_interval() const {
  return std::max(kRecheckMinCalls, kRecheckSteps * std::max(period_, size_t{1}));
}

size_t StepDetector::largest_candidate(size_t p) {
  // Up to kMaxMultiple repeats, within kMaxPeriod, and with kDecideCycles cycles inside the
  // history an undecided pattern keeps (kMaxHistory / 2 after a trim).
  size_t k = std::min({kMaxMultiple, kMaxPeriod / p, kMaxHistory / 2 / kDecideCycles / p});
  return std::max(k, size_t{1}) * p;
}

size_t StepDetector::decide_calls(size_t p) { return kDecideCycles * largest_candidate(p); }

void StepDetector::recheck(size_t end) {
  if (end < pattern_start_ + kDecideCycles * period_) return;  // too little of this pattern yet
  Fit f;
  const size_t cycles = std::min(kDecideCycles, (end - pattern_start_) / period_);
  if (timed_ && share_at(period_, end, cycles, next_) < kKeepShare) {
    // The period in force lost its boundary (a changed pattern, or a moved boundary): what fits
    // the last cycles of each candidate, to follow the change within about kDecideCycles of them.
    f = choose_alike(pattern_start_, end, sig_period_, kDecideCycles, kDecideCycles);
  } else {
    // The period in force still holds (or none was found yet): a change needs the evidence of a
    // first decision, every candidate on the same many calls, and, for a timed period, a multiple
    // of it (it was a fraction of the step). Else a stretch of stalls, or noise in a few cycles of
    // a long candidate, would move a period that is right.
    const size_t from =
        std::max(pattern_start_, end >= decide_calls(sig_period_) ? end - decide_calls(sig_period_) : 0);
    f = choose_alike(from, end, sig_period_, kDecideCycles, SIZE_MAX);
    if (f.fits && timed_ && !(f.period > period_ && f.period % period_ == 0)) return;
  }
  if (!f.fits) {
    // Nothing fits clearly (a disturbed stretch): keep what we have. Steps cut by a gap follow
    // the gaps of the last calls (a job whose speed drifted moves its boundary gap).
    if (cut_ns_) {
      const size_t from = std::max(pattern_start_, end >= decide_calls(sig_period_) ? end - decide_calls(sig_period_) : 0);
      if (auto [cut, common] = gap_cut(from, end, kDecideCycles); cut) {
        cut_ns_ = cut;
        period_ = common;
      }
    }
    return;
  }
  const size_t P = f.period;
  // The first boundary of the fitting period at or after the next call to emit.
  size_t b = f.boundary >= next_ ? f.boundary - (f.boundary - next_) / P * P
                                 : f.boundary + (next_ - f.boundary + P - 1) / P * P;
  if (P == period_ && b == next_ && !cut_ns_) return;
  cut_ns_ = 0;  // a fixed period fits again
  // Calls up to the new boundary (less than one step) belong to no step.
  for (size_t i = next_; i < b && i < calls_.size(); ++i)
    last_end_ns_ = std::max(last_end_ns_, calls_[i].done_ns);
  period_ = P;
  next_ = b;
  timed_ = true;
  ++changes_;
}

void StepDetector::lock_at(size_t first, size_t period, bool alike, size_t p, size_t start, size_t decided_at) {
  // Calls before the pattern (initial broadcasts, a partial step) end the time before step 1.
  for (size_t i = next_; i < first; ++i) last_end_ns_ = std::max(last_end_ns_, calls_[i].done_ns);
  period_ = period;
  next_ = first;
  locked_ = true;
  alike_ = alike;
  sig_period_ = p;
  pattern_start_ = start;
  next_recheck_ = base_ + std::max(decided_at, first) + recheck_interval();
  trial_.reset();  // a trial of the occasional calls is not needed once locked
}

bool StepDetector::try_lock(bool final) {
  cut_ns_ = 0;
  const size_t n = calls_.size() - next_;
  // The shortest run of signatures that repeats three times (two could be chance).
  for (size_t p = 1; p <= std::min(kMaxPeriod, n / 3); ++p) {
    bool periodic = true;
    for (size_t i = calls_.size() - 2 * p; i < calls_.size() && periodic; ++i) {
      periodic = calls_[i].signature == calls_[i - p].signature;
    }
    if (!periodic) continue;
    // Past p = 1 only after a run of calls all alike too short to decide (below): a longer
    // pattern must hold more than that one signature (one that does is p = 1's run again).
    if (p > 1 && all_alike(calls_.size() - 2 * p, calls_.size())) continue;
    size_t start = calls_.size() - 3 * p;
    while (start > next_ && calls_[start - 1].signature == calls_[start - 1 + p].signature) --start;
    if (p > 1 && part_of_longer(p, start)) continue;

    // Every call alike (p = 1: gloo's "allreduce:0"): the signatures say nothing of the step. A
    // longer run is anchored by a change of signature (NCCL's bucket sizes, FSDP's all-gathers then
    // reduce-scatters), even if a signature repeats inside it: that run is the step, or a multiple.
    const bool alike = p == 1;

    Fit chosen;
    size_t decided_at = start;  // calls the decision looked at end here
    if (alike) {
      // Decided on a fixed number of calls from the pattern's start, whatever the time of this
      // call: every rank that sees the same pattern decides on the same calls.
      const size_t need = decide_calls(p);
      size_t min_cycles = kDecideCycles;
      if (calls_.size() - start >= need) {
        decided_at = start + need;
      } else if (final) {
        decided_at = calls_.size();
        min_cycles = kMinCyclesFinal;
      } else {
        // Too few cycles since the last change of signature. That change may be an occasional
        // call ([A A A] x 10 + barrier: a run of A's never reaches the calls a decision needs), so
        // a longer pattern that ends here is looked for; none: wait for enough cycles. Before, the
        // detector looked only at p = 1 whenever the latest call was an A, so such a job locked
        // only when a window happened to end on its barrier (a 160-iteration DDP job: never).
        continue;
      }
      // Every candidate on all of these calls: the shorter ones get more cycles (a fraction of the
      // step that fits in a few cycles by chance does not in many; a cluster of stalls weighs less).
      chosen = choose_alike(start, decided_at, p, min_cycles, SIZE_MAX);
      timed_ = chosen.fits;
      if (!chosen.fits) {
        // No fixed period: iterations of varying calls, cut at their boundary gap (kMinCutCalls).
        if (auto [cut, common] = gap_cut(start, decided_at, min_cycles); cut) {
          cut_ns_ = cut;
          size_t first = start + 1;
          while (first < decided_at && gaps_[first] < cut) ++first;
          lock_at(first, common, alike, p, start, decided_at);
          return true;
        }
      }
      if (!chosen.period) {
        // No timing structure: the signature period it is.
        chosen = score(p, decided_at, std::min(kDecideCycles, (decided_at - start) / p));
      }
    } else {
      // Anchored by its signatures: p calls, or the smallest multiple of p whose first cycles show
      // one dominant gap (the same calls issued several times per step).
      // One cycle more than kMinCyclesDistinct: every phase, not only the first, is judged on
      // that many (a phase other than the first has one cycle less in a window).
      bool split_undecided = false;
      if (split_occasional(start, p, final, split_undecided)) return true;
      if (split_undecided) return false;  // wait until the calls without the occasional ones decide
      const size_t cycles = kMinCyclesDistinct + 1;
      timed_ = false;  // not re-checked: a change shows in the signatures
      bool undecided = false;
      for (size_t k = 1; k <= kMaxMultiple && k * p <= kMaxPeriod; ++k) {
        const size_t P = k * p;
        if (calls_.size() - start < cycles * P) {
          undecided = true;
          break;
        }
        Fit f = score(P, start + cycles * P, cycles);
        decided_at = std::max(decided_at, start + cycles * P);
        if (f.fits) {
          chosen = f;
          break;
        }
      }
      if (!chosen.period) {
        if (undecided && !final) return false;  // wait for more calls before deciding
        const size_t have = std::min(cycles, (calls_.size() - start) / p);  // >= 3: p repeats 3 times
        chosen = score(p, start + have * p, have);
      }
    }
    lock_at(start + (chosen.boundary - start) % chosen.period, chosen.period, alike, p, start, decided_at);
    return true;
  }
  return false;
}

bool StepDetector::split_occasional(size_t start, size_t p, bool final, bool& undecided) {
  undecided = false;
  std::map<std::string, size_t> count;
  for (size_t i = start; i < start + p; ++i) ++count[calls_[i].signature];
  std::set<std::string> once;
  for (const auto& [sig, n] : count) {
    if (n == 1 && !rejected_.contains(sig)) once.insert(sig);
  }
  if (once.empty() || p - once.size() < kMinOccasionalRepeats) {
    trial_.reset();
    return false;
  }
  const size_t rest = p - once.size();
  // The calls not emitted yet, without the occasional ones, through a detector of their own: the
  // one of the last take when it holds the same calls (they are the same stream from the same
  // place), fed the calls since; else a new one fed them all.
  const uint64_t from = base_ + next_, end = base_ + calls_.size();
  if (!trial_ || trial_->from != from || trial_->fed > end || trial_->once != once || trial_->emitted != emitted_ ||
      trial_->last_end_ns != last_end_ns_) {
    trial_ = std::make_unique<Trial>();
    trial_->detector = std::make_unique<StepDetector>(watch_start_ns_);
    trial_->detector->emitted_ = emitted_;
    trial_->detector->last_end_ns_ = last_end_ns_;
    trial_->from = trial_->fed = from;
    trial_->once = once;
    trial_->emitted = emitted_;
    trial_->last_end_ns = last_end_ns_;
  }
  StepDetector& trial = *trial_->detector;
  for (uint64_t i = trial_->fed; i < end; ++i) {
    const CollectiveCall& c = calls_[static_cast<size_t>(i - base_)];
    if (once.count(c.signature)) trial_->extras.push_back(c);
    else trial.add(c);
  }
  trial_->fed = end;
  auto steps = trial.take_steps(final);
  if (!trial.locked_ || trial.inner_) {
    // Not decided yet (calls all alike wait for kDecideCycles cycles), or nothing repeats.
    undecided = !final && !trial.inner_;
    if (!undecided) {
      for (const auto& sig : once) rejected_.insert(sig);
    }
    // Kept for the next take only as a new one fed the same calls would be: an undecided take
    // changes nothing else in it (it holds every call it was fed, and locks nothing), but the
    // signatures its own trials rejected would be tried again by a new one.
    if (!undecided || !trial.rejected_.empty()) trial_.reset();
    return false;
  }
  // The step the rest fits: by its timing when its calls are all alike (a period chosen for want
  // of a boundary gap is no evidence), by its signatures otherwise; and a step that repeats within
  // the period at least kMinOccasionalRepeats times.
  const bool evidence = trial.alike_ ? trial.timed_ || trial.cut_ns_ : true;
  if (!evidence || trial.period_ * kMinOccasionalRepeats > rest) {
    for (const auto& sig : once) rejected_.insert(sig);
    trial_.reset();
    return false;
  }
  inner_ = std::move(trial_->detector);
  occasional_ = std::move(once);
  extras_ = std::move(trial_->extras);
  pending_ = std::move(steps);
  trial_.reset();
  calls_.clear();
  gaps_.clear();
  return true;
}

std::vector<DetectedStep> StepDetector::take_inner_steps(bool final) {
  std::vector<DetectedStep> out = std::move(pending_);
  pending_.clear();
  for (auto& s : inner_->take_steps(final)) out.push_back(s);
  // Each occasional call joins the step it falls in (its time in collectives); those before the
  // first step belong to none, those after the last wait for the next (or, at the end, to none).
  size_t used = 0;
  for (auto& s : out) {
    while (used < extras_.size() && extras_[used].enter_ns <= s.end_ns) {
      const auto& e = extras_[used++];
      if (e.enter_ns < s.start_ns) continue;
      s.collective_ns += std::min(e.done_ns, s.end_ns) - e.enter_ns;
      s.device_collective_ns += e.device_ns;
    }
  }
  extras_.erase(extras_.begin(), extras_.begin() + static_cast<long>(final ? extras_.size() : used));
  emitted_ = inner_->emitted_;
  return out;
}

std::vector<DetectedStep> StepDetector::take_steps(bool final) {
  std::vector<DetectedStep> out;
  if (inner_) return take_inner_steps(final);
  if (!locked_ && !try_lock(final)) {
    // Nothing repeats (yet): the history stays bounded all the same (a process whose collectives
    // never show a pattern kept every call it made).
    if (calls_.size() > kMaxHistory) drop_front(calls_.size() - kMaxHistory / 2);
    return out;
  }
  if (inner_) return take_inner_steps(final);
  // Every pass emits a period, moves `next_` forward, or moves the next re-check forward: bounded
  // by the calls we hold.
  for (size_t guard = 0; guard <= 2 * calls_.size() + 2; ++guard) {
    if (alike_ && next_recheck_ - base_ <= calls_.size()) {
      // A re-check falls at a fixed call count: steps that end before it are emitted under the
      // period in force, the rest under what the re-check finds.
      const size_t r = static_cast<size_t>(next_recheck_ - base_);
      if ((cut_ns_ ? next_cut(next_) : next_ + period_) > r) {
        recheck(r);
        next_recheck_ += recheck_interval();
        continue;
      }
    }
    size_t end = cut_ns_ ? next_cut(next_) : next_ + period_;
    if (end > calls_.size() || end == next_) break;
    // A period is confirmed by the start of the next one (or the process ending).
    bool confirmed = end < calls_.size() || final;
    if (!confirmed) break;
    // The first period of the pattern has no period of it before to match (what is before is
    // pre-pattern calls: DDP's broadcasts after its first iteration). Steps cut by a gap: calls
    // of the pattern's one signature.
    bool same = cut_ns_ ? all_alike(next_, end) && calls_[next_].signature == calls_[pattern_start_].signature
                        : next_ < pattern_start_ + period_ || period_matches(next_);
    if (!same) {
      // The pattern changed (evaluation, a new phase): find it again from here.
      size_t old_next = next_, old_period = period_;
      locked_ = false;
      if (!try_lock(final)) break;
      if (inner_) {  // the new pattern holds occasional calls: its own detector from here
        for (auto& st : take_inner_steps(final)) out.push_back(st);
        return out;
      }
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
    s.start_ns = last_end_ns_ ? last_end_ns_
                              : (watch_start_ns_ ? std::min(watch_start_ns_, first_enter) : first_enter);
    std::vector<std::pair<uint64_t, uint64_t>> iv;
    for (size_t i = next_; i < end; ++i) {
      s.end_ns = std::max(s.end_ns, calls_[i].done_ns);
      s.device_collective_ns += calls_[i].device_ns;
      iv.emplace_back(calls_[i].enter_ns, calls_[i].done_ns);
    }
    s.collective_ns = union_length(std::move(iv));
    s.calls = end - next_;
    last_end_ns_ = s.end_ns;
    next_ = end;
    out.push_back(s);
  }
  // Keep the history bounded: what is emitted is only needed as the previous period and, for a
  // timed period, as the cycles its re-checks look at.
  size_t keep = std::max(period_, size_t{1});
  if (locked_ && alike_) keep = std::max(keep, decide_calls(sig_period_));
  if (next_ > keep + 2 * kMaxPeriod && calls_.size() > kMaxHistory / 2) drop_front(next_ - keep);
  if (calls_.size() > kMaxHistory && !locked_) drop_front(calls_.size() - kMaxHistory / 2);
  return out;
}

}  // namespace strata::agent
