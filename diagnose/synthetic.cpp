#include "diagnose/synthetic.h"

#include "diagnose/baseline.h"

#include <algorithm>
#include <random>

namespace strata::diagnose {

std::string planted_culprit(const PlantedFault& f) {
  if (f.rank == kAllRanks) {
    if (f.cause == "gpu-slow") return "the GPUs of every rank";
    if (f.cause == "network-slow") return "communicator synthetic-comm";
    if (f.cause == "io-stall") return "load_batch";
  }
  if (f.cause == "cpu-contention") return "logrotate";
  if (f.cause == "host-hotspot") return "slow_augment";
  if (f.cause == "io-stall") return "load_batch";
  if (f.cause == "memory-reclaim") return "preprocess";
  if (f.cause == "cpu-throttling") return "cgroup cpu quota";
  // Ranks drive GPUs 0-7 of their node.
  if (f.cause == "gpu-slow" || f.cause == "hang" || f.cause == "gpu-lost" || f.cause == "gpu-memory-errors" ||
      f.cause == "pcie-degraded" || f.cause == "nvlink-degraded")
    return "GPU " + std::to_string(f.rank % 8);
  if (f.cause == "kernel-regression") return "ampere_sgemm_128x64_tn";
  if (f.cause == "network-slow") return "link of rank " + std::to_string(f.rank);
  if (f.cause == "workload-imbalance") return "larger batches";
  if (f.cause == "page-faults") return "major page faults";
  if (f.cause == "launch-bound") return "kernel launches";
  if (f.cause == "memory-alloc-churn") return "cudaFree";
  if (f.cause == "sync-memcpy") return "cudaMemcpy";
  if (f.cause == "irq-softirq") return "interrupts on CPU " + std::to_string(f.rank % 8);  // its CPU: make_synthetic_job places rank i on CPU i % 8
  return "";
}

namespace {

// Per-step series: every step, each rank's busy time (device compute + GPU idle) jitters around its
// healthy value (baseline) or its faulted one (window), and as in a synchronous job every rank
// leaves the step's collective when the slowest arrives. A generator of its own, so the summaries
// stay what they were for a seed.
void add_series(JobWindow& job, const SyntheticSpec& spec, double comm, double extra_wait) {
  SyntheticSpec hs = spec;
  hs.faults.clear();
  hs.series_steps = 0;
  hs.past = false;
  const JobWindow healthy = make_synthetic_job(hs);
  std::mt19937_64 rng(spec.seed * 7919 + 17);
  std::normal_distribution<double> jitter(0, spec.noise);
  auto noisy = [&](double v) { return v * std::max(0.5, 1 + jitter(rng)); };
  const size_t n = job.ranks.size(), steps = std::min(spec.series_steps, kMaxSeriesStepsPerPhase);
  for (bool window : {false, true}) {
    const JobWindow& from = window ? job : healthy;
    for (size_t k = 0; k < steps; ++k) {
      std::vector<double> dev(n), idle(n);
      double slowest = 0;
      for (size_t i = 0; i < n; ++i) {
        dev[i] = noisy(from.ranks[i].now.device_compute_ms);
        idle[i] = noisy(from.ranks[i].now.gpu_idle_ms);
        slowest = std::max(slowest, dev[i] + idle[i]);
      }
      double step = slowest + noisy(comm) + (window ? extra_wait : 0);
      for (size_t i = 0; i < n; ++i) {
        StepPoint p;
        p.step_ms = static_cast<float>(step);
        p.wait_ms = static_cast<float>(step - dev[i] - idle[i]);
        p.device_compute_ms = static_cast<float>(dev[i]);
        p.gpu_idle_ms = static_cast<float>(idle[i]);
        p.in_window = window;
        job.ranks[i].series.push_back(p);
      }
    }
  }
}

}  // namespace

JobWindow make_synthetic_job(const SyntheticSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<double> jitter(0, spec.noise);
  auto noisy = [&](double v) { return v * std::max(0.5, 1 + jitter(rng)); };

  JobWindow job;
  job.job = "synthetic";
  job.start_ns = 1'000'000'000'000;
  job.end_ns = job.start_ns + 10'000'000'000;  // a 10 s window
  job.observed_until_ns = job.end_ns;
  job.communicator = "synthetic-comm";
  const NameId p_fwd = job.names.id("main;train;train_step;forward");
  const NameId p_load = job.names.id("main;train;load_batch;read_file");
  const NameId p_pre = job.names.id("main;train;preprocess;decode");
  const NameId p_hot = job.names.id("main;train;slow_augment;cpu_work");
  const NameId p_io = job.names.id("main;train;load_batch;__libc_pread64;pread64()");
  const NameId p_rec = job.names.id("main;train;preprocess;__memmove_avx_unaligned");
  const NameId k_gemm = job.names.id("ampere_sgemm_128x64_tn");
  const NameId k_elem = job.names.id("vectorized_elementwise_kernel");
  const NameId n_hog = job.names.id("logrotate");
  const NameId n_kworker = job.names.id("kworker/0:1");
  const NameId a_malloc = job.names.id("cudaMalloc");
  const NameId a_free = job.names.id("cudaFree");
  const NameId a_copy = job.names.id("cudaMemcpy");
  // Each step's gradient all-reduce buckets on the job's one communicator, numbered from 1 over the
  // baseline's 300 steps and the window's 100.
  constexpr uint64_t kCallsPerStep = 3;
  const uint64_t calls_done = kCallsPerStep * (300 + 100);

  const double s = spec.step_ms;
  job.ranks.resize(spec.ranks);
  for (size_t i = 0; i < spec.ranks; ++i) {
    RankWindow& r = job.ranks[i];
    r.rank = static_cast<int>(i);
    r.pid = static_cast<uint32_t>(10000 + i);
    r.node = "node-" + std::to_string(i / 8);
    r.gpu.index = static_cast<int>(i % 8);
    r.gpu.known = true;
    r.gpu.sm_clock_ratio = 1.0;
    // A healthy board: no new errors, its PCIe link at its full width (Gen4 x16).
    r.gpu.ecc_uncorrected = 0;
    r.gpu.ecc_corrected = 0;
    r.gpu.pcie_replays = 0;
    r.gpu.nvlink_errors = 0;
    r.gpu.pcie_gen = 4;
    r.gpu.pcie_width = 16;
    r.gpu.pcie_max_width = 16;
    r.now.steps = 100;
    r.now.device_compute_ms = noisy(0.6 * s);
    r.now.gpu_idle_ms = noisy(0.1 * s);
    r.set(Os::kCpu, noisy(0.25 * s));
    r.set(Os::kRunqWait, noisy(0.01 * s));
    r.set(Os::kThrottled, 0);
    r.set(Os::kReclaim, 0);
    r.set(Os::kBlockedIo, noisy(0.002 * s));
    r.set(Os::kIrq, noisy(0.005 * s));
    r.set(Os::kMajorFaults, 0);
    r.set(Os::kLaunchApi, noisy(0.005 * s));
    // A step's few memory calls: a temporary allocated and freed, the loss read back (.item()).
    // Without noise: the jitter's generator draws as before, so every other value stays as it was.
    r.memory_api_ms = {{a_malloc, 0.0005 * s}, {a_free, 0.0002 * s}, {a_copy, 0.0004 * s}};
    r.memory_api_calls = {{a_malloc, 1}, {a_free, 1}, {a_copy, 1}};
    r.memory_api_mb = {{a_malloc, 1}, {a_free, 0}, {a_copy, 0.004}};
    normalize(r.memory_api_ms);
    normalize(r.memory_api_calls);
    normalize(r.memory_api_mb);
    r.set(Os::kAllocApi, value_of(r.memory_api_ms, a_malloc) + value_of(r.memory_api_ms, a_free));
    r.set(Os::kAllocCalls, 2);
    r.set(Os::kSyncCopyApi, value_of(r.memory_api_ms, a_copy));
    r.set(Os::kSyncCopyCalls, 1);
    r.set(Os::kSyncCopyMb, 0.004);
    r.kernels = {{k_gemm, r.now.device_compute_ms * 0.8}, {k_elem, r.now.device_compute_ms * 0.2}};
    r.oncpu = {{p_fwd, 0.1 * s}, {p_load, 0.05 * s}, {p_pre, 0.1 * s}};
    // Off-CPU summaries hold blocking in I/O and D state only (see loader.cpp).
    r.offcpu = {{p_load, 0.002 * s}};
    r.neighbours = {{n_kworker, noisy(0.001 * s)}};
    // Rank i pinned to CPU i % 8 of its node, with a few visits elsewhere. No draw of the generator:
    // the rest stays as it was.
    r.cpu_placement = {{std::to_string(i % 8), 0.97}, {"other", 0.03}};
    r.last_progress_ns = job.end_ns;
    r.last_device_ns = job.end_ns;
    CommProgress cp;
    cp.comm = job.communicator;
    cp.calls = kCallsPerStep * r.now.steps;
    cp.last_seq = calls_done;
    cp.last_op = "allreduce";
    cp.last_bytes = 25u << 20;
    cp.last_completed = true;
    cp.completed = cp.calls;
    cp.last_enter_ns = job.end_ns - 30'000'000;
    r.comms.push_back(cp);
  }
  // Busy time: device compute plus the launch gaps where the GPU idled for the CPU.
  std::vector<double> busy(spec.ranks);
  for (size_t i = 0; i < spec.ranks; ++i) busy[i] = job.ranks[i].now.device_compute_ms + job.ranks[i].now.gpu_idle_ms;
  const std::vector<double> healthy_busy = busy;  // before the faults: the baseline's
  const double healthy_step = 0.72 * s + 0.28 * s;  // slowest healthy rank + the collective itself
  double comm = 0.28 * s;
  double link_wait = 0;
  int link_rank = -1;
  double link_all = 0;  // every link slower: every collective takes this much longer
  bool hang = false;
  int hang_rank = -1;
  bool hang_on_host = false;

  // A job-wide fault is the same fault planted on every rank.
  std::vector<PlantedFault> planted;
  for (const auto& f : spec.faults) {
    if (f.rank != kAllRanks) {
      planted.push_back(f);
      continue;
    }
    for (size_t i = 0; i < spec.ranks; ++i) planted.push_back({static_cast<int>(i), f.cause, f.ms});
    if (f.cause == "network-slow") link_all = f.ms;
  }
  for (const auto& f : planted) {
    if (f.rank < 0 || static_cast<size_t>(f.rank) >= spec.ranks) continue;
    RankWindow& r = job.ranks[static_cast<size_t>(f.rank)];
    auto addv = [&](Values& v, NameId n, double ms) {
      v.push_back({n, ms});
      normalize(v);
    };
    auto host = [&](double ms) {
      r.now.gpu_idle_ms += ms;
      busy[static_cast<size_t>(f.rank)] += ms;
    };
    if (f.cause == "gpu-slow") {
      r.now.device_compute_ms += f.ms;
      busy[static_cast<size_t>(f.rank)] += f.ms;
      r.gpu.throttle_reasons = "hw_slowdown,hw_thermal";
      r.gpu.sm_clock_ratio = 0.5;
      for (auto& k : r.kernels) k.ms_per_step *= (r.now.device_compute_ms / (r.now.device_compute_ms - f.ms));
    } else if (f.cause == "workload-imbalance") {
      r.now.device_compute_ms += 0.7 * f.ms;
      busy[static_cast<size_t>(f.rank)] += 0.7 * f.ms;
      host(0.3 * f.ms);
      r.set(Os::kCpu, r.get(Os::kCpu) * 1.6);
      addv(r.oncpu, p_pre, 0.06 * s);
      for (auto& k : r.kernels) k.ms_per_step *= 1.6;
    } else if (f.cause == "host-hotspot") {
      host(f.ms);
      r.set(Os::kCpu, r.get(Os::kCpu) + f.ms);
      addv(r.oncpu, p_hot, f.ms);
    } else if (f.cause == "cpu-contention") {
      host(f.ms);
      r.set(Os::kRunqWait, r.get(Os::kRunqWait) + f.ms);
      addv(r.neighbours, n_hog, 2 * f.ms);
    } else if (f.cause == "cpu-throttling") {
      host(f.ms);
      r.set(Os::kRunqWait, r.get(Os::kRunqWait) + f.ms);
      r.set(Os::kThrottled, f.ms);
    } else if (f.cause == "io-stall") {
      host(f.ms);
      r.set(Os::kBlockedIo, r.get(Os::kBlockedIo) + f.ms);
      r.set(Os::kBioLatency, 20);
      addv(r.offcpu, p_io, f.ms);
    } else if (f.cause == "memory-reclaim") {
      host(f.ms);
      r.set(Os::kReclaim, f.ms);
      addv(r.offcpu, p_rec, f.ms);
    } else if (f.cause == "irq-softirq") {
      host(f.ms);
      r.set(Os::kIrq, r.get(Os::kIrq) + f.ms);
    } else if (f.cause == "page-faults") {
      // Major faults that read from a disk at 2 ms each (its working set swapped out).
      host(f.ms);
      r.set(Os::kBioLatency, 2);
      r.set(Os::kMajorFaults, r.get(Os::kMajorFaults) + f.ms / 2);
    } else if (f.cause == "launch-bound") {
      // The host spends the time launching kernels (many small ones): the GPU waits for launches.
      host(f.ms);
      r.set(Os::kLaunchApi, r.get(Os::kLaunchApi) + f.ms);
    } else if (f.cause == "memory-alloc-churn") {
      // Every layer's temporaries through cudaMalloc/cudaFree (the caching allocator off): 200 more
      // calls per step; cudaFree's device sync makes it the larger share.
      host(f.ms);
      auto add_api = [&](NameId api, double ms, double calls) {
        addv(r.memory_api_ms, api, ms);
        addv(r.memory_api_calls, api, calls);
      };
      add_api(a_free, 0.7 * f.ms, 100);
      add_api(a_malloc, 0.3 * f.ms, 100);
      r.set(Os::kAllocApi, r.get(Os::kAllocApi) + f.ms);
      r.set(Os::kAllocCalls, r.get(Os::kAllocCalls) + 200);
    } else if (f.cause == "sync-memcpy") {
      // Activations read back synchronously every layer (.cpu() in the loop): 24 more copies of
      // 2 MB per step.
      host(f.ms);
      addv(r.memory_api_ms, a_copy, f.ms);
      addv(r.memory_api_calls, a_copy, 24);
      addv(r.memory_api_mb, a_copy, 48);
      r.set(Os::kSyncCopyApi, r.get(Os::kSyncCopyApi) + f.ms);
      r.set(Os::kSyncCopyCalls, r.get(Os::kSyncCopyCalls) + 24);
      r.set(Os::kSyncCopyMb, r.get(Os::kSyncCopyMb) + 48);
    } else if (f.cause == "kernel-regression") {
      // One kernel slower; the GPU and everything else as before.
      r.now.device_compute_ms += f.ms;
      busy[static_cast<size_t>(f.rank)] += f.ms;
      for (auto& k : r.kernels) k.ms_per_step += k.name == k_gemm ? f.ms : 0;
    } else if (f.cause == "network-slow" && link_all == 0) {
      link_wait = std::max(link_wait, f.ms);
      link_rank = f.rank;
    } else if (f.cause == "hang") {
      hang = true;
      hang_rank = f.rank;
      hang_on_host = f.on_host;
    } else if (f.cause == "gpu-lost") {
      // The GPU fell off the bus (the driver says Xid 79): its rank stops, the others wait for it
      // in the collective.
      hang = true;
      hang_rank = f.rank;
      r.gpu.lost = true;
      r.gpu.xids = {79};
    } else if (f.cause == "gpu-memory-errors") {
      // Uncorrectable errors (Xid 48, a double-bit ECC error): the job is not slower (yet), its
      // data is wrong.
      r.gpu.ecc_uncorrected = 2;
      r.gpu.ecc_corrected = 37;
      r.gpu.xids = {48};
    } else if (f.cause == "pcie-degraded" || f.cause == "nvlink-degraded") {
      // Every transfer through the link is slower (fewer lanes, packets resent): the rank's device
      // work takes longer.
      r.now.device_compute_ms += f.ms;
      busy[static_cast<size_t>(f.rank)] += f.ms;
      if (f.cause == "pcie-degraded") {
        r.gpu.pcie_width = 4;
        r.gpu.pcie_replays = 600;  // 60 a minute over the 10 s window
      } else {
        r.gpu.nvlink_errors = 900;
      }
    }
  }

  // A synchronous job: every rank leaves the collective when the slowest arrives.
  double step = *std::max_element(busy.begin(), busy.end()) + comm + link_wait + link_all;
  size_t n = spec.ranks;
  for (size_t i = 0; i < n; ++i) {
    RankWindow& r = job.ranks[i];
    r.now.step_ms = step;
    r.now.step_mad_ms = 0.01 * step;
    r.now.wait_ms = step - busy[i];
    if (link_rank >= 0 && n > 2) {
      // The slow link's two ends idle a little longer in the ring than the rest.
      size_t lr = static_cast<size_t>(link_rank);
      if (i == (lr + 1) % n || i == (lr + n - 1) % n) r.now.wait_ms += 0.1 * link_wait, r.now.step_ms = step;
    }
    if (spec.baseline) {
      r.base = r.now;
      r.base.steps = 300;
      r.base.step_ms = healthy_step;
      r.base.step_mad_ms = 0.01 * healthy_step;
      r.base.wait_ms = healthy_step - healthy_busy[i];
      r.base.wait_ms = std::max(r.base.wait_ms, 0.2 * s);
    }
  }
  if (link_all > 0) {
    // Every link slower: each rank's bulk connection to the next in the ring has a long RTT.
    auto ep = [](size_t i, int port) { return "10.0.0." + std::to_string(i + 1) + ":" + std::to_string(port); };
    for (size_t i = 0; i < n && n > 1; ++i) {
      size_t next = (i + 1) % n;
      job.ranks[i].links.push_back({ep(i, 50000), ep(next, 4000), 19.0, 5e7, 0});
      job.ranks[next].links.push_back({ep(next, 4000), ep(i, 50000), 0.01, 0, 5e7});
    }
  }
  if (spec.series_steps > 0) add_series(job, spec, comm, link_wait + link_all);
  if (spec.past) {
    SyntheticSpec healthy = spec;
    healthy.faults.clear();
    healthy.past = false;
    healthy.series_steps = 0;
    JobBaseline past;
    past.absorb(make_synthetic_job(healthy));
    past.apply(job);
  }
  if (hang) {
    // Everyone stopped 30 s ago.
    const double stall_ms = 30'000;
    job.observed_until_ns = job.end_ns + 30'000'000'000;
    RankWindow& h = job.ranks[static_cast<size_t>(hang_rank)];
    if (!hang_on_host) {
      // The hung rank's GPU finished its work a little before its peers'; every rank entered the
      // next all-reduce and none completed it; every host waits for its stream.
      for (auto& r : job.ranks) {
        r.last_device_ns = job.end_ns;
        CommProgress& cp = r.comms.front();
        cp.last_seq = calls_done + 1;
        cp.last_completed = false;
        cp.last_enter_ns = job.end_ns + 10'000'000;
        r.stall_offcpu = {{job.names.id("main;train;train_step;all_reduce;cudaStreamSynchronize;futex()"), stall_ms}};
      }
      h.last_device_ns = job.end_ns - 150'000'000;
    } else {
      // No device timeline (a CPU job, gloo): the hung rank's host never entered the next
      // all-reduce, which its peers entered and wait in; it spins in the data loader.
      for (auto& r : job.ranks) {
        r.last_device_ns = 0;
        if (&r == &h) continue;
        CommProgress& cp = r.comms.front();
        cp.last_seq = calls_done + 1;
        cp.last_completed = false;
        cp.last_enter_ns = job.end_ns + 10'000'000;
        r.stall_offcpu = {{job.names.id("main;train;train_step;all_reduce;gloo::allreduce;futex()"), stall_ms}};
      }
      h.stall_oncpu = {{job.names.id("main;train;load_batch;decode_sample"), 0.8 * stall_ms}};
      h.stall_offcpu = {{job.names.id("main;train;load_batch;queue_get;futex()"), 0.2 * stall_ms}};
    }
    for (auto& r : job.ranks) {
      normalize(r.stall_oncpu);
      normalize(r.stall_offcpu);
    }
  }
  return job;
}

}  // namespace strata::diagnose
