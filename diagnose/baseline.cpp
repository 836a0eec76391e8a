#include "diagnose/baseline.h"

#include <algorithm>
#include <cstdint>

namespace strata::diagnose {

namespace {

// Moves `into` toward `v` by weight w; an unknown value leaves it, a first known value sets it.
void roll(double& into, double v, double w) {
  if (!known(v)) return;
  into = known(into) ? into + w * (v - into) : v;
}

// The same for a set of named values: a name absent from the window counts as 0 there (the
// function did not run), so work that stopped fades out of the past.
void roll(std::unordered_map<std::string, double>& into, const Values& v, const Names& names, double w) {
  for (auto& [name, ms] : into) ms *= 1 - w;
  for (const auto& e : v) into[names.name(e.name)] += w * e.ms_per_step;
}

Values intern(const std::unordered_map<std::string, double>& m, Names& names) {
  Values out;
  out.reserve(m.size());
  for (const auto& [name, ms] : m) out.push_back({names.id(name), ms});
  normalize(out);
  return out;
}

}  // namespace

void JobBaseline::absorb(const JobWindow& healthy) {
  for (const auto& r : healthy.ranks) {
    if (r.now.steps == 0) continue;  // nothing measured per step
    Summary& s = ranks_[r.rank];
    s.windows += 1;
    s.steps += r.now.steps;
    const double w = 1.0 / static_cast<double>(std::min(s.windows, kHorizon));
    roll(s.step_ms, r.now.step_ms, w);
    roll(s.step_mad_ms, r.now.step_mad_ms, w);
    roll(s.wait_ms, r.now.wait_ms, w);
    roll(s.device_compute_ms, r.now.device_compute_ms, w);
    roll(s.gpu_idle_ms, r.now.gpu_idle_ms, w);
    for (size_t k = 0; k < kOsCount; ++k) roll(s.os[k], r.os[k], w);
    roll(s.kernels, r.kernels, healthy.names, w);
    roll(s.oncpu, r.oncpu, healthy.names, w);
    roll(s.offcpu, r.offcpu, healthy.names, w);
    roll(s.neighbours, r.neighbours, healthy.names, w);
  }
}

void JobBaseline::apply(JobWindow& w) const {
  for (auto& r : w.ranks) {
    auto it = ranks_.find(r.rank);
    if (it == ranks_.end()) continue;
    const Summary& s = it->second;
    RankPast& p = r.past;
    p.windows = s.windows;
    p.step_ms = s.step_ms;
    p.wait_ms = s.wait_ms;
    p.device_compute_ms = s.device_compute_ms;
    p.os = s.os;
    p.kernels = intern(s.kernels, w.names);
    p.oncpu = intern(s.oncpu, w.names);
    p.offcpu = intern(s.offcpu, w.names);
    p.neighbours = intern(s.neighbours, w.names);
    if (r.base.steps == 0 && known(s.step_ms)) {
      r.base.steps = static_cast<uint32_t>(std::min<uint64_t>(s.steps, UINT32_MAX));
      r.base.step_ms = s.step_ms;
      r.base.step_mad_ms = s.step_mad_ms;
      r.base.wait_ms = s.wait_ms;
      r.base.device_compute_ms = s.device_compute_ms;
      r.base.gpu_idle_ms = s.gpu_idle_ms;
    }
  }
}

}  // namespace strata::diagnose
