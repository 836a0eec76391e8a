// Finds training iterations of one process from its repeating collective pattern, with no help
// from the job: DDP issues the same buckets of all-reduce every step, FSDP the same all-gathers and
// reduce-scatters. Pure logic: fed with calls, it returns completed steps.
//
// Two sources say where a step is:
// - the signatures (op + bytes + communicator): the shortest repeating run of them is the
//   signature period p. When p > 1 the run is anchored by a change of signature (NCCL's buckets of
//   distinct sizes, FSDP's all-gathers then reduce-scatters): a step is p calls, or a small
//   multiple of p when the timing of the first cycles says so.
// - the timing, when every call has the same signature (p = 1: gloo, whose byte counts are not
//   read, makes every call "allreduce:0"). A step is then the multiple P of p in whose cycles one
//   phase's gap (data loading + forward + optimizer, before the first collective of the backward
//   pass) is clearly the largest of its cycle in most cycles, judged over many cycles
//   (kDecideCycles), never from the first few calls. The decision is a function of the call
//   stream alone (fixed call counts, not of when steps are taken), so ranks of a job that see the
//   same pattern get the same answer. The period is re-checked on recent history every few steps
//   and changed when another one fits clearly (an evaluation phase, a changed bucket count); steps
//   already emitted stay as they are.
// Reading gloo's sizes instead was judged too fragile: the byte count sits behind
// gloo::AllreduceOptions, whose layout is private to gloo and differs between its versions (a
// struct of buffers, a class with public members, a pimpl), three pointer hops deep.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/forgetful_set.h"

namespace strata::agent {

struct CollectiveCall {
  std::string signature;  // op + bytes + communicator: what repeats every step
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
  // too even if no later call confirms it, and a pattern seen for fewer cycles than a decision
  // normally needs is decided on what there is (at least kMinCyclesFinal cycles).
  std::vector<DetectedStep> take_steps(bool final = false);

  size_t held_calls() const { return calls_.size(); }  // tests: the history stays bounded
  size_t period() const { return inner_ ? inner_->period() : locked_ ? period_ : 0; }
  uint64_t steps_emitted() const { return emitted_; }
  // Times a re-check changed the period or moved the step boundary (tests, diagnostics).
  uint64_t period_changes() const { return changes_ + (inner_ ? inner_->period_changes() : 0); }
  // Signatures taken as occasional calls between iterations (tests, diagnostics).
  const std::set<std::string>& occasional() const { return occasional_; }

  static constexpr size_t kMaxPeriod = 512;  // collectives per step we can recognize
  static constexpr size_t kMaxHistory = 8192;
  static constexpr size_t kMaxMultiple = 8;               // step = up to 8 repeats of the shortest pattern
  static constexpr uint64_t kMinBoundaryGapNs = 100'000;  // a step boundary gap is at least 100 µs

