// The second opinion (eACGM's idea, made robust): every rank is a vector of metrics; a rank whose
// vector sits far from the job's on any axis, in robust z-scores, is an outlier. It knows nothing
// of layers or causes, so it catches what the rules miss and shows when they see something else.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

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

}  // namespace

SecondOpinion second_opinion(const JobWindow& job) {
  SecondOpinion so;
  size_t n = job.ranks.size();
  if (n < 3) return so;  // nothing to compare a rank with
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
