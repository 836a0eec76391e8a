#include "testbed/synth/job.h"

#include <algorithm>
#include <cmath>

namespace strata::synth {
namespace {

// The healthy step, as shares of the step time: the GPU computes 60%, idles 10% waiting for the
// host (which spends 25% of the step on a CPU), and the all-reduce takes the rest. Healthy ranks
// are busy (compute + idle) at most kSlowestHealthy of the step; the collective itself adds kComm.
constexpr double kDevShare = 0.6;
constexpr double kIdleShare = 0.1;
constexpr double kCpuShare = 0.25;
constexpr double kRunqShare = 0.01;
constexpr double kKworkerShare = 0.001;
constexpr double kSlowestHealthy = 0.72;
constexpr double kCommShare = 0.28;
// Relative per-rank, per-step noise of each phase (uniform in +-kNoise): small enough that a healthy
// rank never outlasts kSlowestHealthy (0.7 * 1.02 < 0.72).
constexpr double kNoise = 0.02;
// cpu-contention: each hog takes this share of a step from the rank, runnable but not running;
// the hogs run twice that on its CPUs.
constexpr double kHogShare = 0.2;
// network-slow: at strata-sim run's default rate (60 Mbit/s) every collective takes this share of a
// step longer; a slower link proportionally more. The slow link's connections have this smoothed RTT
// at that rate, where healthy ones have kHealthyRttUs.
constexpr double kNetShareAt60 = 0.3;
constexpr double kSlowRttUsAt60 = 20'000;
constexpr double kHealthyRttUs = 100;
constexpr double kAllreduceBytes = 100e6;
// The GPUs' SM clock, MHz (an A100's maximum).
constexpr double kMaxSmClockMhz = 1410;
// On-CPU sampling rate of the agents (the recording's sample_hz).
constexpr unsigned kSampleHz = 99;

constexpr double kNsPerMs = 1e6;
// Pids: a job's ranks take pids in one of kPidBuckets ranges of kPidBucketSize (jobs of up to that
// many ranks), chosen by the job's name.
constexpr uint32_t kPidBuckets = 400;
constexpr uint32_t kPidBucketSize = 10000;

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1], fixed by (seed, rank, step, salt).
double noise(uint64_t seed, int rank, size_t step, int salt) {
  uint64_t h = splitmix(seed ^ splitmix(static_cast<uint64_t>(rank) * 1000003ull + static_cast<uint64_t>(salt)) ^
                        splitmix(static_cast<uint64_t>(step) + 0x51ed27ull));
  return static_cast<double>(h >> 11) / static_cast<double>(1ull << 52) - 1.0;
}

uint64_t ns(double ms) { return static_cast<uint64_t>(std::llround(ms * kNsPerMs)); }

Frame fn(const std::string& name) {
  Frame f;
  f.kind = FrameKind::kNative;
  f.module = "/opt/train/bin/trainer";
  f.function = name;
  f.offset = std::hash<std::string>{}(name) & 0xffffff;
  return f;
}

// A rank's network endpoint: every GPU has a NIC of its own.
std::string endpoint(int node, int local, int port) {
  return "10." + std::to_string(node >> 8) + "." + std::to_string(node & 255) + "." + std::to_string(local + 1) + ":" +
         std::to_string(port);
}

enum StackId { kForward, kLoad, kAugment, kWait, kStackCount };

}  // namespace

Stack trainer_stack(std::initializer_list<const char*> root_first) {
  Stack stk;
  for (auto it = std::rbegin(root_first); it != std::rend(root_first); ++it) stk.push_back(fn(*it));
  return stk;
}

const char* fault_cause(Fault f) {
  switch (f) {
    case Fault::kGpuSlow: return "gpu-slow";
    case Fault::kCpuContention: return "cpu-contention";
    case Fault::kHostHotspot: return "host-hotspot";
    case Fault::kNetworkSlow: return "network-slow";
    case Fault::kHang: return "hang";
    case Fault::kNone: break;
  }
  return "";
}

