#include "testbed/sim/faults.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "testbed/common/testbed_env.h"

namespace testbed::sim {

using strata::Error;
using strata::Status;

std::string sim_tag() { return "strata-" + std::to_string(::getpid()); }

namespace {

// irq-softirq: the sender's destination port (nothing listens; no filter matches) and the first of
// the filters' ports.
constexpr uint16_t kIrqTargetPort = 9;
constexpr int kIrqFirstPort = 10000;

// memory-reclaim: the culprit's data file and the samples every rank reads per step (4 KiB each).
// With the limit leaving a few MiB of page cache, most of the culprit's reads miss.
constexpr int kReclaimShardMb = 48;
constexpr int kReclaimSamples = 4096;

// Faults of a CPU rather than a rank: every rank pinned to the culprit's CPU suffers them (a slower
// core; receive work steered to a core).
bool shares_cpu(FaultKind k) { return k == FaultKind::kSlowCpu || k == FaultKind::kIrqSoftirq; }

// Runs a command, waits; on failure returns its stderr's first line.
Status run_cmd(const std::vector<std::string>& argv, std::string* out = nullptr) {
  int pipe_out[2], pipe_err[2];
  if (::pipe2(pipe_out, O_CLOEXEC) != 0 || ::pipe2(pipe_err, O_CLOEXEC) != 0) return Error::from_errno("pipe", errno);
  pid_t pid = ::fork();
  if (pid < 0) return Error::from_errno("fork", errno);
  if (pid == 0) {
    ::dup2(pipe_out[1], 1);
    ::dup2(pipe_err[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(pipe_out[1]);
  ::close(pipe_err[1]);
  std::string o, e;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipe_out[0], buf, sizeof(buf))) > 0) o.append(buf, static_cast<size_t>(n));
  while ((n = ::read(pipe_err[0], buf, sizeof(buf))) > 0) e.append(buf, static_cast<size_t>(n));
  ::close(pipe_out[0]);
  ::close(pipe_err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (out) *out = o;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  std::string cmd;
  for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
  std::string first = e.substr(0, e.find('\n'));
  return Error{"'" + cmd + "' failed" + (first.empty() ? "" : ": " + first)};
}

Status write_file(const std::string& path, const std::string& value) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Error::from_errno("opening " + path, errno);
  ssize_t n = ::write(fd, value.data(), value.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(value.size())) return Error::from_errno("writing '" + value + "' to " + path, err);
  return {};
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// This process's cgroup path for a v1 controller (or "" for the v2 line), from /proc/self/cgroup.
std::string own_cgroup(const std::string& controller) {
  std::istringstream in(read_file("/proc/self/cgroup"));
  std::string line;
  while (std::getline(in, line)) {
    // hierarchy-ID:controller-list:path
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string ctrls = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::stringstream cs(ctrls);
    std::string c;
    while (std::getline(cs, c, ',')) {
      if (c == controller) return path == "/" ? "" : path;
    }
    if (controller.empty() && ctrls.empty()) return path == "/" ? "" : path;
  }
  return "";
}

// Binds every thread of `pid` to `cpus`.
void pin_process(pid_t pid, const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    ::sched_setaffinity(static_cast<pid_t>(std::atoi(t.path().filename().c_str())), sizeof(set), &set);
  }
}

// A CPU-bound process named strata-hog, pinned to `cpu`: strata-sim re-executed as
// `strata-hog __hog CPU NICE` (run_hog), so it has its own command line and environment.
pid_t spawn_hog(int cpu, int nice) {
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);  // kept across exec: dies with the sim
  if (::getppid() != parent) ::_exit(0);
  std::string c = std::to_string(cpu), n = std::to_string(nice);
  ::execl("/proc/self/exe", "strata-hog", "__hog", c.c_str(), n.c_str(), static_cast<char*>(nullptr));
  ::_exit(127);
}

// The address range [start, end) where process `pid` maps `path` (from /proc/PID/maps).
std::optional<std::pair<uintptr_t, uintptr_t>> mapping_of(pid_t pid, const std::string& path) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.size() < path.size() || line.compare(line.size() - path.size(), path.size(), path) != 0) continue;
    uintptr_t start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &start, &end) == 2 && end > start) return std::pair{start, end};
  }
  return std::nullopt;
}

// Pages `range` of the process behind `pidfd` out (MADV_PAGEOUT: its clean file pages leave the
// page cache, as reclaim under memory pressure takes them).
Status page_out(int pidfd, std::pair<uintptr_t, uintptr_t> range) {
  iovec io{reinterpret_cast<void*>(range.first), range.second - range.first};
  if (::syscall(SYS_process_madvise, pidfd, &io, 1, MADV_PAGEOUT, 0) < 0)
    return Error{std::string("page-faults: process_madvise(MADV_PAGEOUT): ") + std::strerror(errno)};
  return {};
}

}  // namespace

