// The second opinion (eACGM's idea, made robust): every rank is a vector of metrics; a rank whose
// vector sits far from the job's on any axis, in robust z-scores, is an outlier. The axes are the
// layers' metrics and, as PerfTracker compares function behaviour across workers, the time per step
// each function (call path) takes on-CPU and blocked. It knows nothing of layers or causes, so it
// catches what the rules miss and shows when they see something else.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <unordered_map>

#include "diagnose/engine.h"
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

}  // namespace strata::diagnose
