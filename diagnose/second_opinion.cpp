// The second opinion (eACGM's idea, made robust): every rank is a vector of metrics; a rank whose
// vector sits far from the job's on any axis, in robust z-scores, is an outlier. The axes are the
// layers' metrics and, as PerfTracker compares function behaviour across workers, the time per step
// each function (call path) takes on-CPU and blocked. It knows nothing of layers or causes, so it
// catches what the rules miss and shows when they see something else.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <unordered_map>

#include "diagnose/engine.h"
#include "diagnose/gmm.h"
#include "diagnose/stats.h"

namespace strata::diagnose {

namespace {

struct Feature {
  const char* name;
  std::function<double(const RankWindow&)> get;
  double abs_floor_ms;  // differences below this are never anomalous (timer and sampling noise)
};

std::vector<Feature> features() {
  std::vector<Feature> f = {
      {"busy", [](const RankWindow& r) { return r.now.busy_ms(); }, 2.0},
      {"collective wait", [](const RankWindow& r) { return r.now.wait_ms; }, 2.0},
      {"GPU compute", [](const RankWindow& r) { return r.now.device_compute_ms; }, 2.0},
      {"GPU idle", [](const RankWindow& r) { return r.now.gpu_idle_ms; }, 2.0},
  };
  for (size_t m = 0; m < kOsCount; ++m) {
    Os os = static_cast<Os>(m);
    if (os == Os::kBioLatency) continue;  // a latency, not time per step
    // Memory-call counts and sizes: their time per step (kAllocApi, kSyncCopyApi) is the feature.
    if (os == Os::kAllocCalls || os == Os::kSyncCopyCalls || os == Os::kSyncCopyMb || os == Os::kKernels) continue;
    f.push_back({os_name(os), [os](const RankWindow& r) { return r.get(os); }, os == Os::kMajorFaults ? 1.0 : 1.0});
  }
  return f;
}

// Each rank's time per step by function (sparse: only where it ran).
struct FunctionTimes {
  std::vector<std::string> names;
  std::vector<std::vector<std::pair<size_t, double>>> by_rank;  // per function: (rank index, ms)
};
FunctionTimes function_times(const JobWindow& job, Values RankWindow::*profile) {
  FunctionTimes out;
  std::unordered_map<NameId, size_t> fn_of_path;
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    std::unordered_map<size_t, double> mine;
    for (const auto& v : job.ranks[i].*profile) {
      auto it = fn_of_path.find(v.name);
      if (it == fn_of_path.end()) {
        // Stacks that name no code are no function's time (function_key is "" for them).
        std::string fn = function_key(job, job.names.name(v.name));
        auto [ix, fresh] = index.emplace(fn, out.names.size());
        if (fresh) {
          out.names.push_back(fn);
          out.by_rank.emplace_back();
        }
        it = fn_of_path.emplace(v.name, ix->second).first;
      }
      if (!out.names[it->second].empty()) mine[it->second] += v.ms_per_step;
    }
    for (const auto& [f, ms] : mine) out.by_rank[f].push_back({i, ms});
  }
  return out;
}

}  // namespace