  // A cycle of a candidate period "shows the boundary" at a phase when the gap before that phase is
  // at least kDominance times every other gap of the cycle. Measured on PyTorch DDP over gloo
  // (3 buckets, 2 ranks on a loaded 2-core machine, 76 iterations): the boundary gap was 2.2x to
  // 36x the largest bucket gap of its iteration (median 3.4x); 1.5x keeps a margin below that,
  // while two gaps of the same kind (two boundaries, two bucket gaps) rarely differ by 1.5x in a
  // row of cycles.
  static constexpr double kDominance = 1.5;
  // A period fits when one phase shows the boundary in at least this share of its cycles. The
  // multiple of the true period that holds two boundaries shows each in about half of its cycles,
  // and a period that is no multiple of it moves the boundary from phase to phase; a fifth of the
  // cycles is left to disturbances (a garbage collection, a checkpoint, a busy machine).
  static constexpr double kMinWinShare = 0.8;
  // Cycles a timing decision is made on: with 16 cycles, a phase of gaps without structure that
  // passes kDominance in (say) 40% of cycles reaches 80% with probability ~1e-3. The first decision
  // waits 16 cycles of the largest candidate (128 calls for gloo's p = 1), not the first calls, and
  // judges every candidate on all of them (a 3-call step gets 42 cycles); a re-check judges each
  // on its last 16 cycles, so that a changed pattern is found within about 16 of its iterations.
  static constexpr size_t kDecideCycles = 16;
  // The fewest cycles that decide a pattern when the process ends before kDecideCycles (a short
  // job): three, as a pattern needs three repeats to be one.
  static constexpr size_t kMinCyclesFinal = 3;
  // A run anchored by its signatures already fixes the step to p calls; the timing only chooses
  // between p and its multiples, decided on the first cycles (three of every phase, as before:
  // NCCL jobs keep their behaviour). With two of some phases, noise made a multiple fit in 26 of
  // 2000 seeded streams without a step gap (tests/unit/step_detector_test.cpp); with three, 1
  // (the detector before: 2).
  static constexpr size_t kMinCyclesDistinct = 3;
  // The period of calls all alike is re-checked every kRecheckSteps steps (at least
  // kRecheckMinCalls calls): a changed pattern is found within about kDecideCycles of its
  // iterations, and checks stay cheap (O(calls of the windows), about 1000 for gloo's p = 1).
  static constexpr size_t kRecheckSteps = 4;
  static constexpr size_t kRecheckMinCalls = 16;
  // The period in force is re-chosen from the last kDecideCycles cycles only once its boundary
  // shows at its phase in fewer than half of them: a changed pattern leaves the old boundary in far
  // fewer (a moved boundary: almost none), while 4 stalls in 16 iterations (seen in the tests'
  // streams) leave 75% and can make a fraction of the step fit better for a while.
  static constexpr double kKeepShare = 0.5;
  // An occasional call: a signature that comes once per period of the signatures while the rest of
  // the period is one shorter pattern repeated (a barrier, an evaluation's or a checkpoint's sync every
  // N iterations: [A A] x 10 + barrier). The period of the signatures is then N iterations, not one.
  // When the calls without it fit a step by their timing (a boundary gap, as for gloo's calls all
  // alike) that is at most 1/kMinOccasionalRepeats of the period, the steps are cut from those calls
  // and the occasional call's time joins the step it falls in. Three, as a pattern needs three
  // repeats to be one; a step whose last bucket has a size of its own (NCCL: [A x 160, B]) fits no
  // timing over its A's alone (its boundary gap comes once per 160 calls) and keeps its period.
  static constexpr size_t kMinOccasionalRepeats = 3;
  // Calls all alike whose iterations do not all hold one number of calls (gloo with a metrics
  // all-reduce every N iterations: [A A A] x 9 + [A A A A], whose extra A has the signature of
  // the rest since gloo's sizes are not read): no fixed period fits (its boundary moves a phase
  // every N iterations), but the boundary gap still stands out. Then a step ends at every gap of
  // at least a cut, where the sorted gaps jump by kDominance (the boundary gaps above, the gaps
  // between buckets below), taken only when the steps it cuts are iterations: at least
  // kDecideCycles of them in the calls decided on, and kMinWinShare of them with two calls or
  // more (one call per step is the period of 1 that needs no cut).
  static constexpr size_t kMinCutCalls = 2;

 private:
  struct Fit {
    size_t period = 0;    // calls per step
    size_t boundary = 0;  // index (into calls_) of a call that starts a step
    double share = 0;     // of the cycles that show the boundary at that phase
    bool fits = false;    // one phase shows the boundary clearly (kMinWinShare)
  };
  struct PhaseWins {
    size_t start = 0;  // first call of the window
    std::vector<size_t> wins, seen;
    std::vector<uint64_t> total;  // sum of the gaps before the phase
  };

