// Layered differential diagnosis (DESIGN §6): detect against the job's own baseline, localize by
// comparing ranks that should behave alike, descend the layers on the culprit vs. its peers, and
// rank hypotheses by the time per step each explains.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "diagnose/cause.h"
#include "diagnose/model.h"

namespace strata::diagnose {

struct Options {
  double hang_s = 10;             // no collective progress this long, processes alive: a hang
  double min_slowdown = 0.05;     // step time above baseline by this fraction counts as slow
  double min_spatial = 0.15;      // without a baseline: one rank's extra busy time, fraction of step
};

struct Finding {
  Scope scope = Scope::kRank;
  int rank = -1;       // -1 for a job-scope finding
  std::string node;
  std::string layer;   // os | cpu | gpu | comm
  Cause cause = Cause::kHostHotspot;
  std::string culprit; // process, function, GPU, link
  double lost_ms_per_step = 0;
  double confidence = 0;  // 0..1
  std::vector<std::string> evidence;
  std::string advice;  // what to do about it
};

// The second opinion over time (eACGM's Gaussian mixture, diagnose/gmm.h): every (rank, step) of
// the baseline and the window is a point of per-step metrics; a mixture fitted over all of them
// finds populations of steps, and one that is new in the window says what changed and where. It
// needs no peers: it speaks for 2 ranks, and for 1 about the job over time.
struct OverTimeOpinion {
  bool fitted = false;            // false: no per-step series, or too few steps (no opinion)
  size_t points = 0;              // (rank, step) points classified
  size_t k = 0;                   // components BIC chose
  std::vector<int> outlier_ranks; // ranks whose window steps fall mostly in a new component, by share
  std::vector<double> shares;     // per outlier: that share (0..1)
  bool job_wide = false;          // every rank's window steps moved alike: the whole job changed
  std::vector<std::string> notes; // per new component: where it is and its most changed axes
  std::string summary;
};

// The statistical second opinion: robust z-scores of per-rank metric vectors (and per-function
// on-CPU time), independent of the layered rules; and beside it the opinion over time.
struct SecondOpinion {
  std::vector<int> outlier_ranks;     // ordered by score
  std::vector<std::string> notes;     // per outlier: its most deviant metrics
  bool compared = false;  // false: too few ranks to compare (no opinion, never a disagreement)
  // Whether the findings and either statistical opinion disagree: a model flags a rank the findings
  // do not name, or the top finding names a rank neither model flags (engine.cpp).
  bool disagrees = false;
  std::string summary;
  OverTimeOpinion over_time;
};

struct Diagnosis {
  std::string job;
  size_t ranks = 0;
  double step_ms = kUnknown;           // the job's step time in the window
  double baseline_step_ms = kUnknown;  // before it
  std::vector<Finding> findings;       // most costly first; empty: healthy, unless `note` says otherwise
  std::string note;                    // the job slowed and nothing explains it (then no finding)
  // Stragglers no layer explains: where the time is lost is known (rank, node, how
  // much), why is not. Not findings (a culprit is a resolved name that explains a stated share of
  // the loss), and not a healthy window either: the collector keeps it out of the job's past.
  struct Unexplained {
    int rank = -1;
    std::string node;
    double lost_ms_per_step = 0;
    std::string text;  // where the time goes, what was ruled out, what to look at
  };
  std::vector<Unexplained> unexplained;
  // Stragglers a finding explains as its victims (another rank's own work took their CPUs): their
  // evidence is in that finding; the second opinions may flag them without disagreeing.
  std::vector<int> victims;
  // The job slowed with no straggler among the ranks whose data is in, and some ranks' latest data
  // has not reached the store yet (late_ranks): the verdict waits for it (`note` says whose). Not a
  // healthy window: the collector does not fold it into the job's past.
  bool waiting_for_data = false;
  std::vector<std::string> data_notes; // what the loader changed in the data (JobWindow::data_notes)
  SecondOpinion second;
};

Diagnosis diagnose(const JobWindow& job, const Options& options = {});

// No finding, no note, no unexplained straggler, no wait for late data.
bool healthy(const Diagnosis& dx);
// A window the job's past may be built from: no finding, no straggler no layer explains, no wait
// for late ranks' data (judged again when it arrives). A job that slowed alike with nothing to
// explain it (a note) may: a lasting drift becomes the job's normal rather than a note forever.
bool may_join_past(const Diagnosis& dx);

// The second opinion alone (diagnose() calls it and compares), over time included.
SecondOpinion second_opinion(const JobWindow& job);
// The opinion over time alone, from the ranks' per-step series (RankWindow::series).
OverTimeOpinion over_time_opinion(const JobWindow& job);

// A function's name for a report: "ns::Class::fn(int) [clone .isra.0]" -> "fn".
std::string short_function(std::string_view name);

// "a;b;c" -> {"a", "b", "c"}: a call path's frames, root first (views into `path`).
std::vector<std::string_view> split_path(std::string_view path);

// A frame that names no code: "[unknown]+0x3b7a609f", "[anon]+0x7f..", "[heap]+0x10", "libx.so+0x1f0",
// "0x7f12..". Evidence of a broken stack, never a culprit.
bool unresolved_frame(std::string_view frame);

// The function a call path is in, for comparisons by function: its deepest Python function when
// it has one (the frames below are the interpreter's), else its deepest resolved frame's short
// name; "" when every frame is unresolved.
std::string function_key(const JobWindow& job, std::string_view path);

}  // namespace strata::diagnose