SecondOpinion second_opinion(const JobWindow& job) {
  SecondOpinion so;
  so.over_time = over_time_opinion(job);
  size_t n = job.ranks.size();
  if (n < 3) return so;  // nothing to compare a rank with: no opinion (compared stays false)
  so.compared = true;
  constexpr double kThreshold = 6;
  std::vector<double> score(n, 0);
  std::vector<std::string> why(n);
  for (const auto& f : features()) {
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = f.get(job.ranks[i]);
    double med = median(v);
    if (!known(med)) continue;
    double sigma = robust_sigma(v, med);
    // Scale floor: 5% of the typical value, so a quiet metric's tiny spread does not blow up z.
    double scale = std::max({known(sigma) ? sigma : 0.0, 0.05 * std::fabs(med), f.abs_floor_ms / 3});
    for (size_t i = 0; i < n; ++i) {
      if (!known(v[i]) || std::fabs(v[i] - med) < f.abs_floor_ms) continue;
      double z = (v[i] - med) / scale;
      if (std::fabs(z) > std::fabs(score[i]) || std::fabs(z) >= kThreshold) {
        if (std::fabs(z) >= kThreshold) {
          char buf[128];
          std::snprintf(buf, sizeof buf, "%s%s z=%+.0f", why[i].empty() ? "" : ", ", f.name, z);
          why[i] += buf;
        }
        if (std::fabs(z) > std::fabs(score[i])) score[i] = z;
      }
    }
  }
  // A function's time differs by rank for ordinary reasons (rank 0 logs, sampling picks one path
  // or its sibling): it deviates only beyond 5% of the job's step time.
  std::vector<double> steps;
  for (const auto& r : job.ranks) steps.push_back(r.now.step_ms);
  double step = median(std::move(steps));
  double fn_floor = std::max(2.0, known(step) ? 0.05 * step : 0.0);
  // Per function (PerfTracker): where fewer than half the ranks run a function its median is 0 and
  // so is its spread; the others are compared in full.
  for (auto [profile, kind] : {std::pair{&RankWindow::oncpu, " on-CPU"}, std::pair{&RankWindow::offcpu, " blocked"}}) {
    FunctionTimes ft = function_times(job, profile);
    for (size_t k = 0; k < ft.names.size(); ++k) {
      const auto& sparse = ft.by_rank[k];
      double med = 0, scale = fn_floor / 3;
      std::vector<double> v;
      if (2 * sparse.size() > n) {
        v.assign(n, 0);
        for (const auto& [i, ms] : sparse) v[i] = ms;
        med = median(v);
        double sigma = robust_sigma(v, med);
        scale = std::max({known(sigma) ? sigma : 0.0, 0.05 * std::fabs(med), fn_floor / 3});
      }
      auto consider = [&](size_t i, double x) {
        if (std::fabs(x - med) < fn_floor) return;
        double z = (x - med) / scale;
        if (std::fabs(z) >= kThreshold) {
          char buf[64];
          std::snprintf(buf, sizeof buf, " z=%+.0f", z);
          why[i] += (why[i].empty() ? "" : ", ") + ft.names[k] + kind + buf;
        }
        if (std::fabs(z) > std::fabs(score[i])) score[i] = z;
      };
      if (v.empty()) {
        for (const auto& [i, ms] : sparse) consider(i, ms);
      } else {
        for (size_t i = 0; i < n; ++i) consider(i, v[i]);
      }
    }
  }

  std::vector<size_t> out;
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(score[i]) >= kThreshold) out.push_back(i);
  }
  std::sort(out.begin(), out.end(), [&](size_t a, size_t b) { return std::fabs(score[a]) > std::fabs(score[b]); });
  // A job where a third of the ranks stand out has two populations, not outliers.
  if (out.size() > std::max<size_t>(1, n / 3)) {
    so.summary = "no clear outliers (" + std::to_string(out.size()) + " of " + std::to_string(n) + " ranks deviate)";
    return so;
  }
  for (size_t i : out) {
    so.outlier_ranks.push_back(job.ranks[i].rank);
    so.notes.push_back("rank " + std::to_string(job.ranks[i].rank) + ": " + why[i]);
  }
  return so;
}

// ---- The opinion over time ----------------------------------------------------------------------
// Each (rank, step) of the baseline and the window is a point of per-step metrics, each axis in
// robust units (median / MAD over all points). A diagonal Gaussian mixture over all points (k by
// BIC) finds the populations of steps; the main one holds the baseline, and one that is new in the
// window is a change: its ranks, and the axes on which it differs from the main one, are the
// opinion. Like the z-scores it knows no layers, save one fact of synchronous training: ranks
// that only wait longer in collectives are waiting for someone else.