  bool try_lock(bool final);
  // Locks on steps of `period` calls (the most common count, when cut by a gap) from call `first`
  // of a pattern of signature period p that begins at `start`, decided on the calls before `decided_at`.
  void lock_at(size_t first, size_t period, bool alike, size_t p, size_t start, size_t decided_at);
  // Calls all alike over [from, end) whose steps are cut by a gap (kMinCutCalls): the cut (ns) and
  // the most common calls per step, or {0, 0} when none cuts iterations.
  std::pair<uint64_t, size_t> gap_cut(size_t from, size_t end, size_t min_steps) const;
  // Cut mode: the index of the call that starts the step after the one starting at `begin`
  // (the next call after a gap of at least cut_ns_), or calls_.size() when none came yet.
  size_t next_cut(size_t begin) const;
  // Forgets the oldest `drop` calls (indices shift; base_ counts what was dropped).
  void drop_front(size_t drop);
  // Calls [from, to) all have one signature.
  bool all_alike(size_t from, size_t to) const;
  bool part_of_longer(size_t p, size_t start) const;
  bool period_matches(size_t begin) const;
  // How well period P fits the cycles of calls [end - cycles * P, end): its best phase.
  Fit score(size_t P, size_t end, size_t cycles) const;
  void phase_wins(size_t P, size_t end, size_t cycles, PhaseWins& w) const;
  // Share of the cycles that show the boundary at the phase of call `boundary`.
  double share_at(size_t P, size_t end, size_t cycles, size_t boundary) const;
  // Calls all alike: the largest multiple of p that fits over its last cycles (up to
  // `max_cycles`) ending at `end`, counting only calls from `from`; candidates with fewer than
  // `min_cycles` cycles there are not tried. A fraction of the step can fit too, when bucket gaps
  // have a fixed order of sizes: hence the largest, not the smallest. Period 0: none fits.
  Fit choose_alike(size_t from, size_t end, size_t p, size_t min_cycles, size_t max_cycles) const;
  // Calls a first decision on a pattern of signature period p looks at: kDecideCycles cycles of
  // its largest candidate.
  static size_t decide_calls(size_t p);
  // The longest step tried for a pattern of signature period p.
  static size_t largest_candidate(size_t p);
  void recheck(size_t end);
  size_t recheck_interval() const;
  // The anchored period p starting at `start` holds occasional calls (kMinOccasionalRepeats): the
  // detector that cuts the calls without them (inner_) once its timing decides; false while it
  // cannot tell yet (`undecided`) or when it does not hold.
  bool split_occasional(size_t start, size_t p, bool final, bool& undecided);
  std::vector<DetectedStep> take_inner_steps(bool final);

  uint64_t watch_start_ns_;
  std::vector<CollectiveCall> calls_;
  std::vector<uint64_t> gaps_;  // gap before each call: its enter minus the latest done before it
  uint64_t max_done_ = 0;
  uint64_t base_ = 0;  // calls dropped from the front of calls_ so far
  bool locked_ = false;
  bool alike_ = false;         // the locked pattern's calls all have one signature (p = 1)
  bool timed_ = false;         // alike_, and the period in force fits the timing
  uint64_t cut_ns_ = 0;        // alike_, no period fits, steps end at gaps of at least this (gap_cut)
  size_t sig_period_ = 0;      // p of the locked pattern
  size_t pattern_start_ = 0;   // index where the locked signature pattern begins
  uint64_t next_recheck_ = 0;  // absolute call count at which the period is next re-checked
  size_t period_ = 0;
  size_t next_ = 0;  // index of the first call of the next period to emit
  uint64_t emitted_ = 0;
  uint64_t changes_ = 0;
  uint64_t last_end_ns_ = 0;  // end of the last emitted step (or of pre-pattern calls)
  // Occasional calls (split_occasional): inner_ cuts the others into steps; the occasional ones
  // wait in extras_ until a step that holds them is emitted. Signatures tried and rejected are
  // not tried again.
  std::unique_ptr<StepDetector> inner_;
  std::set<std::string> occasional_;
  // Signatures tried as occasional calls and refused. A job whose sizes vary (dynamic shapes) makes
  // new signatures for as long as it runs; past this many the set is forgotten, and a signature
  // refused before may be tried again (a trial's CPU, never a wrong step).
  static constexpr size_t kMaxRejectedSignatures = 1024;
  ForgetfulSet<std::string> rejected_{kMaxRejectedSignatures};
  std::vector<CollectiveCall> extras_;
  std::vector<DetectedStep> pending_;  // emitted by inner_ while it was tried
  // The detector split_occasional tries while it cannot decide yet, kept between takes and fed only
  // the calls that arrived since (rebuilding it from every held call made each take cost all of
  // them). It holds the calls from absolute index `from` up to `fed` without the `once` ones, and
  // began at `emitted`/`last_end_ns`; one that undecided takes left as a fresh one fed the same
  // calls would be (no rejections of its own) is the only kind kept.
  struct Trial {
    std::unique_ptr<StepDetector> detector;
    uint64_t from = 0, fed = 0;
    std::set<std::string> once;
    uint64_t emitted = 0, last_end_ns = 0;
    std::vector<CollectiveCall> extras;  // the `once` calls among them
  };
  std::unique_ptr<Trial> trial_;
};

}  // namespace strata::agent
