// A synthetic store for bench/web_render.sh: one job of N ranks (default 1,000) on N/8 nodes, S steps
// each, with rank 137 a straggler (computes longer, waits less) from step S/2; per-rank on-CPU stacks
// (the straggler spends its extra time in `slow_augment`), per-window OS metrics. Written through the
// Store interface, so the web UI reads it exactly as it reads a recording. WINDOW_S > 0 cuts the
// stacks and metrics into windows of that length, as agents ship them (bench/round_age.sh); 0 (the
// default) writes one window over the whole run.
//   strata-web-bench-store OUT.db [RANKS] [STEPS] [WINDOW_S]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>

#include "store/store.h"
#include "testbed/synth/job.h"

using namespace strata;

namespace {

int fail(const std::string& why) {
  std::cerr << "strata-web-bench-store: " << why << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = "usage: strata-web-bench-store OUT.db [RANKS] [STEPS] [WINDOW_S] (OUT.db is replaced)";
  // OUT.db is removed first: an option ("--help") is never taken for it.
  if (argc < 2 || argc > 5 || argv[1][0] == '-' || argv[1][0] == '\0') return fail(usage);
  auto number = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
  const int ranks = number(2, 1000), steps = number(3, 60), window_s = number(4, 0);
  if (ranks < 1 || steps < 1 || window_s < 0) return fail("RANKS and STEPS must be whole numbers >= 1, WINDOW_S >= 0; " + usage);
  const uint64_t window_ns = static_cast<uint64_t>(window_s) * 1'000'000'000ull;
  const int straggler = ranks > 137 ? 137 : ranks - 1;
  std::remove(argv[1]);
  auto st = store::Store::open_sqlite(argv[1], store::Store::Mode::kCreateOrAppend);
  if (!st) return fail(st.error().message);
  auto& s = **st;
  const uint64_t t0 = 1'700'000'000'000'000'000ull;
  const uint64_t step_ns = 200'000'000;
  if (!s.begin()) return fail("begin");
  // One recording per node, as one agent per node sends: a row's node is its recording's (the
  // collector joins rows to ranks by (node, pid)).
  std::vector<int64_t> recs;
  const int nodes = (ranks + 7) / 8;
  for (int n = 0; n < nodes; ++n) {
    auto rec = s.begin_recording({"node-" + std::to_string(n), "synthetic 1k-rank job", t0, 99, 10});
    if (!rec) return fail(rec.error().message);
    recs.push_back(*rec);
  }
  // The synthetic trainer's stacks (testbed/synth: the frames strata-sim agents ships), root first.
  auto stack = [&](std::initializer_list<const char*> names) -> int64_t {
    auto id = s.intern_stack(synth::trainer_stack(names));
    return id ? *id : -1;
  };
  const int64_t fwd = stack({"_start", "main", "train_step", "forward", "launch_kernels"});
  const int64_t load = stack({"_start", "main", "train_step", "load_batch", "preprocess", "cpu_work"});
  const int64_t aug = stack({"_start", "main", "train_step", "load_batch", "slow_augment", "cpu_work"});
  const int64_t wait = stack({"_start", "main", "train_step", "allreduce", "ncclAllReduce", "poll"});
  std::mt19937 rng(7);
  std::normal_distribution<double> noise(0, 2e6);
  const uint64_t end_ns = t0 + steps * (step_ns + 60'000'000);
  for (int r = 0; r < ranks; ++r) {
    const uint32_t pid = 10000 + r;
    const int64_t* rec = &recs[static_cast<size_t>(r / 8)];
    store::ProcessInfo p;
    p.pid = pid;
    p.ppid = 1;
    p.start_ns = t0;
    p.node = "node-" + std::to_string(r / 8);
    p.comm = "python3";
    p.command = "python3 train.py";
    p.job = "bench-1k";
    p.rank = r;
    p.local_rank = r % 8;
    p.world_size = ranks;
    if (!s.put_process(*rec, p)) return fail("put_process");
    std::vector<store::StepRecord> rows;
    uint64_t extra_total = 0;
    std::vector<std::pair<uint64_t, uint64_t>> extra_at;  // (step start, extra ns): the windows' share
    uint64_t cursor = t0;
    for (int k = 0; k < steps; ++k) {
      const bool slow = k >= steps / 2;
      const uint64_t extra = slow ? 40'000'000 : 0;  // the job's steps grow 40 ms from S/2
      const uint64_t start = cursor;
      store::StepRecord sr;
      sr.pid = pid;
      sr.step = k + 1;
      sr.start_ns = start;
      sr.end_ns = start + step_ns + extra + static_cast<uint64_t>(std::abs(noise(rng)));
      cursor = sr.end_ns;
      const uint64_t compute = 120'000'000 + (r == straggler ? extra : 0);
      sr.collective_ns = sr.end_ns - sr.start_ns - compute;
      sr.device_known = true;
      sr.device_compute_ns = 110'000'000;
      sr.device_collective_ns = sr.collective_ns;
      sr.gpu_idle_ns = sr.end_ns - sr.start_ns - sr.device_compute_ns - sr.device_collective_ns / 2;
      rows.push_back(sr);
      if (r == straggler && slow) extra_total += extra, extra_at.emplace_back(start, extra);
    }
    if (!s.put_steps(*rec, rows)) return fail("put_steps");
    if (window_ns > 0) {
      // Windows as an agent ships them: what the rank did in each, its steps' share of the counts.
      size_t k = 0, e = 0;
      for (uint64_t w = t0; w < rows.back().end_ns; w += window_ns) {  // up to the rank's last step
        uint64_t n = 0, extra_ns = 0;
        for (; k < rows.size() && rows[k].start_ns < w + window_ns; ++k) ++n;
        for (; e < extra_at.size() && extra_at[e].first < w + window_ns; ++e) extra_ns += extra_at[e].second;
        std::vector<store::StackCount> wc = {{pid, pid, "python3", fwd, 5 * n}, {pid, pid, "python3", load, 8 * n},
                                             {pid, pid, "python3", wait, 3 * n}};
        if (extra_ns) wc.push_back({pid, pid, "python3", aug, extra_ns / 10'000'000});
        if (!s.put_window(*rec, w, w + window_ns, store::CountKind::kOnCpu, wc)) return fail("put_window");
        const double share = static_cast<double>(window_ns) / static_cast<double>(end_ns - t0);
        // The straggler's extra CPU time is its extra work in this window (the whole-run series
        // above adds a fixed 1.2 s, whatever the steps: at 600 steps that is 2 ms a step, too
        // little to explain the 40 ms the straggler loses, hence the culprit `unknown` there).
        std::vector<store::Metric> wm = {{pid, "os.cpu_time_us", "", 12e6 * share + static_cast<double>(extra_ns) / 1e3},
                                         {pid, "os.runq_wait_us", "", 2e4 * share}};
        if (!s.put_metrics(*rec, w, w + window_ns, wm)) return fail("put_metrics");
      }
      continue;
    }
    std::vector<store::StackCount> counts = {
        {pid, pid, "python3", fwd, 300}, {pid, pid, "python3", load, 500}, {pid, pid, "python3", wait, 200}};
    if (extra_total) counts.push_back({pid, pid, "python3", aug, extra_total / 10'000'000});
    if (!s.put_window(*rec, t0, end_ns, store::CountKind::kOnCpu, counts)) return fail("put_window");
    std::vector<store::Metric> m = {{pid, "os.cpu_time_us", "", 12e6 + (r == straggler ? 1.2e6 : 0)},
                                    {pid, "os.runq_wait_us", "", 2e4},
                                    {pid, "os.involuntary_switches", "", 40},
                                    {pid, "os.major_faults", "", 0}};
    if (!s.put_metrics(*rec, t0, end_ns, m)) return fail("put_metrics");
  }
  for (int64_t rec : recs) {
    if (!s.end_recording(rec, end_ns)) return fail("end_recording");
  }
  if (!s.commit()) return fail("commit");
  std::cout << "wrote " << argv[1] << ": " << ranks << " ranks x " << steps << " steps, straggler rank " << straggler
            << "\n";
  return 0;
}