namespace {

struct StepAxis {
  const char* name;
  double (*get)(const StepPoint&);
};
constexpr StepAxis kStepAxes[] = {
    {"step", [](const StepPoint& p) { return static_cast<double>(p.step_ms); }},
    {"collective wait", [](const StepPoint& p) { return static_cast<double>(p.wait_ms); }},
    {"busy", [](const StepPoint& p) { return static_cast<double>(p.step_ms) - p.wait_ms; }},
    {"GPU compute", [](const StepPoint& p) { return static_cast<double>(p.device_compute_ms); }},
    {"GPU idle", [](const StepPoint& p) { return static_cast<double>(p.gpu_idle_ms); }},
};
constexpr size_t kAxisStep = 0, kAxisWait = 1, kAxisBusy = 2;

// Under this many window steps (all ranks together) there is no population to find: 8 steps of a
// rank already show a 30% change against a few % of step noise.
constexpr size_t kMinWindowPoints = 8;
// The mixture is fitted on about this many points at most, then every point is classified: the
// fit's cost stays bounded for any job size, and 2048 points pin down 3 components of 5 axes many
// times over. The limit: a change on one rank forms a component of its own only while that rank's
// window steps are a visible part of the sample (up to a few tens of ranks); in a larger job a lone
// rank's change is the z-scores' to find, and this opinion sees the job's.
constexpr size_t kMaxFitPoints = 2048;
// An axis's robust unit is never under 0.5% of the median step time: a metric that barely varies
// (a constant GPU idle) would otherwise turn sub-millisecond wobbles into many sigmas.
constexpr double kScaleFloorOfStep = 0.005;
// A component is new in the window when it holds at most 10% of the baseline's steps: the odd slow
// baseline step (a checkpoint, a GC pause) may fall in it, a population that was always there not.
constexpr double kMaxBaselineShare = 0.10;
// A change worth reporting moves some axis by at least 5% of the main component's step time, the
// engine's own threshold for a slow step (Options::min_slowdown).
constexpr double kMinShiftOfStep = 0.05;
// ...and by at least 2 standard deviations of the main component on that axis: nearer, it is the
// main population's tail that the mixture split off, not a population of its own.
constexpr double kMinSeparation = 2.0;
// A rank is in a component when at least half its window steps are ("mostly").
constexpr double kRankShare = 0.5;
// A component whose ranks gained more collective wait than twice their own work (busy time) is
// ranks waiting for a peer: in synchronous training everyone waits for the slowest, so those
// ranks are where the change is seen, not where it is.
constexpr double kWaitingBusyRatio = 0.5;
// Axes named per component in a note: the most changed few say what moved.
constexpr size_t kAxesNamed = 3;
// Ranks listed per note; the rest are counted.
constexpr size_t kRanksListed = 8;

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < kRanksListed; ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  if (ranks.size() > kRanksListed) s += ",... (" + std::to_string(ranks.size()) + " ranks)";
  return s;
}

}  // namespace

