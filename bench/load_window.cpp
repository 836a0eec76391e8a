// What a collector's round costs the loader once the span's rows are held: the span of a store
// (its latest SPAN seconds) is read into diagnose::SpanRows once, as a round's refresh leaves it,
// then diagnose::load_job_window runs ROUNDS times over the held rows (stacks, launch samples and
// processes are still read from the store, as in a round). Prints one line per round and a
// summary; the top finding is printed so that two builds can be checked to agree.
//   strata-load-window-bench FILE.db [--span-s 80] [--rounds 3] [--job ID]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "diagnose/engine.h"
#include "diagnose/loader.h"
#include "store/store.h"

namespace {

// A digest of what the load made of the span (names resolved: their ids may be numbered otherwise),
// so that two builds can be checked to load the same window.
uint64_t digest(const strata::diagnose::JobWindow& job) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::string_view v) {
    for (unsigned char c : v) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  };
  auto num = [&](double v) { mix(std::to_string(v)); };
  auto values = [&](const strata::diagnose::Values& vs) {
    std::vector<std::pair<std::string, double>> named;
    for (const auto& v : vs) named.emplace_back(job.names.name(v.name), v.ms_per_step);
    std::sort(named.begin(), named.end());
    for (const auto& [n, v] : named) mix(n), num(v);
  };
  num(static_cast<double>(job.start_ns)), num(static_cast<double>(job.end_ns)), num(static_cast<double>(job.observed_until_ns));
  mix(job.communicator);
  for (int g : job.peer_group) num(g);
  for (const auto& r : job.ranks) {
    num(r.rank), mix(r.node), num(r.pid), num(r.now.step_ms), num(r.base.step_ms), num(r.now.steps);
    for (double v : r.os) num(v);
    for (double v : r.past.os) num(v);
    values(r.neighbours), values(r.kernels), values(r.oncpu), values(r.offcpu), values(r.syscall_callers);
    values(r.past.neighbours), values(r.past.kernels), values(r.past.oncpu), values(r.past.offcpu);
    values(r.memory_api_ms), values(r.memory_call_sites), values(r.stall_oncpu), values(r.stall_offcpu);
    num(r.gpu.index), num(r.gpu.sm_clock_ratio), mix(r.gpu.throttle_reasons), num(r.agent_ms);
    num(r.alive), num(static_cast<double>(r.last_seen_ns)), num(static_cast<double>(r.last_progress_ns));
    num(static_cast<double>(r.last_device_ns)), num(static_cast<double>(r.links.size()));
    for (uint32_t w : r.workers) num(w);
    for (const auto& c : r.comms) mix(c.comm), num(c.calls), num(c.completed), num(static_cast<double>(c.last_seq)), mix(c.last_op);
    num(static_cast<double>(r.in_flight.size()));
  }
  return h;
}

double cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace strata;
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0) {
    std::fprintf(stderr, "usage: strata-load-window-bench FILE.db [--span-s S] [--rounds N] [--job ID]\n");
    return 2;
  }
  double span_s = 80;
  int rounds = 3;
  std::string job;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--span-s") == 0) span_s = std::strtod(argv[i + 1], nullptr);
    else if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--job") == 0) job = argv[i + 1];
    else {
      std::fprintf(stderr, "strata-load-window-bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  auto store = store::Store::open_sqlite(argv[1], store::Store::Mode::kReadOnly);
  if (!store) {
    std::fprintf(stderr, "strata-load-window-bench: %s\n", store.error().message.c_str());
    return 1;
  }
  store::Store& s = **store;
  auto latest = s.latest_step_ns(std::nullopt);
  if (!latest || !*latest) {
    std::fprintf(stderr, "strata-load-window-bench: the store holds no step\n");
    return 1;
  }
  const auto span_ns = static_cast<uint64_t>(span_s * 1e9);
  const uint64_t from = **latest > span_ns ? **latest - span_ns : 0;
  diagnose::SpanRows rows;
  diagnose::Stats read_stats;
  double c0 = cpu_s();
  if (auto st = diagnose::refresh_span_rows(s, rows, std::nullopt, from, std::nullopt, &read_stats, nullptr); !st) {
    std::fprintf(stderr, "strata-load-window-bench: %s\n", st.error().message.c_str());
    return 1;
  }
  std::printf("held_rows=%zu read_cpu_s=%.3f\n", rows.size(), cpu_s() - c0);
  double total_cpu = 0;
  for (int r = 0; r < rounds; ++r) {
    diagnose::LoadOptions lo;
    lo.job = job;
    lo.all_recordings = true;
    lo.from_ns = from;
    lo.rows = &rows;
    const double c = cpu_s();
    const auto t = std::chrono::steady_clock::now();
    auto window = diagnose::load_job_window(s, lo);
    const double load_cpu = cpu_s() - c;
    const double load_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    if (!window) {
      std::fprintf(stderr, "strata-load-window-bench: %s\n", window.error().message.c_str());
      return 1;
    }
    total_cpu += load_cpu;
    const double d0 = cpu_s();
    auto dx = diagnose::diagnose(*window);
    const double diagnose_cpu = cpu_s() - d0;
    std::printf("round=%d ranks=%zu load_cpu_s=%.3f load_wall_s=%.3f diagnose_cpu_s=%.3f digest=%016llx findings=%zu top=%s:%d:%s\n", r,
                window->ranks.size(), load_cpu, load_wall, diagnose_cpu, static_cast<unsigned long long>(digest(*window)), dx.findings.size(),
                dx.findings.empty() ? "-" : std::string(diagnose::cause_name(dx.findings[0].cause)).c_str(),
                dx.findings.empty() ? -1 : dx.findings[0].rank,
                dx.findings.empty() ? "-" : dx.findings[0].culprit.c_str());
  }
  std::printf("mean_load_cpu_s=%.3f\n", rounds > 0 ? total_cpu / rounds : 0.0);
  return 0;
}
