// The diagnosis engine's input: one window of one job, summarized per rank (DESIGN §6). A loader
// fills it from a store; tests and the scale benchmark build it directly, so the engine never needs
// a recording, root or timing luck.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace strata::diagnose {

inline constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
inline bool known(double v) { return !std::isnan(v); }

// Interned names (kernels, call paths, neighbour processes): ranks refer to them by id, so 100k
// ranks that share a few hundred names cost a few bytes each.
using NameId = uint32_t;
class Names {
 public:
  NameId id(std::string_view name) {
    auto it = ids_.find(std::string(name));
    if (it != ids_.end()) return it->second;
    NameId id = static_cast<NameId>(names_.size());
    names_.emplace_back(name);
    ids_.emplace(names_.back(), id);
    return id;
  }
  const std::string& name(NameId id) const { return names_.at(id); }
  size_t size() const { return names_.size(); }

 private:
  std::unordered_map<std::string, NameId> ids_;
  std::vector<std::string> names_;
};

// The agent's process name: never a neighbour, never a culprit (RankWindow::agent_ms holds its cost).
inline constexpr std::string_view kAgentProcess = "strata";
inline bool is_agent(std::string_view process) { return process == kAgentProcess; }
// The kernel's interrupt work that runs as threads: softirq work deferred to the per-CPU
// ksoftirqd/N when it runs long (a NIC queue's receive work past a few ms), and threaded IRQ
// handlers (irq/N-name). On a rank's CPUs it is interrupt load, not a process anyone can move to
// another CPU: irq-softirq's, never cpu-contention's.
inline bool is_interrupt_thread(std::string_view process) {
  return process.starts_with("ksoftirqd/") || process.starts_with("irq/");
}
// The root frame of a call path sampled in one of a rank's worker processes (a DataLoader worker):
// its time counts for the rank, and the evidence says where it ran.
inline constexpr std::string_view kWorkerFrame = "[worker]";
// An off-CPU path's entry for a page fault, as "pread64()" is a system call's: the thread touched
// memory that was not there (the user frame before it touched it).
inline constexpr const char* kPageFaultCall = "page fault()";

struct Value {
  NameId name = 0;
  double ms_per_step = 0;
};
// Sorted by name, one entry per name (see normalize()).
using Values = std::vector<Value>;
double value_of(const Values& v, NameId name);  // 0 when absent
void normalize(Values& v);                      // sorts and merges duplicate names

// Step statistics of one rank over a period (the analysis window, or the baseline before it).
// Times in ms; "wait" is time spent waiting in collectives: device time of collective kernels when
// a GPU timing source saw them, else the host's time inside collective calls.
struct PhaseStats {
  uint32_t steps = 0;
  double step_ms = kUnknown;       // median step time
  double step_mad_ms = kUnknown;   // median absolute deviation of step time
  double wait_ms = kUnknown;       // mean per step
  double device_compute_ms = kUnknown;
  double gpu_idle_ms = kUnknown;

  double busy_ms() const { return step_ms - wait_ms; }  // compute + everything not waiting for peers
};

// OS and API measurements of one rank in the analysis window, per step (ms unless noted), so ranks
// with different step counts compare. kUnknown where the layer was not recorded.
enum class Os : int {
  kCpu = 0,       // on-CPU time of the process
  kRunqWait,      // runnable, waiting for a CPU
  kThrottled,     // cgroup CPU throttling
  kReclaim,       // direct reclaim + compaction stalls
  kBlockedIo,     // blocked in I/O / uninterruptible sleep
  kIrq,           // hard IRQ + softirq time on the rank's CPUs
  kMajorFaults,   // count per step
  kBioLatency,    // mean block I/O latency, ms (not per step)
  kLaunchApi,     // host time in kernel-launch calls
  // Device-memory calls (agent/gpu_comm_source.cpp's api.* metrics, every call while they fit the
  // agent's budget, then sampled in bursts and scaled by the share of the window probed):
  kAllocApi,      // host time in allocation and release calls (cudaMalloc/cudaFree, cuMemAlloc/cuMemFree)
  kAllocCalls,    // those calls, count per step
  kSyncCopyApi,   // host time in synchronous copies (cudaMemcpy: the host waits for the copy)
  kSyncCopyCalls, // those copies, count per step
  kSyncCopyMb,    // bytes they moved, MB per step
  kKernels,       // kernels the device ran, count per step (the device timeline's; copies and sets not counted)
  kCount,
};
inline constexpr size_t kOsCount = static_cast<size_t>(Os::kCount);
const char* os_name(Os m);
// Whether a measurement is time per step (ms), which ranks compare as time; counts and sizes are not.
bool os_is_time(Os m);