Job::Job(JobSpec spec) : spec_(std::move(spec)) {
  if (spec_.history_s > 0 && spec_.history_every_s > 0)
    history_steps_ = static_cast<size_t>(std::floor(spec_.history_s / spec_.history_every_s));
  const size_t total = history_steps_ + static_cast<size_t>(std::max(0, spec_.steps));
  start_ns_.resize(total);
  end_ns_.resize(total);
  for (size_t h = 0; h < history_steps_; ++h) {
    start_ns_[h] = spec_.t0_ns - ns(spec_.history_s * 1e3) + ns(static_cast<double>(h) * spec_.history_every_s * 1e3);
    end_ns_[h] = start_ns_[h] + ns(step_ms_of(h));
    windows_.push_back({start_ns_[h], end_ns_[h], h, h + 1, true});
  }
  uint64_t t = spec_.t0_ns;
  for (size_t k = history_steps_; k < total; ++k) {
    start_ns_[k] = t;
    end_ns_[k] = t + ns(step_ms_of(k));
    t = end_ns_[k];
  }
  append_live_windows(0, windows_);
}

void Job::append_live_windows(uint64_t offset_ns, std::vector<Window>& out) const {
  const size_t total = end_ns_.size();
  if (total == history_steps_) return;
  const uint64_t win = ns(spec_.window_s * 1e3);
  const uint64_t last = end_ns_.back();
  // A step belongs to the window its end falls in (the last window holds the last step's end).
  size_t k = history_steps_;
  for (uint64_t w0 = spec_.t0_ns; w0 < last;) {
    const uint64_t w1 = std::min(last, w0 + win + (w0 == spec_.t0_ns ? offset_ns : 0));
    Window w{w0, w1, k, k, false};
    while (k < total && (end_ns_[k] < w1 || w1 == last)) ++k;
    w.end_step = k;
    out.push_back(w);
    w0 = w1;
  }
}

std::vector<Job::Window> Job::windows(uint64_t offset_ns) const {
  std::vector<Window> out(windows_.begin(), windows_.begin() + static_cast<std::ptrdiff_t>(history_steps_));
  const uint64_t win = ns(spec_.window_s * 1e3);
  append_live_windows(win > 0 ? offset_ns % win : 0, out);
  return out;
}

uint32_t Job::pid(int rank) const {
  // Distinct pids per rank, or (containers) the same per local rank on every node. The base depends
  // on the job's name: jobs shipped to one collector under the same node names do not share
  // (node, pid) pairs (pid_max is 4,194,304 by default).
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : spec_.job) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  const uint32_t base = spec_.pid_base >= 0 ? static_cast<uint32_t>(spec_.pid_base)
                                            : 1000 + static_cast<uint32_t>(h % kPidBuckets) * kPidBucketSize;
  const int local = rank % spec_.ranks_per_node;
  return base + static_cast<uint32_t>(spec_.same_pids ? local : rank);
}

std::string Job::culprit() const {
  const int local = spec_.fault_rank % spec_.ranks_per_node;
  switch (spec_.fault) {
    case Fault::kGpuSlow:
    case Fault::kHang: return "GPU " + std::to_string(local);
    case Fault::kCpuContention: return "cpu-hog";
    case Fault::kHostHotspot: return "slow_augment";
    case Fault::kNetworkSlow: return "link of rank " + std::to_string(spec_.fault_rank);
    case Fault::kNone: break;
  }
  return "";
}

uint64_t Job::fault_start_ns() const {
  if (spec_.fault == Fault::kNone) return 0;
  size_t k = history_steps_ + static_cast<size_t>(spec_.fault_start_step);
  return k < start_ns_.size() ? start_ns_[k] : 0;
}

size_t Job::steps_done() const {
  if (spec_.fault == Fault::kHang) return history_steps_ + static_cast<size_t>(spec_.fault_start_step);
  return start_ns_.size();
}

bool Job::faulty(int rank, size_t step) const {
  return spec_.fault != Fault::kNone && step >= history_steps_ &&
         step - history_steps_ >= static_cast<size_t>(spec_.fault_start_step) &&
         (rank == spec_.fault_rank || spec_.fault == Fault::kNetworkSlow);
}

Job::RankStep Job::rank_step(int rank, size_t step) const {
  const double S = spec_.step_ms;
  const uint64_t seed = spec_.seed;
  RankStep r;
  r.dev = kDevShare * S * (1 + kNoise * noise(seed, rank, step, 1));
  r.idle = kIdleShare * S * (1 + kNoise * noise(seed, rank, step, 2));
  r.cpu = kCpuShare * S * (1 + kNoise * noise(seed, rank, step, 3));
  r.runq = kRunqShare * S * (1 + 10 * kNoise * noise(seed, rank, step, 4));
  if (rank != spec_.fault_rank || !faulty(rank, step)) return r;
  const double p = spec_.fault_param;
  switch (spec_.fault) {
    case Fault::kGpuSlow:
      r.dev *= p;
      break;
    case Fault::kHostHotspot:
      r.idle += p;
      r.cpu += p;
      r.hotspot = p;
      break;
    case Fault::kCpuContention: {
      double lost = kHogShare * S * p;
      r.idle += lost;
      r.runq += lost;
      r.neighbour = 2 * lost;
      break;
    }
    default:
      break;
  }
  return r;
}