[[noreturn]] void run_hog(int cpu, int nice) {
  ::prctl(PR_SET_NAME, "strata-hog", 0, 0, 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::sched_setaffinity(0, sizeof(set), &set);
  // A noisy neighbour of higher priority (a backup, a log shipper): the rank's short CPU bursts
  // cannot hide behind the scheduler's wake-up credit. With autogroup scheduling (a session's
  // processes share one weight) the hog needs a session of its own with the priority on it:
  // in the sim's session its weight would be charged to the ranks' group and starve the peers
  // too, on the other CPU, while a nice inside the session would not count against the rank.
  ::setsid();
  if (int fd = ::open("/proc/self/autogroup", O_WRONLY | O_CLOEXEC); fd >= 0) {
    std::string v = std::to_string(nice);
    (void)!::write(fd, v.data(), v.size());
    ::close(fd);
  }
  ::setpriority(PRIO_PROCESS, 0, nice);
  volatile double x = 1.0;
  for (;;) x = std::sqrt(x + 1.0);  // pure CPU: the contention is the point
}

FaultInjector::FaultInjector(const Options& opts, std::string run_dir, strata_gpu_state* gpus)
    : opts_(opts), run_dir_(std::move(run_dir)), gpus_(gpus) {
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  ncpu_ = n > 0 ? static_cast<int>(n) : 1;
  const FaultSpec& f = opts_.fault;
  switch (f.kind) {
    case FaultKind::kCpuContention: culprit_ = "strata-hog"; break;
    case FaultKind::kHostHotspot: culprit_ = "slow_augment"; break;
    // The rank's CPU (rank_setup pins rank r to CPU r % CPUs); the diagnosis says "CPU N of NODE".
    case FaultKind::kSlowCpu: culprit_ = "CPU " + std::to_string(f.rank % ncpu_); break;
    case FaultKind::kPageFaults: culprit_ = "major page faults"; break;
    case FaultKind::kIoStall: culprit_ = "load_batch"; break;
    // Its reads: the data pages load_batch reads are charged to the full cgroup, which reclaims
    // inside the read (try_to_free_mem_cgroup_pages under pread64 in the recorded stacks).
    case FaultKind::kMemoryReclaim: culprit_ = "load_batch"; break;
    case FaultKind::kCpuThrottling: culprit_ = "cgroup cpu quota"; break;
    case FaultKind::kGpuSlow: culprit_ = "GPU " + std::to_string(f.rank); break;
    case FaultKind::kHang: culprit_ = "GPU " + std::to_string(f.rank); break;
    case FaultKind::kNetworkSlow: culprit_ = "link of rank " + std::to_string(f.rank); break;
    // The input, not a function: every function of the step does more of the same work (load_batch
    // reads more, preprocess and the kernels run longer); the diagnosis says "larger batches
    // (more work in F)", F the function whose time grew most, which unwinding decides.
    case FaultKind::kWorkloadImbalance: culprit_ = "larger batches"; break;
    case FaultKind::kKernelRegression: culprit_ = f.kernel; break;
    case FaultKind::kGpuEcc:
    case FaultKind::kGpuXid:
    case FaultKind::kPcieDegraded:
    case FaultKind::kNvlinkErrors: culprit_ = "GPU " + std::to_string(f.rank); break;
    // The calls that churn: every layer's cudaMalloc (and the cudaFree that syncs after it).
    case FaultKind::kAllocChurn: culprit_ = "cudaMalloc"; break;
    case FaultKind::kSyncCopy: culprit_ = "cudaMemcpy"; break;
    // The function that launches the extra kernels (rank_main.cpp, rank.py).
    case FaultKind::kLaunchBound: culprit_ = "optimizer_step_per_tensor"; break;
    // The source the OS layer names (agent/os/proc_readers.cpp's softirq names).
    case FaultKind::kIrqSoftirq: culprit_ = "NET_RX softirq"; break;
    case FaultKind::kNone: break;
  }
  // Every rank alike: the culprit is what they share.
  if (f.all_ranks && f.kind == FaultKind::kGpuSlow) culprit_ = "the GPUs of every rank";
  if (f.all_ranks && f.kind == FaultKind::kNetworkSlow) culprit_ = "communicator";
}

FaultInjector::~FaultInjector() { teardown(); }

std::string FaultInjector::cgroup_file(const std::string& controller, const std::string& file) const {
  auto it = cgroups_.find(controller);
  return it == cgroups_.end() ? "" : it->second + "/" + file;
}

// The culprit's cgroup for `controller`: cgroup v2 when the unified hierarchy has the controller,
// else the v1 hierarchy (this machine: hybrid, cpu/memory/blkio on v1). Created under the sim's
// own cgroup so any limit the sim itself runs under still applies.
Status FaultInjector::prepare_cgroup(const std::string& controller) {
  std::string name = sim_tag() + "-r" + std::to_string(opts_.fault.rank);
  std::string v2_ctrl = controller == "blkio" ? "io" : controller;
  std::string v2_root = "/sys/fs/cgroup";
  std::string dir;
  if (exists(v2_root + "/cgroup.controllers") &&
      read_file(v2_root + "/cgroup.controllers").find(v2_ctrl) != std::string::npos) {
    cgroup_v2_ = true;
    std::string parent = v2_root + own_cgroup("");
    // v2: the parent must delegate the controller to its children.
    (void)write_file(parent + "/cgroup.subtree_control", "+" + v2_ctrl);
    dir = parent + "/" + name;
  } else {
    std::string root = "/sys/fs/cgroup/" + controller;
    if (!exists(root + "/cgroup.procs")) {
      return Error{"no cgroup " + controller + " controller (neither cgroup v2 nor a v1 hierarchy at " + root + ")"};
    }
    dir = root + own_cgroup(controller) + "/" + name;
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Error::from_errno("creating cgroup " + dir + " (needs root)", errno);
  }
  cgroups_[controller] = dir;
  details_["cgroup_" + controller] = dir;
  return {};
}

// Every rank in a network namespace of its own behind a veth pair whose other end is a port of one
// bridge in a namespace of its own (the fabric's switch), as the ranks of a real job sit on nodes of
// their own behind one fabric; the culprit's link alone is slowed at activation. (An earlier layout
// gave the culprit alone a namespace, the others sharing the host's address: every connection that
// crossed a link then touched the culprit, a shape no real cluster has, that a rule could learn.)
Status FaultInjector::prepare_netns() {
  std::string tag = std::to_string(::getpid());
  if (opts_.ranks > 250) return Error{"network-slow in namespaces takes at most 250 ranks (one /24 of veth addresses)"};
  std::string subnet = "10.231." + std::to_string(20 + ::getpid() % 200) + ".";
  std::string sw = sim_tag() + "-sw";
  std::vector<std::vector<std::string>> cmds;
  namespaces_.push_back(sw);
  cmds.push_back({"ip", "netns", "add", sw});
  cmds.push_back({"ip", "netns", "exec", sw, "ip", "link", "add", "sw", "type", "bridge"});
  cmds.push_back({"ip", "netns", "exec", sw, "ip", "link", "set", "sw", "up"});
  for (int r = 0; r < opts_.ranks; ++r) {
    std::string ns = sim_tag() + "-r" + std::to_string(r);
    std::string outer = "sv" + tag + "r" + std::to_string(r) + "h";  // at most 15 characters: a pid has 7 digits
    std::string inner = "sv" + tag + "r" + std::to_string(r) + "n";
    std::string ip = subnet + std::to_string(r + 1);
    namespaces_.push_back(ns);
    rank_netns_.push_back(ns);
    cmds.push_back({"ip", "netns", "add", ns});
    cmds.push_back({"ip", "link", "add", outer, "netns", sw, "type", "veth", "peer", "name", inner, "netns", ns});
    cmds.push_back({"ip", "netns", "exec", ns, "ip", "addr", "add", ip + "/24", "dev", inner});
    cmds.push_back({"ip", "netns", "exec", ns, "ip", "link", "set", inner, "up"});
    cmds.push_back({"ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"});
    cmds.push_back({"ip", "netns", "exec", sw, "ip", "link", "set", outer, "master", "sw"});
    cmds.push_back({"ip", "netns", "exec", sw, "ip", "link", "set", outer, "up"});
    if (r == opts_.fault.rank) {
      slowed_ends_ = {{sw, outer}, {ns, inner}};
      details_["netns"] = ns;
      details_["veth"] = outer + "<->" + inner;
      details_["rank_ip"] = ip;
    }
  }
  for (const auto& c : cmds) {
    if (auto st = run_cmd(c); !st.ok()) return st;
  }
  // Every rank reaches rank 0's store and bootstrap through the veth addresses.
  master_addr_ = subnet + "1";
  return {};
}

Status FaultInjector::prepare_loop() {
  // The culprit's data: its own file behind a loop device, read with O_DIRECT (no page cache),
  // so a read-bandwidth limit on its blkio cgroup stalls every batch it loads.
  std::string shard = run_dir_ + "/shard-r" + std::to_string(opts_.fault.rank) + ".bin";
  {
    std::ofstream out(shard, std::ios::binary);
    std::vector<char> block(1 << 20);
    for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i * 131);
    for (int i = 0; i < 16; ++i) out.write(block.data(), static_cast<std::streamsize>(block.size()));
    if (!out) return Error{"cannot write " + shard};
  }
  std::string dev;
  if (auto st = run_cmd({"losetup", "-f", "--show", shard}, &dev); !st.ok()) {
    return st.error().context("io-stall needs a loop device");
  }
  loop_dev_ = dev.substr(0, dev.find('\n'));
  details_["device"] = loop_dev_;
  return {};
}