// The GPU a rank drives, as NVML saw it in the window.
struct GpuState {
  int index = -1;
  bool known = false;
  double sm_clock_ratio = kUnknown;  // current / max SM clock
  std::string throttle_reasons;      // "hw_slowdown,hw_thermal"; empty when none
  // Hardware health in the window (agent/gpu/nvml_source.h's series; kUnknown: not recorded).
  // Counters are what was new in the window, summed over its metric windows.
  double ecc_uncorrected = kUnknown;  // gpu.ecc_uncorrected
  double ecc_corrected = kUnknown;    // gpu.ecc_corrected (evidence only: ECC corrects these)
  double retired_pages = kUnknown;    // gpu.retired_pages: pages retired / rows remapped (not collected yet)
  double pcie_replays = kUnknown;     // gpu.pcie_replays
  double pcie_gen = kUnknown;         // gpu.pcie_link_gen, highest in the window
  double pcie_width = kUnknown;       // gpu.pcie_link_width, highest in the window
  double pcie_max_width = kUnknown;   // gpu.pcie_link_max_width
  double nvlink_errors = kUnknown;    // gpu.nvlink_errors
  bool lost = false;                  // gpu.lost: NVML says GPU_IS_LOST (fell off the bus, Xid 79)
  std::vector<unsigned> xids;         // gpu.xid: the Xids the driver reported in the window, sorted, once each
  bool has_xid(unsigned code) const {
    for (unsigned x : xids) {
      if (x == code) return true;
    }
    return false;
  }
};

// A rank's collective calls on one communicator in the span read, as a collective flight recorder
// keeps them (PyTorch's Flight Recorder: op, sequence number, state): how far the rank got. Members
// of one communicator number their calls alike, so in a hang the ranks that never entered the call
// the others wait in stand out by their sequence number.
struct CommProgress {
  std::string comm;             // communicator id, the same on every member (empty: not known)
  uint64_t calls = 0;           // calls entered in the span
  uint64_t last_seq = 0;        // sequence number of the latest call entered (0: not numbered)
  std::string last_op;          // its op (allreduce, ...)
  uint64_t last_bytes = 0;
  bool last_completed = false;  // its completion was seen (on the device; the host's return for gloo)
  uint64_t completed = 0;       // calls whose completion was seen (0: completion not observable here)
  uint64_t last_enter_ns = 0;
  // The latest call was seen entered and not returned at the end of the rank's latest recording
  // window (the agent's calls in flight, InFlight below): the rank is inside it, whether or not its
  // completion is observable otherwise (a gloo call is recorded only when it returns).
  bool in_flight = false;
};

// A call a rank was inside at the end of its latest recording window (store::InFlightCall): a
// collective (gloo blocks in it until the collective is done) or a CUDA synchronize (a host
// waiting for its stream, where an NCCL collective's device work runs).
struct InFlight {
  std::string library;  // nccl | gloo | cuda
  std::string op;       // allreduce, ...; the API's name for a synchronize
  std::string comm;     // empty: not known
  uint64_t seq = 0;     // 0: not numbered
  uint64_t entered_ns = 0;  // unix ns
  uint64_t seen_ns = 0;     // still inside then (the end of that window)
};

