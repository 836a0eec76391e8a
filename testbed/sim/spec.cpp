#include "testbed/sim/spec.h"

#include <cmath>
#include <cstdlib>
#include <tuple>

namespace testbed::sim {

using strata::Error;
using strata::Result;

namespace {

struct KindInfo {
  const char* name;
  FaultKind kind;
  const char* layer;
  const char* cause;
  std::map<std::string, double> defaults;  // the keys a kind accepts besides rank and start_step
};

const std::vector<KindInfo>& kinds() {
  static const std::vector<KindInfo> k = {
      {"none", FaultKind::kNone, "", "", {}},
      // hogs: CPU-bound processes on the rank's CPU; priority: how far below nice 0 they run (each in a
      // session of its own, the autogroup at that nice too): at 15 the rank gets a few % of its CPU
      {"cpu-contention", FaultKind::kCpuContention, "os", "cpu-contention", {{"hogs", 2}, {"priority", 15}}},
      // quota_pct: the rank's CPU quota in % of one CPU per 100 ms period
      {"cpu-throttling", FaultKind::kCpuThrottling, "os", "cpu-throttling", {{"quota_pct", 5}}},
      // headroom_mb: memory limit above the rank's usage when the fault starts
      {"memory-reclaim", FaultKind::kMemoryReclaim, "os", "memory-reclaim", {{"headroom_mb", 4}}},
      // rate_mbps: read bandwidth of the rank's data device, MB/s
      {"io-stall", FaultKind::kIoStall, "os", "io-stall", {{"rate_mbps", 1.5}}},
      // ms: extra CPU time per step in slow_augment()
      {"host-hotspot", FaultKind::kHostHotspot, "cpu", "host-hotspot", {{"ms", 40}}},
      // factor: device slowdown; NVML reports HW slowdown + thermal throttling
      {"gpu-slow", FaultKind::kGpuSlow, "gpu", "gpu-slow", {{"factor", 2}}},
      // rate_mbit: bandwidth of the rank's link
      {"network-slow", FaultKind::kNetworkSlow, "comm", "network-slow", {{"rate_mbit", 60}}},
      {"hang", FaultKind::kHang, "gpu", "hang", {}},
      // factor: the rank's batch size relative to its peers
      {"workload-imbalance", FaultKind::kWorkloadImbalance, "cpu", "workload-imbalance", {{"factor", 1.6}}},
      // factor: how much longer one kernel (kernel=NAME, default the forward GEMM) takes on every
      // rank's GPU, as after a library upgrade; the GPUs and every other kernel as before
      {"kernel-regression", FaultKind::kKernelRegression, "gpu", "kernel-regression", {{"factor", 2}}},
      // Uncorrectable ECC errors climbing (and corrected ones): contained errors, the device keeps
      // its speed (the real fault corrupts data or kills the process that touches the page)
      {"gpu-ecc", FaultKind::kGpuEcc, "gpu", "gpu-memory-errors", {}},
      // code: the Xid raised. 79: the GPU falls off the bus (NVML: GPU_IS_LOST) and stops;
      // 48: a double-bit ECC error (as gpu-ecc); 74: an NVLink error (as nvlink-errors)
      {"gpu-xid", FaultKind::kGpuXid, "gpu", "gpu-lost", {{"code", 79}, {"factor", 1.3}}},
      // factor: device slowdown from the link trained at x4 of x16, replaying packets
      {"pcie-degraded", FaultKind::kPcieDegraded, "gpu", "pcie-degraded", {{"factor", 1.5}}},
      // factor: device slowdown from NVLink replays and CRC errors on one link
      {"nvlink-errors", FaultKind::kNvlinkErrors, "gpu", "nvlink-degraded", {{"factor", 1.3}}},
      // factor: how much longer the rank's CPU work (preprocess's cpu_work, the bulk of its on-CPU
      // time) takes, as on a slower core: the same functions, longer. The rank stays pinned to its
      // CPU (rank % CPUs), as every rank is, and so do the ranks pinned with it (a slower core slows
      // every rank on it; the truth lists them)
      {"slow-cpu", FaultKind::kSlowCpu, "os", "slow-cpu", {{"factor", 1.6}}},
      // pages: how many 4 KiB pages of its memory-mapped data the rank reads per step (from its first
      // step); from start_step they are paged out from outside between its reads, as memory
      // pressure reclaims them, so each read is a major fault from disk
      {"page-faults", FaultKind::kPageFaults, "os", "page-faults", {{"pages", 256}}},
      // tensors: temporary buffers each layer of the forward and the backward allocates before its
      // kernels and frees after them through cudaMalloc / cudaFree, as PyTorch does with its caching
      // allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): every free synchronizes the device first
      {"alloc-churn", FaultKind::kAllocChurn, "cpu", "memory-alloc-churn", {{"tensors", 16}}},
      // copies: synchronous device-to-host reads (cudaMemcpy) per step after its optimizer, kb KiB
      // each, as a loop that logs activations with .cpu() / .item(): the host waits for every copy
      // (kb / PCIe bandwidth of modeled device time, plus the stand-in's copy and round trip)
      {"sync-copy", FaultKind::kSyncCopy, "cpu", "sync-memcpy", {{"copies", 256}, {"kb", 64}}},
      // tensors: parameter tensors the rank's optimizer steps one by one (5 elementwise kernels
      // each, launched after the host waited for the gradients) where its peers run one fused
      // kernel, as torch.optim.Adam(foreach=False) does: the host's work per launch is the step
      {"launch-bound", FaultKind::kLaunchBound, "cpu", "launch-bound", {{"tensors", 300}}},
      // rate: UDP packets a second received for the rank's CPU (RPS on a private loopback); filters:
      // tc u32 filters each packet walks on ingress, the per-packet receive cost (~4 ns a filter
      // here: 2,000 filters at 20,000 packets a second take ~15% of the CPU)
      {"irq-softirq", FaultKind::kIrqSoftirq, "os", "irq-softirq", {{"rate", 20000}, {"filters", 2000}}},
  };
  return k;
}

const KindInfo* find_kind(const std::string& name) {
  for (const auto& k : kinds()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

const KindInfo& info(FaultKind kind) {
  for (const auto& k : kinds()) {
    if (k.kind == kind) return k;
  }
  return kinds().front();
}

Result<double> parse_number(const std::string& key, const std::string& value) {
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || end == nullptr || *end != 0 || !std::isfinite(v)) {
    return Error{"bad value for " + key + ": '" + value + "' (want a number)"};
  }
  return v;
}

}  // namespace

const char* fault_layer(FaultKind kind) { return info(kind).layer; }
const char* fault_cause(FaultKind kind) { return info(kind).cause; }

const char* fault_cause(const FaultSpec& f) {
  if (f.kind == FaultKind::kGpuXid && f.params.count("code")) {
    int code = static_cast<int>(f.param("code"));
    if (code == 48) return "gpu-memory-errors";
    if (code == 74) return "nvlink-degraded";
  }
  return fault_cause(f.kind);
}

bool stops_device(const FaultSpec& f) {
  return f.kind == FaultKind::kHang || (f.kind == FaultKind::kGpuXid && f.params.count("code") && f.param("code") == 79);
}

Result<FaultSpec> parse_fault(const std::string& text, int ranks, int steps) {
  std::string kind_name = text.substr(0, text.find(':'));
  const KindInfo* k = find_kind(kind_name);
  if (k == nullptr) {
    std::string all;
    for (const auto& i : kinds()) all += (all.empty() ? "" : ", ") + std::string(i.name);
    return Error{"unknown fault kind '" + kind_name + "' (known: " + all + ")"};
  }
  FaultSpec spec;
  spec.kind = k->kind;
  spec.name = k->name;
  spec.params = k->defaults;
  spec.start_step = std::max(1, steps / 10);  // a baseline before the fault
  bool have_rank = false;
  std::string rest = text.find(':') == std::string::npos ? "" : text.substr(text.find(':') + 1);
  size_t pos = 0;
  while (pos < rest.size()) {
    size_t comma = rest.find(',', pos);
    std::string item = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? rest.size() : comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos) return Error{"bad fault option '" + item + "' (want key=value)"};
    std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "rank" && value == "all") {
      bool can = k->kind == FaultKind::kGpuSlow || k->kind == FaultKind::kIoStall || k->kind == FaultKind::kNetworkSlow;
      if (!can) return Error{"fault " + spec.name + " takes no rank=all (only gpu-slow, io-stall, network-slow)"};
      spec.all_ranks = true;
      spec.rank = 0;  // its steps time the fault
      have_rank = true;
      continue;
    }
    if (key == "where" && k->kind == FaultKind::kIoStall) {
      if (value != "worker" && value != "rank") return Error{"where=" + value + ": want worker or rank"};
      spec.in_worker = value == "worker";
      continue;
    }
    if (key == "kernel" && k->kind == FaultKind::kKernelRegression) {
      if (value.empty() || value.size() >= 64) return Error{"kernel=" + value + ": want a kernel name of 1..63 characters"};
      spec.kernel = value;
      continue;
    }
    auto num = parse_number(key, value);
    if (!num.ok()) return num.error();
    if (key == "rank") {
      if (*num != std::floor(*num) || *num < 0 || *num >= ranks) {
        return Error{"rank=" + value + " is not a rank of this job (0.." + std::to_string(ranks - 1) + ")"};
      }
      spec.rank = static_cast<int>(*num);
      have_rank = true;
    } else if (key == "start_step" || key == "start") {
      if (*num != std::floor(*num) || *num < 0 || *num >= steps) {
        return Error{"start_step=" + value + " is outside the run (0.." + std::to_string(steps - 1) + ")"};
      }
      spec.start_step = static_cast<int>(*num);
    } else if (k->defaults.count(key)) {
      if (*num <= 0) return Error{key + "=" + value + " must be positive"};
      spec.params[key] = *num;
    } else {
      std::string known = spec.kind == FaultKind::kKernelRegression ? "start_step, kernel" : "rank, start_step";
      for (const auto& [d, _] : k->defaults) known += ", " + d;
      return Error{"fault " + spec.name + " has no option '" + key + "' (options: " + known + ")"};
    }
  }
  if (spec.kind == FaultKind::kNone) {
    if (have_rank) return Error{"fault none takes no rank"};
    spec.start_step = 0;
    return spec;
  }
  if (spec.kind == FaultKind::kKernelRegression) {
    if (have_rank) return Error{"fault kernel-regression is on every rank; it takes no rank"};
    if (spec.params["factor"] <= 1.0) return Error{"kernel-regression factor must be > 1"};
    if (spec.kernel.empty()) spec.kernel = "ampere_sgemm_128x64_tn";  // the forward GEMM
    spec.all_ranks = true;
    spec.rank = 0;
    return spec;
  }
  if (!have_rank) return Error{"fault " + spec.name + " needs rank=R (or rank=all)"};
  if (spec.kind == FaultKind::kGpuSlow && spec.params["factor"] <= 1.0) {
    return Error{"gpu-slow factor must be > 1"};
  }
  if (spec.kind == FaultKind::kGpuXid) {
    double code = spec.params["code"];
    if (code != 48 && code != 74 && code != 79)
      return Error{"gpu-xid code=" + std::to_string(static_cast<long long>(code)) +
                   ": the testbed raises 48 (double-bit ECC), 74 (NVLink error) or 79 (fell off the bus)"};
  }
  if ((spec.kind == FaultKind::kPcieDegraded || spec.kind == FaultKind::kNvlinkErrors || spec.kind == FaultKind::kGpuXid) &&
      spec.params["factor"] < 1.0) {
    return Error{spec.name + " factor must be >= 1 (a slowdown)"};
  }
  if (spec.kind == FaultKind::kIrqSoftirq && (spec.params["filters"] > 50000 || spec.params["rate"] > 1e6)) {
    return Error{"irq-softirq: at most filters=50000 and rate=1000000 (packets a second)"};
  }
  if (spec.kind == FaultKind::kCpuThrottling && spec.params["quota_pct"] >= 100) {
    return Error{"cpu-throttling quota_pct must be below 100"};
  }
  return spec;
}