double Job::step_ms_of(size_t step) const {
  const double S = spec_.step_ms;
  double busy = kSlowestHealthy * S;
  if (spec_.fault_rank >= 0 && faulty(spec_.fault_rank, step)) busy = std::max(busy, rank_step(spec_.fault_rank, step).busy());
  double comm = kCommShare * S * (1 + 0.5 * kNoise * noise(spec_.seed, -1, step, 5));
  if (spec_.fault == Fault::kNetworkSlow && faulty(spec_.fault_rank, step))
    comm += kNetShareAt60 * S * 60 / spec_.fault_param;
  return busy + comm;
}

Status Job::NodeWriter::intern() {
  if (!stacks_.empty()) return {};
  const Stack all[kStackCount] = {
      trainer_stack({"_start", "main", "train_step", "forward", "launch_kernels"}),
      trainer_stack({"_start", "main", "train_step", "load_batch", "preprocess", "cpu_work"}),
      trainer_stack({"_start", "main", "train_step", "load_batch", "slow_augment", "cpu_work"}),
      trainer_stack({"_start", "main", "train_step", "allreduce", "ncclAllReduce", "poll"}),
  };
  for (const auto& s : all) {
    auto id = out_.intern_stack(s, store::UnwindMethod::kFramePointer);
    if (!id) return id.error();
    stacks_.push_back(*id);
  }
  return {};
}

Status Job::NodeWriter::begin(uint64_t started_ns) {
  const JobSpec& sp = job_.spec_;
  auto rec = out_.begin_recording({Job::node_name(node_), "strata-sim agents (synthetic job " + sp.job + ")", started_ns,
                                   kSampleHz, sp.window_s});
  if (!rec) return rec.error();
  rec_ = *rec;
  std::vector<store::CommunicatorRecord> comms;
  const uint64_t t_first = job_.start_ns_.empty() ? started_ns : job_.start_ns_.front();
  // Without a RANK in the environment, the ranks' parent: the launcher, a pid below the node's first.
  const uint32_t launcher = job_.pid(node_ * sp.ranks_per_node) - 1;
  if (!sp.rank_env) {
    store::ProcessInfo p;
    p.pid = launcher;
    p.ppid = 1;
    p.start_ns = t_first - 31'000'000'000ull;
    p.node = Job::node_name(node_);
    p.comm = "python3";
    p.command = "python3 train.py";
    if (auto st = out_.put_process(rec_, p); !st) return st;
  }
  for (int l = 0; l < sp.ranks_per_node; ++l) {
    const int rank = node_ * sp.ranks_per_node + l;
    store::ProcessInfo p;
    p.pid = job_.pid(rank);
    p.ppid = sp.rank_env ? 1 : launcher;
    p.start_ns = t_first - 30'000'000'000ull;  // the process started before its first step
    p.node = Job::node_name(node_);
    p.comm = "python3";
    p.command = "python3 train.py --job " + sp.job;
    if (sp.rank_env) {
      p.job = sp.job;
      p.rank = rank;
      p.local_rank = l;
      p.world_size = job_.world();
    }
    if (auto st = out_.put_process(rec_, p); !st) return st;
    store::CommunicatorRecord c;
    c.pid = p.pid;
    c.handle = 0x7f0000001000ull + static_cast<uint64_t>(l);
    c.comm_id = "synth-" + sp.job;
    c.rank = rank;
    c.nranks = job_.world();
    c.init_ns = t_first - 5'000'000'000ull;
    comms.push_back(c);
  }
  if (auto st = out_.put_communicators(rec_, comms); !st) return st;
  return intern();
}

Status Job::NodeWriter::end(uint64_t ended_ns) { return out_.end_recording(rec_, ended_ns); }