// One TCP connection of a rank in the analysis window, seen from the rank's side. "local" and
// "remote" ("addr:port") pair it with the same connection seen from the peer's side.
struct TcpLink {
  std::string local, remote;
  double srtt_ms = kUnknown;  // smoothed RTT, known on the side that sent data
  double sent_bytes = 0, received_bytes = 0;
  // The sender's time with data on its way, not held back by the receiver's window (ms, summed
  // like the bytes; 0: not recorded): sent_bytes over it is the rate its path moved data.
  double busy_ms = 0;
};

// The job's own healthy past of one rank, per layer (JobBaseline::apply fills it, diagnose/
// baseline.h): what each layer measured per step over recent healthy windows, so a layer that grew
// on every rank is seen against the job's history when no peer can serve as the reference.
// windows == 0: no past. Names are interned in the JobWindow the past was applied to.
struct RankPast {
  uint32_t windows = 0;  // healthy windows summarized
  double step_ms = kUnknown;
  double wait_ms = kUnknown;  // collective time per step
  double device_compute_ms = kUnknown;
  std::array<double, kOsCount> os;
  Values kernels;     // GPU kernel time per step, by kernel name
  Values oncpu;       // by call path, as RankWindow::oncpu
  Values offcpu;
  Values neighbours;

  RankPast() { os.fill(kUnknown); }
  double get(Os m) const { return os[static_cast<size_t>(m)]; }
};

// One step of a rank as the loader's step rows give it (ms; kUnknown where the layer was not
// timed), for the second opinion over time. float: 100k ranks keep their latest steps cheaply, and
// a step's time needs no more than 7 digits.
struct StepPoint {
  float step_ms = 0;
  float wait_ms = 0;                 // collective wait, as PhaseStats::wait_ms counts it
  float device_compute_ms = kUnknown;
  float gpu_idle_ms = kUnknown;
  bool in_window = false;            // false: a step of the baseline before the window
};
// The latest steps kept per rank and per phase (baseline, window): enough for a per-rank mixture to
// see a change (tens of points per phase), bounded so 100k ranks cost ~1 KiB each.
inline constexpr size_t kMaxSeriesStepsPerPhase = 32;

struct RankWindow {
  int rank = -1;
  uint32_t pid = 0;
  std::string node;
  PhaseStats now;   // the window being diagnosed
  PhaseStats base;  // the job's own history before it (steps == 0: none)
  // The latest steps of the baseline then of the window, in order, at most kMaxSeriesStepsPerPhase
  // of each (empty: not kept, e.g. a job made up from summaries).
  std::vector<StepPoint> series;
  RankPast past;    // the same history per layer (windows == 0: none)
  std::array<double, kOsCount> os;
  GpuState gpu;
  Values neighbours;  // other processes on this rank's CPUs: run time per step, by process name
  Values kernels;     // GPU kernel time per step, by kernel name
  Values oncpu;       // on-CPU time per step by call path (root first, ';'-separated)
  Values offcpu;      // blocked time per step by call path
  // On-CPU time per step inside a system call, by "syscall()|caller": the function that made the
  // call, from on-CPU stacks (unwound with CFI through libc). A thread blocked in I/O often has
  // no usable user stack off-CPU; the same call seen on-CPU says where the rank blocks.
  Values syscall_callers;
  // IRQ and softirq time on the rank's CPUs per step, by source: "NET_RX softirq", "IRQ 24:virtio0-input"
  // (the agent's os.softirq_time_us and os.irq_time_us labels). Empty: not recorded.
  Values irq_sources;
  // Device-memory calls by API name ("cudaFree", "cudaMemcpy", ...): host time (ms), calls and MB
  // per step, for the evidence of which call grew (the Os sums above compare ranks).
  Values memory_api_ms;
  Values memory_api_calls;
  Values memory_api_mb;
  // Where the program makes those calls: the calls whose probe took a stack (the agent's sampled
  // launch rows), counted by "API|call site" ("cudaMemcpy|a lambda in main"), the call site being
  // the innermost resolved frame outside the CUDA runtime (loader.cpp's memory_call_site_of). A
  // count of sampled calls in the window, not per step: only their shares say anything.
  Values memory_call_sites;
  std::vector<TcpLink> links;  // TCP connections that moved data (empty: not recorded)
  // Where the rank's own process ran in the window (os.cpu_time_by_cpu_us): each CPU that held a
  // large share of its run time ("3"; "other" for the rest) with that share of it (0-1), largest
  // first. Empty: not recorded.
  std::vector<std::pair<std::string, double>> cpu_placement;
  std::string process;  // the rank's process name (comm)
  // The agent's own run time on the rank's CPUs per step (kUnknown: not seen): its budgeted cost,
  // reported apart and never a neighbour or a culprit.
  double agent_ms = kUnknown;
  // The rank's child processes that inherited its RANK (DataLoader workers): their CPU, off-CPU,
  // I/O and OS metrics are counted in the rank's, their call paths rooted at kWorkerFrame.
  std::vector<uint32_t> workers;
  bool alive = true;              // the process was still seen at the end of the window
  uint64_t last_seen_ns = 0;      // start of the latest recording window the process was seen in (0: never)
  // End of that window: how far the store holds the rank's data (0: unknown). Agents ship a window
  // when it closes, each node at its own phase: a rank's latest time can lag its peers' by a window.
  uint64_t observed_until_ns = 0;
  uint64_t last_progress_ns = 0;  // last collective completion or step end (unix ns)
  uint64_t last_device_ns = 0;    // end of the last device work seen; 0: unknown
  std::vector<CommProgress> comms;  // per communicator the rank called (empty: no collectives recorded)
  std::vector<InFlight> in_flight;  // calls it was inside at its latest window's end (empty: none seen)
  // Where the rank's threads were after the job's last progress, when the job made none for a
  // while (the loader reads them only then): ms by call path over that stall, not per step. Off-CPU
  // holds every wait here (futex, sleep, poll), unlike `offcpu`: in a hang, what a rank waits on
  // is the evidence.
  Values stall_oncpu;
  Values stall_offcpu;