Status FaultInjector::prepare() {
  const FaultSpec& f = opts_.fault;
  switch (f.kind) {
    case FaultKind::kCpuContention:
      mechanism_ = "hog processes pinned to the rank's CPU";
      return {};
    case FaultKind::kCpuThrottling:
      mechanism_ = "cgroup cpu quota";
      return prepare_cgroup("cpu");
    case FaultKind::kMemoryReclaim: {
      mechanism_ = "cgroup memory limit + page cache and anonymous pressure";
      // Its own data file (kReclaimShardMb): the page cache it needs is charged to its own cgroup,
      // and under the limit it cannot keep it: most sample reads become disk reads, each page
      // charged to a full cgroup, so the rank reclaims (memcg direct reclaim) all the time.
      std::string shard = run_dir_ + "/shard-r" + std::to_string(f.rank) + ".bin";
      std::ofstream out(shard, std::ios::binary);
      std::vector<char> block(1 << 20, 7);
      for (int i = 0; i < kReclaimShardMb; ++i) out.write(block.data(), static_cast<std::streamsize>(block.size()));
      out.close();
      if (!out) return Error{"cannot write " + shard};
      // On disk now: written pages are dirty, and the page cache keeps dirty pages at the
      // fadvise(DONTNEED) of activate(), charged to the sim's cgroup, so the rank would never miss.
      if (int fd = ::open(shard.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
        ::fdatasync(fd);
        ::close(fd);
      }
      return prepare_cgroup("memory");
    }
    case FaultKind::kIoStall: {
      mechanism_ = std::string("blkio read throttle on a loop device read with O_DIRECT") +
                   (f.in_worker ? ", by each rank's data-loader worker process" : "");
      if (auto st = prepare_loop(); !st.ok()) return st;
      return prepare_cgroup("blkio");
    }
    case FaultKind::kNetworkSlow: {
      if (f.all_ranks) {
        // A slow fabric: every rank's sends are paced in the NCCL stand-in.
        mechanism_ = "user-space pacer in the NCCL stand-in, on every rank";
        return {};
      }
      mechanism_ = "network namespaces (each rank behind a veth, a bridge between) + tc tbf on the culprit's link";
      Status st = prepare_netns();
      if (st.ok()) return st;
      // No namespaces here (container without CAP_NET_ADMIN...): pace the rank's NCCL sends instead.
      std::fprintf(stderr, "strata-sim: network namespaces unavailable (%s); using the user-space pacer\n",
                   st.error().message.c_str());
      teardown();
      mechanism_ = "user-space pacer in the NCCL stand-in";
      return {};
    }
    case FaultKind::kGpuSlow:
      mechanism_ = std::string("stand-in GPU slowdown + NVML throttle reasons") + (f.all_ranks ? ", on every rank's GPU" : "");
      return {};
    case FaultKind::kKernelRegression: mechanism_ = "stand-in GPUs: one kernel slower on every rank's device"; return {};
    case FaultKind::kHang: mechanism_ = "stand-in GPU stops executing"; return {};
    case FaultKind::kGpuEcc: mechanism_ = "NVML stand-in: ECC error counters climb"; return {};
    case FaultKind::kGpuXid:
      mechanism_ = stops_device(f) ? "NVML stand-in: GPU lost (Xid 79), stand-in GPU stops executing"
                                   : "NVML stand-in: Xid " + std::to_string(static_cast<int>(f.param("code"))) + " counters climb";
      return {};
    case FaultKind::kPcieDegraded: mechanism_ = "NVML stand-in: PCIe x4 of x16, replays climb; stand-in GPU slowdown"; return {};
    case FaultKind::kNvlinkErrors: mechanism_ = "NVML stand-in: NVLink errors climb; stand-in GPU slowdown"; return {};
    case FaultKind::kHostHotspot: mechanism_ = "extra CPU work in slow_augment()"; return {};
    case FaultKind::kSlowCpu: mechanism_ = "the rank's CPU work runs longer (a slower core, in process)"; return {};
    case FaultKind::kPageFaults: {
      mechanism_ = "the rank's memory-mapped data, read every step, paged out from outside (process_madvise MADV_PAGEOUT) from start_step";
      // Every rank reads its own mapped file, the same work (on disk, clean pages: reclaim can drop
      // them), one page per page read a step; only the culprit's are paged out (activate).
      std::vector<char> page(4096);
      const int pages = std::max(1, static_cast<int>(f.param("pages")));
      for (int r = 0; r < opts_.ranks; ++r) {
        std::string mapped = run_dir_ + "/mapped-r" + std::to_string(r) + ".bin";
        std::ofstream out(mapped, std::ios::binary);
        for (int i = 0; i < pages; ++i) {
          for (size_t j = 0; j < page.size(); j += 64) page[j] = static_cast<char>(i + j);
          out.write(page.data(), static_cast<std::streamsize>(page.size()));
        }
        out.close();
        if (!out) return Error{"cannot write " + mapped};
        if (int fd = ::open(mapped.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
          ::fdatasync(fd);
          ::close(fd);
        }
        if (r == f.rank) details_["mapped"] = mapped;
      }
      return {};
    }
    case FaultKind::kWorkloadImbalance: mechanism_ = "larger batches on the rank"; return {};
    case FaultKind::kAllocChurn: mechanism_ = "cudaMalloc/cudaFree of every layer's temporaries (libcudart stand-in)"; return {};
    case FaultKind::kSyncCopy: mechanism_ = "synchronous cudaMemcpy reads after every layer (libcudart stand-in)"; return {};
    case FaultKind::kLaunchBound: mechanism_ = "the optimizer stepped tensor by tensor: tiny kernels launched one by one"; return {};
    case FaultKind::kIrqSoftirq:
      mechanism_ = "UDP packets received in a private network namespace, steered by RPS to the rank's CPU, each walking "
                   "tc u32 filters on ingress (NET_RX softirq work on that CPU)";
      return prepare_irq();
    case FaultKind::kNone: return {};
  }
  return {};
}

// irq-softirq: a network namespace of our own (its loopback is the "NIC"), RPS sending every packet
// it receives to the rank's CPU, and an ingress filter chain that makes each packet cost what a busy
// NIC queue's receive work does. The sender runs on another CPU (activate), so what lands on the
// rank's CPU is the receive work alone, in softirq, as when a NIC queue's interrupts and RPS are
// aimed at the cores the training process runs on.
Status FaultInjector::prepare_irq() {
  if (ncpu_ < 2) return Error{"irq-softirq needs 2 CPUs (the sender runs beside the rank's CPU)"};
  const int cpu = opts_.fault.rank % ncpu_;  // rank_setup pins rank r to CPU r % CPUs
  std::string ns = sim_tag() + "-irq";
  namespaces_.push_back(ns);
  if (auto st = run_cmd({"ip", "netns", "add", ns}); !st.ok()) return st.error().context("irq-softirq needs network namespaces (root)");
  if (auto st = run_cmd({"ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"}); !st.ok()) return st;
  // A CPU mask in hex words of 32 bits, comma-separated from the highest (the sysfs format).
  std::string mask;
  for (int w = (ncpu_ - 1) / 32; w >= 0; --w) {
    char word[16];
    std::snprintf(word, sizeof word, "%08x", cpu / 32 == w ? 1u << (cpu % 32) : 0u);
    mask += (mask.empty() ? "" : ",") + std::string(word);
  }
  // `ip netns exec` mounts the namespace's own sysfs: this is its loopback's queue.
  if (auto st = run_cmd({"ip", "netns", "exec", ns, "sh", "-c", "echo " + mask + " > /sys/class/net/lo/queues/rx-0/rps_cpus"});
      !st.ok()) {
    return st.error().context("irq-softirq needs RPS (CONFIG_RPS)");
  }
  if (auto st = run_cmd({"ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "lo", "ingress"}); !st.ok()) return st;
  // Filters no packet matches (destination ports the sender never uses): each packet walks them all.
  const std::string batch = run_dir_ + "/irq-filters.tc";
  {
    std::ofstream out(batch);
    const int filters = static_cast<int>(opts_.fault.param("filters"));
    for (int i = 0; i < filters; ++i)
      out << "filter add dev lo parent ffff: protocol ip prio 1 u32 match ip dport " << (kIrqFirstPort + i % 50000)
          << " 0xffff classid 1:1\n";
    out.close();
    if (!out) return Error{"cannot write " + batch};
  }
  if (auto st = run_cmd({"ip", "netns", "exec", ns, "tc", "-batch", batch}); !st.ok()) return st.error().context("irq-softirq filters");
  irq_netns_ = ns;
  details_["netns"] = ns;
  details_["cpu"] = std::to_string(cpu);
  details_["rps_cpus"] = mask;
  return {};
}

// The sender: UDP to a port no filter matches and nothing listens on, paced to `rate` packets a
// second in batches of sendmmsg, from a CPU that is not the rank's.
void FaultInjector::send_packets(int ns_fd, int cpu, double rate) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::sched_setaffinity(0, sizeof(set), &set);
  // Only this thread enters the namespace (a thread's network namespace is its own).
  if (::setns(ns_fd, CLONE_NEWNET) != 0) {
    std::fprintf(stderr, "strata-sim: irq-softirq: setns: %s\n", std::strerror(errno));
    ::close(ns_fd);
    return;
  }
  ::close(ns_fd);
  int sock = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (sock < 0) {
    std::fprintf(stderr, "strata-sim: irq-softirq: socket: %s\n", std::strerror(errno));
    return;
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(kIrqTargetPort);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  constexpr int kBatch = 32;
  char payload[16] = {};
  iovec iov{payload, sizeof payload};
  mmsghdr msgs[kBatch] = {};
  for (auto& m : msgs) {
    m.msg_hdr.msg_name = &to;
    m.msg_hdr.msg_namelen = sizeof to;
    m.msg_hdr.msg_iov = &iov;
    m.msg_hdr.msg_iovlen = 1;
  }
  const auto start = std::chrono::steady_clock::now();
  uint64_t paced = 0, sent = 0;
  while (!stop_sending_.load(std::memory_order_relaxed)) {
    int n = ::sendmmsg(sock, msgs, kBatch, 0);
    if (n > 0) sent += static_cast<uint64_t>(n);
    paced += n > 0 ? static_cast<uint64_t>(n) : kBatch;  // a refused batch still counts against the pace
    auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(paced / rate));
    std::this_thread::sleep_until(due);
  }
  packets_sent_.store(sent);  // what the kernel took (the truth's packets_sent)
  ::close(sock);
}

std::vector<int> FaultInjector::acted_on(int ranks) const {
  const FaultSpec& f = opts_.fault;
  std::vector<int> out;
  if (f.all_ranks || f.kind == FaultKind::kNone) return out;
  for (int r = 0; r < ranks; ++r) {
    if (r == f.rank || (shares_cpu(f.kind) && r % ncpu_ == f.rank % ncpu_)) out.push_back(r);
  }
  return out;
}

RankSetup FaultInjector::rank_setup(int rank) const {
  RankSetup s;
  const FaultSpec& f = opts_.fault;
  // slow-cpu: a slower core slows every rank pinned to it (acted_on), not only the one named.
  bool culprit = rank == f.rank || f.all_ranks || (f.kind == FaultKind::kSlowCpu && rank % ncpu_ == f.rank % ncpu_);
  // Ranks are bound to CPUs like a launcher would (cpu-contention re-pins them when it starts).
  s.cpus.push_back(rank % ncpu_);
  // memory-reclaim: every rank reads more samples per step than one batch (the same work on all
  // ranks; from the page cache it costs little): refaults are what a squeezed cache costs.
  if (f.kind == FaultKind::kMemoryReclaim) s.env["STRATA_SIM_SAMPLES"] = std::to_string(kReclaimSamples);
  // io-stall where=worker: every rank loads its batches through a data-loader worker process.
  if (f.in_worker) s.env["STRATA_SIM_LOAD_WORKER"] = "1";
  if (static_cast<size_t>(rank) < rank_netns_.size()) s.netns = rank_netns_[static_cast<size_t>(rank)];
  // page-faults: every rank reads memory-mapped data of its own each step (only the culprit's is
  // paged out), so reading it is the usual work of every rank.
  if (f.kind == FaultKind::kPageFaults) {
    s.env["STRATA_SIM_MAPPED"] = run_dir_ + "/mapped-r" + std::to_string(rank) + ".bin";
    s.env["STRATA_SIM_MAPPED_PAGES"] = std::to_string(static_cast<int>(f.param("pages")));
  }
  // launch-bound: every rank reads its gradients' inf flag before its optimizer step (a sync), so
  // only the culprit's optimizer differs.
  if (f.kind == FaultKind::kLaunchBound) s.env["STRATA_SIM_INF_CHECK"] = "1";
  if (!culprit) return s;
  for (const auto& [ctrl, dir] : cgroups_) s.cgroup_procs.push_back(dir + "/cgroup.procs");
  if (f.kind == FaultKind::kHostHotspot || f.kind == FaultKind::kWorkloadImbalance || f.kind == FaultKind::kAllocChurn ||
      f.kind == FaultKind::kSyncCopy || f.kind == FaultKind::kSlowCpu || f.kind == FaultKind::kPageFaults ||
      f.kind == FaultKind::kLaunchBound) {
    std::string spec = f.name + ":start_step=" + std::to_string(f.start_step);
    for (const auto& [k, v] : f.params) spec += "," + k + "=" + std::to_string(v);
    s.env["STRATA_SIM_FAULT"] = spec;
  }
  if (f.kind == FaultKind::kMemoryReclaim) {
    s.env["STRATA_SIM_DATA"] = run_dir_ + "/shard-r" + std::to_string(rank) + ".bin";
  }
  if (f.kind == FaultKind::kIoStall) {
    s.env["STRATA_SIM_DATA"] = loop_dev_;
    s.env["STRATA_SIM_DATA_DIRECT"] = "1";
  }
  return s;
}

Status FaultInjector::activate(pid_t culprit_pid) {
  if (active_) return {};
  active_ = true;
  const FaultSpec& f = opts_.fault;
  strata_gpu_device_state* dev = gpus_ ? &gpus_->dev[f.rank % STRATA_GPU_STATE_MAX_DEVICES] : nullptr;
  // The devices the fault is on: the culprit's, or every rank's.
  std::vector<strata_gpu_device_state*> devs;
  for (int r = 0; gpus_ && r < opts_.ranks; ++r) {
    if (f.all_ranks || r == f.rank) devs.push_back(&gpus_->dev[r % STRATA_GPU_STATE_MAX_DEVICES]);
  }
  switch (f.kind) {
    case FaultKind::kCpuContention: {
      // The culprit (every thread: its NCCL and stream workers too) is bound to the hogs' CPU, and
      // its peers to the other CPUs: otherwise the scheduler parks a peer on the hogs' CPU now and
      // then and the peer becomes a victim too (2 CPUs here). The hogs run at a higher priority
      // than the rank, so the rank gets a small, steady share of its CPU (with 2 hogs at nice -10:
      // about 1/20) and its fixed CPU work per step takes many times longer than its peers'.
      int cpu = ncpu_ >= 2 ? ncpu_ - 1 : 0;
      std::vector<int> others;
      for (int c = 0; c < ncpu_; ++c) {
        if (c != cpu) others.push_back(c);
      }
      if (others.empty()) others.push_back(cpu);
      for (size_t r = 0; r < rank_pids_.size(); ++r) {
        pin_process(rank_pids_[r], static_cast<int>(r) == f.rank ? std::vector<int>{cpu} : others);
      }
      for (int i = 0; i < static_cast<int>(f.param("hogs")); ++i) hogs_.push_back(spawn_hog(cpu, static_cast<int>(-f.param("priority"))));
      details_["cpu"] = std::to_string(cpu);
      std::string pids;
      for (pid_t h : hogs_) pids += (pids.empty() ? "" : ",") + std::to_string(h);
      details_["hog_pids"] = pids;
      return {};
    }
    case FaultKind::kCpuThrottling: {
      long period = 100000;
      long quota = std::max(1000L, static_cast<long>(f.param("quota_pct") * period / 100));
      if (cgroup_v2_) {
        return write_file(cgroup_file("cpu", "cpu.max"), std::to_string(quota) + " " + std::to_string(period));
      }
      if (auto st = write_file(cgroup_file("cpu", "cpu.cfs_period_us"), std::to_string(period)); !st.ok()) return st;
      return write_file(cgroup_file("cpu", "cpu.cfs_quota_us"), std::to_string(quota));
    }
    case FaultKind::kMemoryReclaim: {
      // Limit = what the rank needs that cannot be reclaimed (no swap: its anonymous memory,
      // kernel memory, the per-step scratch buffer) + a little page cache (headroom): the rank
      // keeps running, but its data no longer fits in its cache.
      std::string usage_file = cgroup_file("memory", cgroup_v2_ ? "memory.current" : "memory.usage_in_bytes");
      long long usage = std::atoll(read_file(usage_file).c_str());
      long long cache = 0;
      {
        std::istringstream stat(read_file(cgroup_file("memory", "memory.stat")));
        std::string key;
        long long value = 0;
        while (stat >> key >> value) {
          if (key == (cgroup_v2_ ? "file" : "cache")) cache = value;
        }
      }
      long long scratch = 8ll << 20;  // STRATA_SIM_SCRATCH_MB of the rank programs
      long long limit = usage - cache + scratch + static_cast<long long>(f.param("headroom_mb") * 1024 * 1024);
      details_["limit_bytes"] = std::to_string(limit);
      // Drop the culprit's data from the page cache: it must read it again, charged to its cgroup.
      std::string shard = run_dir_ + "/shard-r" + std::to_string(f.rank) + ".bin";
      if (int fd = ::open(shard.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
      }
      return write_file(cgroup_file("memory", cgroup_v2_ ? "memory.max" : "memory.limit_in_bytes"),
                        std::to_string(limit));
    }
    case FaultKind::kIoStall: {
      struct stat st {};
      if (::stat(loop_dev_.c_str(), &st) != 0) return Error::from_errno("stat " + loop_dev_, errno);
      auto bps = static_cast<long long>(f.param("rate_mbps") * 1024 * 1024);
      std::string dev_id = std::to_string(major(st.st_rdev)) + ":" + std::to_string(minor(st.st_rdev));
      if (cgroup_v2_) return write_file(cgroup_file("blkio", "io.max"), dev_id + " rbps=" + std::to_string(bps));
      return write_file(cgroup_file("blkio", "blkio.throttle.read_bps_device"), dev_id + " " + std::to_string(bps));
    }
    case FaultKind::kNetworkSlow: {
      auto rate = static_cast<long long>(f.param("rate_mbit"));
      if (slowed_ends_.empty()) {
        for (auto* d : devs) std::atomic_ref<uint64_t>(d->net_rate_bps).store(static_cast<uint64_t>(rate) * 1000000 / 8);
        return {};
      }
      // Both ends of the culprit's link: what it sends and what it receives.
      std::string r = std::to_string(rate) + "mbit";
      for (const auto& [ns, dev] : slowed_ends_) {
        if (auto st = run_cmd({"ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", r, "burst",
                               "32kb", "latency", "400ms"});
            !st.ok()) {
          return st;
        }
      }
      return {};
    }
    case FaultKind::kGpuSlow:
      for (auto* d : devs) {
        std::atomic_ref<uint64_t>(d->throttle_reasons).store(0x8 | 0x40);  // HW slowdown + HW thermal
        std::atomic_ref<float>(d->slowdown).store(static_cast<float>(f.param("factor")));
      }
      return {};
    case FaultKind::kKernelRegression:
      for (auto* d : devs) {
        std::memset(d->slow_kernel, 0, sizeof d->slow_kernel);
        std::memcpy(d->slow_kernel, f.kernel.data(), std::min(f.kernel.size(), sizeof d->slow_kernel - 1));
        std::atomic_ref<float>(d->kernel_slowdown).store(static_cast<float>(f.param("factor")), std::memory_order_release);
      }
      details_["kernel"] = f.kernel;
      return {};
    case FaultKind::kHang:
      if (dev) std::atomic_ref<uint32_t>(dev->hang).store(1);
      return {};
    case FaultKind::kGpuEcc:
    case FaultKind::kGpuXid:
    case FaultKind::kPcieDegraded:
    case FaultKind::kNvlinkErrors: {
      if (!dev) return {};
      int code = f.kind == FaultKind::kGpuXid ? static_cast<int>(f.param("code")) : 0;
      uint32_t bits = f.kind == FaultKind::kGpuEcc || code == 48  ? STRATA_HW_ECC
                      : f.kind == FaultKind::kPcieDegraded        ? STRATA_HW_PCIE
                      : f.kind == FaultKind::kNvlinkErrors || code == 74 ? STRATA_HW_NVLINK
                                                                  : STRATA_HW_LOST;
      std::atomic_ref<uint64_t>(dev->hw_since_ns).store(monotonic_ns(), std::memory_order_relaxed);
      std::atomic_ref<uint32_t>(dev->xid).store(static_cast<uint32_t>(code), std::memory_order_relaxed);
      // The device as the real fault leaves it: a lost GPU runs nothing more; a degraded link slows
      // every transfer (the stand-in slows the device's work); contained ECC errors do neither.
      if (bits == STRATA_HW_LOST) std::atomic_ref<uint32_t>(dev->hang).store(1);
      if (bits & (STRATA_HW_PCIE | STRATA_HW_NVLINK))
        std::atomic_ref<float>(dev->slowdown).store(static_cast<float>(f.param("factor")));
      std::atomic_ref<uint32_t>(dev->hw_faults).store(bits, std::memory_order_release);
      return {};
    }
    case FaultKind::kHostHotspot:
    case FaultKind::kWorkloadImbalance:
    case FaultKind::kSlowCpu:
    case FaultKind::kPageFaults: {
      // Memory pressure from outside the rank, as the node's other work makes it (kswapd
      // reclaiming its clean file pages): its mapped data is paged out (process_madvise
      // MADV_PAGEOUT on the rank's mapping) every kEvictEveryMs, so the pages it reads each step
      // are out of memory again, each read a major fault from disk.
      const std::string mapped = details_["mapped"];
      auto range = mapping_of(culprit_pid, mapped);
      if (!range) return Error{"page-faults: no mapping of " + mapped + " in rank " + std::to_string(f.rank)};
      int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, culprit_pid, 0));
      if (pidfd < 0) return Error{std::string("page-faults: pidfd_open: ") + std::strerror(errno)};
      if (auto st = page_out(pidfd, *range); !st.ok()) {
        ::close(pidfd);
        return st;
      }
      evictor_ = std::thread([this, pidfd, r = *range] {
        constexpr int kEvictEveryMs = 10;  // a few times a step: each step finds its pages out
        while (!stop_evicting_.load()) {
          (void)page_out(pidfd, r);
          std::this_thread::sleep_for(std::chrono::milliseconds(kEvictEveryMs));
        }
        ::close(pidfd);
      });
      return {};
    }
    case FaultKind::kIrqSoftirq: {
      const std::string path = "/run/netns/" + irq_netns_;
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return Error::from_errno("irq-softirq: opening " + path, errno);
      const int rank_cpu = f.rank % ncpu_;
      const int cpu = rank_cpu == 0 ? 1 : 0;
      details_["sender_cpu"] = std::to_string(cpu);
      sender_ = std::thread([this, fd, cpu, rate = f.param("rate")] { send_packets(fd, cpu, rate); });
      return {};
    }
    case FaultKind::kAllocChurn:
    case FaultKind::kSyncCopy:
    case FaultKind::kLaunchBound:
    case FaultKind::kNone:
      return {};  // in-process, from the rank's own start_step
  }
  (void)culprit_pid;
  return {};
}

void FaultInjector::teardown() {
  stop_evicting_.store(true);
  if (evictor_.joinable()) evictor_.join();
  stop_sending_.store(true);
  if (sender_.joinable()) {
    sender_.join();
    details_["packets_sent"] = std::to_string(packets_sent_.load());
  }
  for (pid_t pid : hogs_) ::kill(pid, SIGKILL);
  for (pid_t pid : hogs_) ::waitpid(pid, nullptr, 0);
  hogs_.clear();
  for (int r = 0; gpus_ != nullptr && opts_.fault.rank >= 0 && r < opts_.ranks; ++r) {
    if (!opts_.fault.all_ranks && r != opts_.fault.rank) continue;
    auto& dev = gpus_->dev[r % STRATA_GPU_STATE_MAX_DEVICES];
    std::atomic_ref<uint32_t>(dev.hang).store(0);
    std::atomic_ref<float>(dev.slowdown).store(1.0f);
    std::atomic_ref<uint64_t>(dev.throttle_reasons).store(0);
    std::atomic_ref<uint64_t>(dev.net_rate_bps).store(0);
    std::atomic_ref<float>(dev.kernel_slowdown).store(1.0f);
    std::atomic_ref<uint32_t>(dev.hw_faults).store(0);
    std::atomic_ref<uint32_t>(dev.xid).store(0);
  }
  // A namespace's devices go with it (a veth pair goes when either end does, with its qdiscs).
  for (const auto& ns : namespaces_) (void)run_cmd({"ip", "netns", "del", ns});
  namespaces_.clear();
  rank_netns_.clear();
  slowed_ends_.clear();
  for (auto& [ctrl, dir] : cgroups_) {
    // The ranks are gone by now; a cgroup goes once its last (reaped) task has left.
    for (int i = 0; i < 40 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i) ::usleep(50000);
  }
  cgroups_.clear();
  if (!loop_dev_.empty()) {
    (void)run_cmd({"losetup", "-d", loop_dev_});
    loop_dev_.clear();
  }
}

}  // namespace testbed::sim