Status Job::NodeWriter::window(const Window& w) {
  const JobSpec& sp = job_.spec_;
  const double S = sp.step_ms;
  const double win_ms = static_cast<double>(w.end_ns - w.start_ns) / kNsPerMs;
  const size_t done = job_.steps_done();
  const int world = job_.world();
  std::vector<store::StepRecord> steps;
  std::vector<store::CollectiveRecord> colls;
  std::vector<store::DeviceActivity> dev;
  std::vector<store::Metric> metrics;
  std::vector<store::StackCount> counts;
  const bool hang = sp.fault == Fault::kHang;
  const size_t hang_step = job_.history_steps_ + static_cast<size_t>(sp.fault_start_step);
  // A step's two compute kernels from ks on, dev ms in all (the GEMM 80%).
  auto compute_kernels = [&](uint32_t pid, int l, size_t k, uint64_t ks, double dev_ms) {
    dev.push_back({pid, l, "kernel", "ampere_sgemm_128x64_tn", 7, ks, ks + ns(0.8 * dev_ms), 0, pid, k * 3 + 1, 0, {}});
    dev.push_back({pid, l, "kernel", "vectorized_elementwise_kernel", 7, ks + ns(0.8 * dev_ms), ks + ns(dev_ms), 0, pid,
                   k * 3 + 2, 0, {}});
  };
  // Step k's all-reduce as the probes see it, entered at enter_ns on `stream`.
  auto allreduce = [&](uint32_t pid, int l, size_t k, uint64_t enter_ns, uint64_t stream) {
    store::CollectiveRecord c;
    c.pid = pid;
    c.tid = pid;
    c.library = "nccl";
    c.op = "allreduce";
    c.comm_id = "synth-" + sp.job;
    c.comm_handle = 0x7f0000001000ull + static_cast<uint64_t>(l);
    c.seq = k + 1;
    c.bytes = static_cast<uint64_t>(kAllreduceBytes);
    c.count = c.bytes / 4;
    c.dtype = 7;
    c.redop = 0;
    c.stream = stream;
    c.enter_ns = enter_ns;
    c.exit_ns = enter_ns + 50'000;
    return c;
  };
  for (int l = 0; l < sp.ranks_per_node; ++l) {
    const int rank = node_ * sp.ranks_per_node + l;
    const uint32_t pid = job_.pid(rank);
    RankStep sum;
    size_t n = 0;
    double gpu_faulty = 0;  // steps of this window its GPU was slow
    for (size_t k = w.first_step; k < w.end_step; ++k) {
      const uint64_t ts = job_.start_ns_[k], te = job_.end_ns_[k];
      const RankStep r = job_.rank_step(rank, k);
      if (k >= done) {
        // Hung: the ranks whose GPU still works finish their compute of the hang step and wait in
        // its all-reduce for ever; the culprit's GPU never finishes.
        if (!(hang && k == hang_step) || rank == sp.fault_rank) continue;
        compute_kernels(pid, l, k, ts + ns(r.idle), r.dev);
        store::CollectiveRecord c = allreduce(pid, l, k, ts + ns(r.busy()), 7);
        c.completion = "none";
        colls.push_back(c);
        continue;
      }
      ++n;
      sum.dev += r.dev, sum.idle += r.idle, sum.cpu += r.cpu, sum.runq += r.runq;
      sum.hotspot += r.hotspot, sum.neighbour += r.neighbour;
      if (sp.fault == Fault::kGpuSlow && job_.faulty(rank, k) && rank == sp.fault_rank) gpu_faulty += 1;
      const uint64_t busy_end = ts + ns(r.busy());
      store::StepRecord s;
      s.pid = pid;
      s.step = k + 1;
      s.start_ns = ts;
      s.end_ns = te;
      s.collective_ns = te - busy_end;
      s.device_known = true;
      s.device_compute_ns = ns(r.dev);
      s.device_collective_ns = te - busy_end;
      s.gpu_idle_ns = ns(r.idle);
      steps.push_back(s);
      compute_kernels(pid, l, k, ts + ns(r.idle), r.dev);
      dev.push_back({pid, l, "collective", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 8, busy_end, te, 0, pid, k * 3 + 3,
                     static_cast<uint64_t>(kAllreduceBytes), {}});
      store::CollectiveRecord c = allreduce(pid, l, k, busy_end, 8);
      c.device_start_ns = busy_end;
      c.device_end_ns = te;
      c.completion = "device";
      colls.push_back(c);
    }
    if (n == 0) {
      // No step ended here (a hung job): the process is alive and its threads wait; the OS sees
      // it at the healthy rates of a host that mostly sleeps.
      const double f = win_ms / S;
      sum.cpu = 0.1 * kCpuShare * S * f;
      sum.runq = kRunqShare * S * f;
    }
    const double kworker = kKworkerShare * S * std::max<double>(1, static_cast<double>(n));
    metrics.push_back({pid, "gpu.device", "", static_cast<double>(l)});
    metrics.push_back({pid, "os.cpu_time_us", "", sum.cpu * 1e3});
    metrics.push_back({pid, "os.runq_wait_us", "", sum.runq * 1e3});
    metrics.push_back({pid, "os.cgroup_throttled_us", "", 0});
    metrics.push_back({pid, "os.blocked_us", "io", 0.002 * S * static_cast<double>(n) * 1e3});
    metrics.push_back({pid, "os.major_faults", "", 0});
    metrics.push_back({pid, "api.time_us", "cudaLaunchKernel", 0.005 * S * static_cast<double>(n) * 1e3});
    metrics.push_back({pid, "os.neighbour_run_us", "kworker/" + std::to_string(l) + ":1:" + std::to_string(300 + l),
                       kworker * 1e3});
    if (sum.neighbour > 0)
      metrics.push_back({pid, "os.neighbour_run_us", "cpu-hog:" + std::to_string(pid + 5000), sum.neighbour * 1e3});
    // Its ring connections: it sends to the next rank and receives from the previous one. A slow
    // link (network-slow) slows both of the culprit's connections.
    if (world > 1 && n > 0) {
      const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
      const int R = sp.ranks_per_node;
      auto slow = [&](int a, int b) {
        bool on = sp.fault == Fault::kNetworkSlow && job_.faulty(sp.fault_rank, w.end_step - 1);
        return on && (a == sp.fault_rank || b == sp.fault_rank);
      };
      const double bytes = kAllreduceBytes * static_cast<double>(n);
      const std::string out_label = endpoint(node_, l, 50000) + ">" + endpoint(next / R, next % R, 4000);
      const double rtt = slow(rank, next) ? kSlowRttUsAt60 * 60 / sp.fault_param
                                          : kHealthyRttUs * (1 + 0.1 * noise(sp.seed, rank, w.end_step, 6));
      metrics.push_back({pid, "net.tcp_sent_bytes", out_label, bytes});
      metrics.push_back({pid, "net.tcp_srtt_us", out_label, rtt});
      metrics.push_back({pid, "net.tcp_received_bytes", endpoint(node_, l, 4000) + ">" + endpoint(prev / R, prev % R, 50000),
                         bytes});
    }
    // On-CPU samples of the rank's CPU time, at the agents' rate.
    auto samples = [](double ms) { return static_cast<uint64_t>(std::llround(ms * kSampleHz / 1e3)); };
    const double usual = std::max(0.0, sum.cpu - sum.hotspot);
    const std::pair<StackId, double> parts[] = {
        {kForward, 0.4 * usual}, {kLoad, 0.4 * usual}, {kWait, 0.2 * usual}, {kAugment, sum.hotspot}};
    for (const auto& [id, ms] : parts) {
      uint64_t c = samples(ms);
      if (c > 0) counts.push_back({pid, pid, "python3", stacks_[id], c});
    }
    // NVML, node-wide: the GPU of this rank (a slow one throttles and clocks down).
    const std::string gpu = "gpu" + std::to_string(l);
    const double slow_share = n > 0 ? gpu_faulty / static_cast<double>(n) : 0;
    const double factor = sp.fault == Fault::kGpuSlow ? sp.fault_param : 1;
    metrics.push_back({0, "gpu.sm_clock_mhz", gpu, kMaxSmClockMhz * (1 - slow_share + slow_share / factor)});
    metrics.push_back({0, "gpu.max_sm_clock_mhz", gpu, kMaxSmClockMhz});
    metrics.push_back({0, "gpu.throttle.hw_slowdown", gpu, slow_share});
    metrics.push_back({0, "gpu.throttle.hw_thermal", gpu, slow_share});
    metrics.push_back({0, "gpu.pcie_link_gen", gpu, 4});
    metrics.push_back({0, "gpu.pcie_link_width", gpu, 16});
    metrics.push_back({0, "gpu.pcie_link_max_width", gpu, 16});
    metrics.push_back({0, "gpu.ecc_uncorrected", gpu, 0});
  }
  if (auto st = out_.put_steps(rec_, steps); !st) return st;
  if (auto st = out_.put_collectives(rec_, colls); !st) return st;
  if (auto st = out_.put_device_activity(rec_, dev); !st) return st;
  if (auto st = out_.put_metrics(rec_, w.start_ns, w.end_ns, metrics); !st) return st;
  return out_.put_window(rec_, w.start_ns, w.end_ns, store::CountKind::kOnCpu, counts);
}

}  // namespace strata::synth