void add_run_options(CLI::App& app, RunArgs& a) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--ranks", a.ranks, "ranks of the job, one stand-in GPU each (1..16, required)")->type_name("N");
  app.add_option("--steps", a.steps, "training steps (required)")->type_name("S");
  app.add_option("--fault", a.fault,
                 "the fault to inject (default none): cpu-contention[hogs] cpu-throttling[quota_pct] "
                 "memory-reclaim[headroom_mb] io-stall[rate_mbps] host-hotspot[ms] gpu-slow[factor] "
                 "network-slow[rate_mbit] hang workload-imbalance[factor] kernel-regression[kernel,factor] (every rank); "
                 "NVML: gpu-ecc gpu-xid[code=79|48|74] pcie-degraded[factor] nvlink-errors[factor]; "
                 "CUDA memory calls: alloc-churn[tensors] sync-copy[copies,kb] (C++ rank only); slow-cpu[factor] (every rank on "
                 "the rank's CPU), page-faults[pages] (C++ rank only); launch-bound[tensors] (the optimizer stepped tensor by tensor); "
                 "irq-softirq[rate,filters] (network receive work steered to the rank's CPU; every rank on that CPU); "
                 "rank=all: gpu-slow, io-stall and network-slow on every rank alike; io-stall where=worker: "
                 "through a data-loader worker process")
      ->type_name("KIND[:rank=R,start_step=K,key=value...]");
  app.add_flag("--python", a.python, "ranks run rank.py (PyTorch-like Python) instead of the C++ rank");
  app.add_option("--python-exe", a.python_exe, "the Python for --python (default: python3 on PATH)")->type_name("PY");
  app.add_option("--mode", a.mode, "ddp (default) or fsdp")->type_name("ddp|fsdp");
  app.add_option("--pp", a.pp, "pipeline stages (default 1); stages compute unequal shares by design")->type_name("P");
  app.add_option("--tp", a.tp, "tensor-parallel width (default 1); --ranks defaults to P x T, a multiple adds "
                 "data-parallel replicas")->type_name("T");
  app.add_option("--seed", a.seed, "seed of the modeled jitter (default 1)")->type_name("N");
  app.add_option("--truth", a.truth, "write the ground truth (the fault, its rank, layer and cause) here")
      ->type_name("FILE.json");
  app.add_option("--hang-timeout", a.hang_timeout, "stop the run after SEC without progress (default 30)")
      ->type_name("SEC");
  app.add_option("--scale", a.scale, "multiplies the modeled kernel durations (default 1)")->type_name("F");
  app.add_flag("--quiet", a.quiet, "no per-step lines");
  app.add_flag("--driver-api", a.driver_api,
               "the C++ rank launches its relu and layer-norm kernels through the driver API "
               "(cuLaunchKernel / cuLaunchKernelEx of a loaded module), as Triton does");
  app.add_flag("--memory-calls", a.memory_calls,
               "the C++ rank allocates, copies synchronously and frees each step (cudaMalloc, cudaMemcpy, "
               "cudaFree; with --driver-api also cuMemAlloc / cuMemFree)");
}