  RankWindow() { os.fill(kUnknown); }
  double get(Os m) const { return os[static_cast<size_t>(m)]; }
  void set(Os m, double v) { os[static_cast<size_t>(m)] = v; }
};

struct JobWindow {
  std::string job;
  uint64_t start_ns = 0, end_ns = 0;  // the analysis window
  uint64_t observed_until_ns = 0;     // the latest time anything was recorded
  std::string communicator;           // the main communicator's id, for evidence
  Names names;
  std::vector<RankWindow> ranks;      // ordered by rank; ring neighbours are adjacent
  // Per rank (as `ranks`): ranks with the same value do the same work (diagnose/peer_groups.h:
  // the same pipeline stage). Empty: roles unknown, every rank is a peer of every other.
  std::vector<int> peer_group;
  // Names in call paths that are Python functions: a path's deepest one is where the program's
  // time goes (the frames below it are the interpreter's).
  std::unordered_set<std::string> python_functions;
  // Of them, those defined in installed code (the interpreter's own library, site- and
  // dist-packages: loader.cpp's python_library_file), not in the program being trained: a library
  // frame that passes its time on to the program's function is not where the program's time goes.
  std::unordered_set<std::string> python_library_functions;
  // Names in call paths that are frames of the CUDA runtime or driver (libcudart, libcuda: known by
  // the frame's module, loader.cpp's cuda_runtime_module): time under one is inside a CUDA call,
  // whatever the library's own function is called there (a stripped libcudart's frames are
  // "libcudart.so.13+0x...", the testbed's stand-in tail-calls its own helpers).
  std::unordered_set<std::string> cuda_runtime_frames;
  // The loader's bookkeeping for it (empty once loaded): names seen in native frames of other modules.
  std::unordered_set<std::string> frames_outside_runtime;
  // What the loader changed in the data before the rules saw it (a rank's steps re-cut like its
  // peers'): said with the diagnosis, so a reader knows the per-step figures are not the agent's.
  std::vector<std::string> data_notes;
};

}  // namespace strata::diagnose