OverTimeOpinion over_time_opinion(const JobWindow& job) {
  OverTimeOpinion ot;
  const size_t n = job.ranks.size();
  // Axes known on every point: a layer timed on some steps only would split steps by what was
  // recorded, not by how they ran.
  std::vector<size_t> axes;
  size_t total = 0, window = 0, baseline = 0;
  for (const auto& r : job.ranks) {
    total += r.series.size();
    for (const auto& p : r.series) (p.in_window ? window : baseline) += 1;
  }
  if (window < kMinWindowPoints) {
    ot.summary = total == 0 ? "no per-step series" : "too few window steps (" + std::to_string(window) + ")";
    return ot;
  }
  for (size_t a = 0; a < std::size(kStepAxes); ++a) {
    bool all = true;
    for (const auto& r : job.ranks) {
      for (const auto& p : r.series) all = all && known(kStepAxes[a].get(p));
    }
    if (all) axes.push_back(a);
  }
  const size_t d = axes.size();
  // Step, wait and busy come first and are always known (the rules below read them by index).
  if (d <= kAxisBusy || axes[kAxisBusy] != kAxisBusy) {
    ot.summary = "steps without step or collective times";
    return ot;
  }

  // Robust units per axis over the points (over the fit sample when the job is large).
  // Which points: a Weyl sequence (position times the golden ratio, mod 1) below the kept
  // fraction. Deterministic and even, and unlike every s-th point it cannot fall in step with the
  // series' period (every s-th of 64 steps per rank could keep only the same two steps of each).
  const double keep = std::min(1.0, static_cast<double>(kMaxFitPoints) / static_cast<double>(total));
  const uint64_t below = static_cast<uint64_t>(keep * 4294967296.0);
  std::vector<const StepPoint*> sample;
  uint32_t pos = 0;
  for (const auto& r : job.ranks) {
    for (const auto& p : r.series) {
      if (static_cast<uint32_t>(pos++ * 2654435769u) < below || keep >= 1.0) sample.push_back(&p);
    }
  }
  if (sample.empty()) {
    ot.summary = "no steps sampled";
    return ot;
  }
  std::vector<double> centre(d), unit(d);
  std::vector<double> col(sample.size());
  for (size_t i = 0; i < sample.size(); ++i) col[i] = kStepAxes[kAxisStep].get(*sample[i]);
  const double step_med = median(col);
  for (size_t j = 0; j < d; ++j) {
    for (size_t i = 0; i < sample.size(); ++i) col[i] = kStepAxes[axes[j]].get(*sample[i]);
    centre[j] = median(col);
    double sigma = robust_sigma(col, centre[j]);
    unit[j] = std::max({known(sigma) ? sigma : 0.0, kScaleFloorOfStep * std::fabs(step_med), 1e-6});
  }
  auto point = [&](const StepPoint& p) {
    std::vector<double> x(d);
    for (size_t j = 0; j < d; ++j) x[j] = (kStepAxes[axes[j]].get(p) - centre[j]) / unit[j];
    return x;
  };
  gmm::Points fit_points;
  for (const StepPoint* p : sample) fit_points.push_back(point(*p));
  const gmm::Mixture m = gmm::fit_best(fit_points);
  const size_t k = m.k();
  ot.fitted = true;
  ot.k = k;
  ot.points = total;

  // Every point to its component: per component the baseline and window steps, per rank its
  // window steps by component.
  std::vector<size_t> in_base(k, 0), in_window(k, 0), all_in(k, 0);
  std::vector<std::vector<size_t>> rank_window(n, std::vector<size_t>(k, 0));
  std::vector<size_t> rank_window_steps(n, 0);
  for (size_t i = 0; i < n; ++i) {
    for (const auto& p : job.ranks[i].series) {
      size_t c = gmm::assign(m, point(p));
      ++all_in[c];
      if (p.in_window) {
        ++in_window[c];
        ++rank_window[i][c];
        ++rank_window_steps[i];
      } else {
        ++in_base[c];
      }
    }
  }
  // The main component holds the baseline (the job as it was); without one, the most steps.
  const bool have_base = baseline > 0;
  size_t main = 0;
  for (size_t c = 1; c < k; ++c) {
    if ((have_base ? in_base[c] : all_in[c]) > (have_base ? in_base[main] : all_in[main])) main = c;
  }
  const double main_step_ms = m.mean[main][0] * unit[0] + centre[0];  // axes[0] is the step time

  // Per rank: its window steps in new components whose ranks worked longer, and in those whose
  // ranks waited longer.
  std::vector<double> share(n, 0), waiting_share(n, 0);
  const size_t few = std::max<size_t>(1, n / 3);  // as the z-scores: a third is a population
  for (size_t c = 0; c < k; ++c) {
    if (c == main || in_window[c] == 0) continue;
    // How far it sits from the main component, per axis, in robust units and in ms.
    std::vector<double> shift(d), shift_ms(d);
    bool significant = false;
    for (size_t j = 0; j < d; ++j) {
      shift[j] = m.mean[c][j] - m.mean[main][j];
      shift_ms[j] = shift[j] * unit[j];
      significant = significant || (std::fabs(shift_ms[j]) >= kMinShiftOfStep * main_step_ms &&
                                    std::fabs(shift[j]) >= kMinSeparation * std::sqrt(m.var[main][j]));
    }
    std::vector<int> ranks;
    for (size_t i = 0; i < n; ++i) {
      if (rank_window_steps[i] > 0 &&
          static_cast<double>(rank_window[i][c]) >= kRankShare * static_cast<double>(rank_window_steps[i]))
        ranks.push_back(job.ranks[i].rank);
    }
    bool new_in_time = have_base && static_cast<double>(in_base[c]) <= kMaxBaselineShare * static_cast<double>(baseline);
    bool on_few_ranks = n >= 2 && !ranks.empty() && ranks.size() <= few;
    if (!significant || !(have_base ? new_in_time : on_few_ranks)) continue;

    bool every_rank = ranks.size() == n;
    bool waiting = shift_ms[kAxisWait] > 0 && shift_ms[kAxisBusy] < kWaitingBusyRatio * shift_ms[kAxisWait];
    for (size_t i = 0; i < n; ++i) {
      if (rank_window_steps[i] > 0)
        (waiting ? waiting_share : share)[i] += static_cast<double>(rank_window[i][c]) / static_cast<double>(rank_window_steps[i]);
    }
    // The note: where the component is, and its most changed axes.
    std::vector<size_t> order(d);
    for (size_t j = 0; j < d; ++j) order[j] = j;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return std::fabs(shift[a]) > std::fabs(shift[b]); });
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.0f%% of window steps (%.0f%% of baseline)",
                  100.0 * static_cast<double>(in_window[c]) / static_cast<double>(window),
                  have_base ? 100.0 * static_cast<double>(in_base[c]) / static_cast<double>(baseline) : 0.0);
    std::string note = std::string(have_base ? "new in the window: " : "apart: ") + buf;
    note += every_rank ? (n == 1 ? ", the rank" : ", every rank") : ranks.empty() ? ", no rank mostly" : ", rank(s) " + rank_list(ranks);
    note += ":";
    for (size_t j = 0; j < d && j < kAxesNamed; ++j) {
      size_t a = order[j];
      std::snprintf(buf, sizeof buf, "%s %s %+.1f robust units (%+.1f ms)", j ? "," : "", kStepAxes[axes[a]].name, shift[a], shift_ms[a]);
      note += buf;
    }
    if (waiting) note += "; they wait longer for a peer, not slow themselves";
    ot.notes.push_back(std::move(note));
  }
  // The whole job changed when every rank's window steps moved the same way: all into components
  // where ranks work longer (a mixture may split them by each rank's own level), or all into ones
  // where they wait longer (a slower network). Some waiting for the others' longer work is one
  // rank's change seen on its peers, not the job's.
  if (have_base && n > 0) {
    bool all_work = true, all_wait = true;
    for (size_t i = 0; i < n; ++i) {
      all_work = all_work && share[i] >= kRankShare;
      all_wait = all_wait && waiting_share[i] >= kRankShare;
    }
    ot.job_wide = all_work || all_wait;
    if (ot.job_wide) ot.notes.push_back(std::string("every rank's window steps moved alike (") + (all_work ? "longer work" : "longer collective waits") + "): the whole job changed");
  }
  if (!ot.job_wide) {
    std::vector<size_t> named;
    for (size_t i = 0; i < n; ++i) {
      if (share[i] >= kRankShare) named.push_back(i);
    }
    std::sort(named.begin(), named.end(), [&](size_t a, size_t b) {
      return share[a] != share[b] ? share[a] > share[b] : job.ranks[a].rank < job.ranks[b].rank;
    });
    for (size_t i : named) {
      ot.outlier_ranks.push_back(job.ranks[i].rank);
      ot.shares.push_back(share[i]);
    }
  }
  char head[96];
  std::snprintf(head, sizeof head, "mixture of %zu over %zu steps of %zu rank(s)%s: ", k, total, n,
                have_base ? "" : ", no baseline steps (ranks compared only)");
  ot.summary = head;
  if (ot.job_wide) ot.summary += "the whole job changed in the window, no rank singled out";
  else if (!ot.outlier_ranks.empty()) ot.summary += "rank(s) " + rank_list(ot.outlier_ranks) + " changed";
  else if (!ot.notes.empty()) ot.summary += "a change, but no rank of its own";
  else ot.summary += "no change singles out a rank";
  return ot;
}

}  // namespace strata::diagnose