Result<Options> finish_run(const RunArgs& a) {
  Options o;
  auto integer = [](const char* flag, const std::string& v, int lo, int hi) -> Result<int> {
    char* end = nullptr;
    long n = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != 0 || n < lo || n > hi) {
      return Error{std::string(flag) + " " + v + ": want an integer in " + std::to_string(lo) + ".." + std::to_string(hi)};
    }
    return static_cast<int>(n);
  };
  auto number = [](const char* flag, const std::string& v) -> Result<double> {
    auto n = parse_number(flag, v);
    if (!n.ok()) return n.error();
    if (*n <= 0) return Error{std::string(flag) + " must be positive"};
    return *n;
  };
  for (auto [flag, text, out] : {std::tuple{"--pp", &a.pp, &o.pp}, std::tuple{"--tp", &a.tp, &o.tp}}) {
    if (text->empty()) continue;
    auto v = integer(flag, *text, 1, 16);
    if (!v.ok()) return v.error();
    *out = *v;
  }
  const bool model_parallel = o.pp > 1 || o.tp > 1;
  if (a.ranks.empty() && !model_parallel) return Error{"--ranks N is required"};
  if (a.steps.empty()) return Error{"--steps S is required"};
  auto ranks = a.ranks.empty() ? Result<int>(o.pp * o.tp) : integer("--ranks", a.ranks, 1, 16);  // one node: at most 16 stand-in GPUs
  if (!ranks.ok()) return ranks.error();
  o.ranks = *ranks;
  if (o.ranks > 16 || o.ranks % (o.pp * o.tp) != 0)
    return Error{"--ranks " + std::to_string(o.ranks) + ": want a multiple of --pp x --tp (" + std::to_string(o.pp * o.tp) +
                 "), at most 16"};
  auto steps = integer("--steps", a.steps, 1, 1000000);
  if (!steps.ok()) return steps.error();
  o.steps = *steps;
  if (!a.seed.empty()) {
    auto v = integer("--seed", a.seed, 0, 2147483647);
    if (!v.ok()) return v.error();
    o.seed = static_cast<unsigned>(*v);
  }
  o.python = a.python || !a.python_exe.empty();
  if (o.python && model_parallel) return Error{"--pp/--tp: only the C++ rank is pipeline/tensor parallel (drop --python)"};
  if (o.python && (a.driver_api || a.memory_calls))
    return Error{"--driver-api/--memory-calls: only the C++ rank makes these calls (drop --python)"};
  o.driver_api = a.driver_api;
  if (o.python && (a.fault.rfind("alloc-churn", 0) == 0 || a.fault.rfind("sync-copy", 0) == 0))
    return Error{"--fault " + a.fault.substr(0, a.fault.find(':')) + ": only the C++ rank makes device-memory calls (drop --python)"};
  if (o.python && a.fault.rfind("page-faults", 0) == 0)
    return Error{"--fault page-faults: only the C++ rank reads memory-mapped data (drop --python)"};
  if (o.python && a.fault.rfind("slow-cpu", 0) == 0)
    return Error{"--fault slow-cpu: only the C++ rank runs its CPU work slower (drop --python)"};
  o.memory_calls = a.memory_calls;
  if (model_parallel && !a.mode.empty() && a.mode != "ddp") return Error{"--pp/--tp: the replicas of a stage are ddp; drop --mode"};
  o.python_exe = a.python_exe;
  o.truth_path = a.truth;
  if (!a.mode.empty()) {
    if (a.mode != "ddp" && a.mode != "fsdp") return Error{"--mode " + a.mode + ": want ddp or fsdp"};
    o.mode = a.mode;
  }
  if (!a.hang_timeout.empty()) {
    auto v = number("--hang-timeout", a.hang_timeout);
    if (!v.ok()) return v.error();
    o.hang_timeout_s = *v;
  }
  if (!a.scale.empty()) {
    auto v = number("--scale", a.scale);
    if (!v.ok()) return v.error();
    o.scale = *v;
  }
  o.quiet = a.quiet;
  auto fault = parse_fault(a.fault, o.ranks, o.steps);
  if (!fault.ok()) return fault.error().context("--fault " + a.fault);
  o.fault = *fault;
  return o;
}

Result<Options> parse_run(const std::vector<std::string>& args) {
  CLI::App app{"", "run"};
  RunArgs a;
  add_run_options(app, a);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::Error& e) {
    return Error{e.what()};
  }
  return finish_run(a);
}

}  // namespace testbed::sim
