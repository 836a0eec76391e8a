#include "agent/gpu_comm_source.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>

#include "abi/gpu_comm.h"
#include "agent/bpf_stats.h"
#include "agent/capture.h"
#include "agent/comm/step_detector.h"
#include "agent/flight_recorder.h"
#include "agent/gpu/timeline_reader.h"
#include "agent/libbpf_log.h"
#include "agent/normalizer.h"
#include "agent/proc_maps.h"
#include "agent/process_info.h"
#include "agent/runtimes/library_closure.h"
#include "agent/runtimes/runtimes.h"
#include "bpf/gpu_comm.skel.h"
#include "common/forgetful_set.h"
#include "symbolize/symbolizer.h"

namespace strata::agent {
namespace {

// ncclDataType_t sizes (nccl.h: ncclInt8=0 ... ncclFloat8e5m2=11).
uint64_t nccl_dtype_size(int dtype) {
  switch (dtype) {
    case 0: case 1: case 10: case 11: return 1;           // int8, uint8, fp8 e4m3, fp8 e5m2
    case 2: case 3: case 7: return 4;                      // int32, uint32, float32
    case 4: case 5: case 8: return 8;                      // int64, uint64, float64
    case 6: case 9: return 2;                              // float16, bfloat16
    default: return 0;
  }
}

std::string hex_bytes(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(digits[p[i] >> 4]);
    s.push_back(digits[p[i] & 15]);
  }
  return s;
}

// A 64-bit FNV-1a of the ncclUniqueId: the same on every rank of the communicator.
std::string comm_id_of(const uint8_t* id, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ id[i]) * 1099511628211ull;
  uint8_t b[8];
  std::memcpy(b, &h, 8);
  return hex_bytes(b, 8);
}

struct CommState {
  std::string id;
  int rank = -1;     // -1: not known (ncclCommSplit does not say; the diagnosis places it)
  int nranks = 0;
  uint64_t seq = 0;
  uint64_t splits = 0;  // ncclCommSplit calls on it so far: every member splits in the same order
};

// The most ncclCommInitAll handles an event carries (its 128 id bytes, unused by that call).
constexpr size_t kMaxInitAllHandles = STRATA_NCCL_ID_BYTES / sizeof(uint64_t);

// A call still inside after this long at a window's end is reported as in flight (a metric row):
// a healthy collective or synchronize returns in milliseconds to a few hundred, so a second is
// well past them, and far below the diagnosis's hang bound (diagnose Options::hang_s, 10 s).
constexpr double kInFlightReportS = 1.0;

// Files found to carry no runtime are remembered, node-wide, up to this many: a node runs new
// images and .so files compiled at run time for as long as it runs. A process maps a few hundred
// files, so this holds every file of tens of distinct images; past it the set is forgotten and a
// file seen again is examined once more (its ELF symbols read again).
constexpr size_t kMaxRejectedFiles = 8192;
// The files one process maps that were considered: far above the few hundred a process maps at
// once, reached only by a process that keeps loading new files (JIT-compiled kernels' .so files).
constexpr size_t kMaxMappedFiles = 4096;

// The ncclComm_t argument of an NCCL collective, per the NCCL 2.28 signatures (nccl.h), as the
// return's decoding reads it (handle()).
uint64_t nccl_comm_arg(uint32_t api, const __u64* a) {
  switch (api) {
    case STRATA_API_NCCL_ALLREDUCE:      // (send, recv, count, dtype, op, comm, stream)
    case STRATA_API_NCCL_REDUCESCATTER:
    case STRATA_API_NCCL_BROADCAST:      // (send, recv, count, dtype, root, comm, stream)
      return a[5];
    case STRATA_API_NCCL_ALLGATHER:      // (send, recv, sendcount, dtype, comm, stream)
    case STRATA_API_NCCL_SEND:           // (buf, count, dtype, peer, comm, stream)
    case STRATA_API_NCCL_RECV:
      return a[4];
    case STRATA_API_NCCL_REDUCE:         // (send, recv, count, dtype, op, root, comm, stream)
      return a[6];
    default:
      return 0;
  }
}

struct PendingCollective {
  store::CollectiveRecord rec;  // times still CLOCK_MONOTONIC here
  uint64_t sync_done_ns = 0;
  bool device = false;
};

struct ProcState {
  uint32_t pid = 0;
  bool alive = true;
  uint64_t exit_mono = 0;          // when its exit was seen (0: alive)
  bool exit_in_flight_done = false;  // the calls it died inside were reported (in_flight_calls)
  uint64_t watch_start_mono = 0;
  std::map<uint64_t, CommState> comms;           // by ncclComm_t handle
  std::map<uint32_t, uint64_t> gloo_seq;         // per API (gloo has no handle we read)
  std::deque<PendingCollective> inflight;
  StepDetector steps;
  std::unique_ptr<GpuTimingSource> timeline;
  uint64_t next_timeline_try = 0;
  std::optional<TimelineTarget> timeline_target;  // its uid and own pid, read while it lived
  bool timeline_refused = false;                  // a file was there, and not its timeline
  std::vector<TimelineRecord> unmatched_device;  // collective kernels waiting for their call
  std::unordered_map<uint64_t, std::string> kernel_names;  // func address -> name
  // CUfunction handle -> kernel name, from cuModuleGetFunction / cuFuncGetName returns: a driver
  // launch passes only the handle (heap memory, nothing to symbolize).
  std::unordered_map<uint64_t, std::string> driver_names;
  // The files this process maps that were considered (runtime or not); a process that loads .so
  // files compiled at run time maps new ones for as long as it runs (kMaxMappedFiles).
  ForgetfulSet<std::string> mapped_files{kMaxMappedFiles};
  uint64_t last_scan = 0;
  uint64_t exec_mono = 0;
  bool maps_changed = false;
  bool loader_probed = false;  // its dynamic loader's _dl_debug_state probe is attached: dlopens are reported
  int device = -1;
  // Device busy intervals of the last minutes (monotonic): steps span windows.
  struct Busy {
    uint64_t start, end;
    // The largest end of this record and every earlier one: nondecreasing along the deque (records
    // of different streams arrive out of order), so a step finds its first record by binary search
    // instead of scanning minutes of records for every step (that scan was most of the agent's own
    // CPU on a GPU job: ~275 records a second per rank, 300 s kept, every step of every window).
    uint64_t max_end;
    bool collective;
  };
  std::deque<Busy> recent_device;
};

// Probes attached to one file: either one uprobe_multi link fd per direction (one syscall for all
// of a library's functions: fast enough to beat a process that calls ncclCommInitRank right after
// start), or, on kernels without uprobe_multi, one perf-event link per function.
struct ProbeSet {
  std::vector<int> multi_fds;
  std::vector<bpf_link*> links;
  void destroy() {
    for (int fd : multi_fds) close(fd);
    for (auto* l : links) bpf_link__destroy(l);
    multi_fds.clear();
    links.clear();
  }
  bool empty() const { return multi_fds.empty() && links.empty(); }
};

struct AttachedFile {
  std::vector<RuntimeFile> runtimes;
  ProbeSet always;               // always-on probes
  ProbeSet hot;                  // during a burst only
  ProbeSet memory;               // memory calls: always on while their rate fits the budget
  std::set<uint32_t> users;      // pids mapping it
};

// Never called: its address is where the uprobe_multi feature probe attaches.
__attribute__((noinline, used)) void uprobe_probe_target() { asm volatile(""); }

constexpr int kBpfLinkCreate = 28;          // enum bpf_cmd
constexpr uint32_t kUprobeMultiAttach = 48; // BPF_TRACE_UPROBE_MULTI
constexpr uint32_t kUprobeMultiReturn = 1;  // BPF_F_UPROBE_MULTI_RETURN

// BPF_LINK_CREATE for a uprobe_multi link, written against the kernel's union bpf_attr layout:
// libbpf 1.1 (Debian 12) predates it.
int link_create_uprobe_multi(int prog_fd, const std::string& path, const std::vector<uint64_t>& offsets,
                             const std::vector<uint64_t>& cookies, bool ret) {
  struct {
    uint32_t prog_fd, target_fd, attach_type, flags;
    uint64_t path, offsets, ref_ctr_offsets, cookies;
    uint32_t cnt, multi_flags, pid, pad;
  } attr{};
  attr.prog_fd = static_cast<uint32_t>(prog_fd);
  attr.attach_type = kUprobeMultiAttach;
  attr.path = reinterpret_cast<uint64_t>(path.c_str());
  attr.offsets = reinterpret_cast<uint64_t>(offsets.data());
  attr.cookies = reinterpret_cast<uint64_t>(cookies.data());
  attr.cnt = static_cast<uint32_t>(offsets.size());
  attr.multi_flags = ret ? kUprobeMultiReturn : 0;
  return static_cast<int>(syscall(__NR_bpf, kBpfLinkCreate, &attr, sizeof attr));
}

constexpr uint64_t kNs = 1'000'000'000ull;
// How often a process's maps are read again for runtime libraries it loaded without telling us.
// Reading a PyTorch rank's maps (~1,700 mappings) costs ~1 ms of the kernel's time and as much to
// parse. A process whose dynamic loader is probed reports every dlopen (maps_changed), so its
// rescan is only a safety net (a library mapped by hand, not through the loader): every five
// minutes. Without that probe (a static binary, a loader we did not recognize): every 30 s, so a
// runtime loaded late is probed within half a minute.
constexpr uint64_t kRescanNs = 30 * kNs;
constexpr uint64_t kProbedLoaderRescanNs = 300 * kNs;

// Device records, as a capture keeps them (agent/capture.h).
void encode_timeline(ByteWriter& w, uint32_t pid, uint64_t lost, const std::vector<TimelineRecord>& recs) {
  w.u32(pid);
  w.u64(lost);
  w.u32(static_cast<uint32_t>(recs.size()));
  for (const auto& r : recs) {
    w.u32(r.kind);
    w.i64(r.device);
    for (uint64_t v : {r.start_ns, r.end_ns, r.api_ns, r.correlation, r.func, r.stream, r.bytes}) w.u64(v);
    w.i64(r.api_tid);
    w.str(r.name);
  }
}

// A live timeline whose reads are also written to the capture.
class CapturedTimeline final : public GpuTimingSource {
 public:
  CapturedTimeline(std::unique_ptr<GpuTimingSource> live, Tape& tape, uint32_t pid)
      : live_(std::move(live)), tape_(tape), pid_(pid) {}
  std::vector<TimelineRecord> read_new(uint64_t& lost) override {
    uint64_t before = lost;
    auto recs = live_->read_new(lost);
    ByteWriter w;
    encode_timeline(w, pid_, lost - before, recs);
    tape_.put(CaptureKind::kTimelineRead, w.data());
    return recs;
  }
  bool remove_file() override { return live_->remove_file(); }

 private:
  std::unique_ptr<GpuTimingSource> live_;
  Tape& tape_;
  uint32_t pid_;
};

// A timeline whose reads come from a capture.
class ReplayTimeline final : public GpuTimingSource {
 public:
  ReplayTimeline(Tape& tape, uint32_t pid) : tape_(tape), pid_(pid) {}
  std::vector<TimelineRecord> read_new(uint64_t& lost) override {
    std::vector<TimelineRecord> out;
    auto rec = tape_.next(CaptureKind::kTimelineRead, pid_);
    if (!rec) return out;
    payload_ = std::move(*rec);  // the records' names view it until the next read
    ByteReader r(payload_);
    uint32_t pid = r.u32();
    uint64_t lost_here = r.u64();
    uint32_t n = r.u32();
    if (pid != pid_ || n > r.left() / 64) {  // a record is at least 64 bytes
      tape_.fail("corrupt device timeline record, or one for another pid");
      return out;
    }
    out.resize(n);
    for (auto& t : out) {
      t.kind = r.u32();
      t.device = static_cast<int>(r.i64());
      for (uint64_t* v : {&t.start_ns, &t.end_ns, &t.api_ns, &t.correlation, &t.func, &t.stream, &t.bytes}) *v = r.u64();
      t.api_tid = static_cast<int32_t>(r.i64());
      t.name = r.str_view();
    }
    if (!r.at_end()) {
      tape_.fail("corrupt device timeline record");
      out.clear();
      return out;
    }
    lost += lost_here;
    return out;
  }

 private:
  Tape& tape_;
  uint32_t pid_;
  std::string payload_;  // the last read's record (TimelineRecord::name views it)
};

// What became of an attempt to open a process's timeline (taped: replay opens no file).
enum class TimelineOpen : uint8_t { kNoTarget = 0, kMissing = 1, kRefused = 2, kOpened = 3 };

class GpuCommSource final : public Source {
 public:
  GpuCommSource(const GpuCommOptions& o, const SourceEnv& env) : opts_(o), env_(env) {}

  ~GpuCommSource() override {
    ring_buffer__free(ring_);
    for (auto& [path, f] : files_) {
      f.always.destroy();
      f.hot.destroy();
      f.memory.destroy();
    }
    gpu_comm_bpf__destroy(skel_);
  }

  Tape& tape() const { return env_.tape ? *env_.tape : live_tape(); }

  // Replay (agent/capture.h): no BPF; the API records, device timelines and kernel names come
  // from the capture, and the decoding, collective matching and step detection run as live.
  void init_replay() { init_clock(); }

  Status init() {
    setup_libbpf_logging();
    // uprobe_multi where the kernel has it (6.6+), probed at run time, else classic uprobes.
    if (auto st = load(true); !st || !probe_multi()) {
      gpu_comm_bpf__destroy(skel_);
      skel_ = nullptr;
      multi_ = false;
      if (auto st2 = load(false); !st2) return st2;
    }
    ring_ = ring_buffer__new(bpf_map__fd(skel_->maps.api_events), &GpuCommSource::on_event, this, nullptr);
    if (!ring_) return Error::from_errno("cannot open the API ring buffer", errno);
    init_clock();
    return {};
  }

  void init_clock() {
    uint64_t unix_ns = tape().unix_ns();
    mono_to_unix_ = static_cast<int64_t>(unix_ns) - static_cast<int64_t>(tape().mono_ns());
    // One clock read for all three: each read is taped, and a replayed capture holds the reads its
    // pipeline made (tests/data/replay/sim.cap).
    next_burst_ = memory_window_start_ = memory_on_since_ = tape().mono_ns();
  }

  // Takes the API ring buffer's records (taped: the kernel's raw records, one drain per record).
  Status drain_api() {
    if (tape().replaying()) {
      auto rec = tape().next(CaptureKind::kApiPoll);
      if (!rec) return {};
      ByteReader r(*rec);
      while (r.ok() && r.left() > 0) {
        std::string raw = r.str();
        if (!r.ok()) break;
        on_event(this, raw.data(), raw.size());
      }
      if (!r.ok()) tape().fail("corrupt API record");
      return {};
    }
    int n = ring_buffer__consume(ring_);
    if (tape().capturing()) tape().put(CaptureKind::kApiPoll, api_batch_.take());
    api_batch_ = ByteWriter();
    if (n < 0) return Error::from_errno("reading the API ring buffer", -n);
    return {};
  }

  Status load(bool multi) {
    skel_ = gpu_comm_bpf__open();
    if (!skel_) return Error::from_errno("cannot open the GPU/comm BPF program", errno);
    if (env_.targets_map_fd >= 0 && bpf_map__reuse_fd(skel_->maps.targets, env_.targets_map_fd) != 0)
      return Error::from_errno("cannot share the watched-process map", errno);
    multi_ = multi;
    if (multi) {
      bpf_program__set_expected_attach_type(skel_->progs.api_enter, static_cast<bpf_attach_type>(kUprobeMultiAttach));
      bpf_program__set_expected_attach_type(skel_->progs.api_exit, static_cast<bpf_attach_type>(kUprobeMultiAttach));
    }
    if (int err = gpu_comm_bpf__load(skel_); err)
      return Error::from_errno("cannot load the GPU/comm BPF program", -err);
    return {};
  }

  // Whether a uprobe_multi link can be made here (on a function of our own binary).
  bool probe_multi() {
    // A function of our own binary: no other process is touched by the test probe.
    auto maps = read_proc_maps(static_cast<uint32_t>(getpid()));
    uint64_t addr = reinterpret_cast<uint64_t>(&uprobe_probe_target);
    const Mapping* m = maps ? find_mapping(*maps, addr) : nullptr;
    if (!m) return false;
    std::vector<uint64_t> off{addr - m->start + m->file_offset}, cookie{0};
    int fd = link_create_uprobe_multi(bpf_program__fd(skel_->progs.api_enter), "/proc/self/exe", off, cookie, false);
    if (fd < 0) return false;
    close(fd);
    return true;
  }

  std::string name() const override { return "gpu/comm"; }

  void on_process(const store::ProcessInfo& p) override {
    auto& st = proc(p.pid);
    st.alive = true;
    st.exec_mono = tape().mono_ns();
    if (tape().replaying()) return;  // no probes to attach, no files to read
    if (auto t = timeline_target_of(p.pid)) st.timeline_target = *t;
    // Attach to the runtimes the new image will load before it can call them: its DT_NEEDED
    // closure, resolved as the loader will. Libraries loaded later (dlopen) are found by rescans.
    std::string root = "/proc/" + std::to_string(p.pid) + "/root";
    char exe[4096];
    ssize_t n = readlink(("/proc/" + std::to_string(p.pid) + "/exe").c_str(), exe, sizeof exe - 1);
    if (n > 0) {
      exe[n] = '\0';
      for (const auto& lib : library_closure(exe, process_env(p.pid, "LD_LIBRARY_PATH"), root))
        consider_file(st, lib);
    }
    scan(st);
  }

  void on_process_exit(uint32_t pid) override {
    auto it = procs_.find(pid);
    if (it == procs_.end()) return;
    it->second.alive = false;
    const uint64_t now = tape().mono_ns();  // one taped read for both
    it->second.exit_mono = now;
    // Take its device records now, then remove its file: nobody reads it after its last reader,
    // and left there every GPU process ever run would keep its ring in /run (memory).
    read_timeline(it->second, now, /*force=*/true);
    if (it->second.timeline && it->second.timeline->remove_file()) ++timelines_removed_;
    release_files(it->second);
  }

  Status poll() override {
    if (auto st = drain_api(); !st) return st;
    uint64_t now = tape().mono_ns();
    for (auto& [pid, st] : procs_) {
      // Libraries loaded late (dlopen): the loader's _dl_debug_state probe says when; a slow
      // rescan covers processes without a dynamic loader, and a slower one those with.
      const uint64_t rescan_ns = st.loader_probed ? kProbedLoaderRescanNs : kRescanNs;
      bool due = st.maps_changed ? now - st.last_scan > kNs / 10 : now - st.last_scan > rescan_ns;
      if (st.alive && due && !tape().replaying()) {
        st.maps_changed = false;
        scan(st);
      }
      read_timeline(st, now);
    }
    if (!tape().replaying()) {
      check_memory_rate(now);
      drive_bursts(now);
      drive_memory_bursts(now);
    }
    return {};
  }

  Status flush(store::Writer& store, const WindowContext& w) override {
    uint64_t now = tape().mono_ns();
    // Take the last events first, so calls and their device records meet in this window.
    (void)drain_api();
    for (auto& [pid, st] : procs_) read_timeline(st, now, /*force=*/true);

    std::vector<store::CommunicatorRecord> comms;
    comms.swap(new_comms_);
    for (auto& c : comms) c.init_ns = to_unix(c.init_ns);
    if (auto s = store.put_communicators(w.recording, comms); !s) return s;

    std::vector<store::CollectiveRecord> colls;
    std::vector<store::StepRecord> steps;
    std::vector<store::Metric> metrics;
    for (auto& [pid, st] : procs_) {
      finalize_collectives(st, now, !st.alive, colls);
      // A rank still running when the run stops: its steps so far are written as at its exit (a
      // gloo job stopped by --duration before the detector's first decision kept none).
      for (const auto& s : st.steps.take_steps(!st.alive || w.last)) {
        store::StepRecord r;
        r.pid = pid;
        r.step = s.step;
        r.start_ns = to_unix(s.start_ns);
        r.end_ns = to_unix(s.end_ns);
        r.collective_ns = s.collective_ns;
        r.device_collective_ns = s.device_collective_ns;
        fill_device_step(st, s, r);
        steps.push_back(r);
      }
    }
    if (auto s = store.put_collectives(w.recording, colls); !s) return s;
    if (auto s = store.put_steps(w.recording, steps); !s) return s;

    // Device activity: raw records up to a cap per process, all of them summarized by name.
    // Summed by (pid, name index) first, then ordered by (pid, name) as the metrics always were.
    // The stored rows, then handed (moved) to the flight recorder with the records past the cap:
    // per process that is their order in the window (its first records are the stored ones).
    std::vector<store::DeviceActivity> acts;
    std::vector<store::DeviceActivity> over_cap;  // past the cap: for the flight recorder only
    // Every process's records up to its cap, at most (the window's processes are in procs_).
    acts.reserve(std::min(device_window_.size(), opts_.max_device_records_per_window * procs_.size()));
    std::unordered_map<uint64_t, std::pair<uint64_t, uint64_t>> by_id;  // pid << 32 | name -> count, ns
    std::map<uint32_t, size_t> per_pid;
    uint32_t last_pid = 0;
    size_t* last_count = nullptr;  // per_pid's entry for last_pid: a window's records come in runs of one pid
    for (const auto& d : device_window_) {
      auto& slot = by_id[static_cast<uint64_t>(d.pid) << 32 | d.name];
      slot.first += 1;
      slot.second += d.end_ns - d.start_ns;
      if (!last_count || d.pid != last_pid) {
        last_pid = d.pid;
        last_count = &per_pid[d.pid];
      }
      const bool stored = (*last_count)++ < opts_.max_device_records_per_window;
      if (!stored) ++device_records_summarized_;
      if (!stored && !env_.flight_recorder) continue;
      store::DeviceActivity a;
      a.pid = d.pid;
      a.device = d.device;
      a.kind = device_kind(d.kind);
      a.name = *device_names_[d.name];
      a.stream = d.stream;
      a.start_ns = to_unix(d.start_ns);
      a.end_ns = to_unix(d.end_ns);
      a.api_ns = to_unix(d.api_ns);
      a.api_tid = d.api_tid;
      a.correlation = d.correlation;
      a.bytes = d.bytes;
      // Every raw record goes to the flight recorder; the store gets them up to the cap.
      if (stored) acts.push_back(std::move(a));
      else over_cap.push_back(std::move(a));
    }
    std::map<std::pair<uint32_t, std::string>, std::pair<uint64_t, uint64_t>> by_name;  // count, ns
    for (const auto& [key, v] : by_id)
      by_name.emplace(std::pair<uint32_t, std::string>(static_cast<uint32_t>(key >> 32),
                                                       *device_names_[static_cast<uint32_t>(key)]),
                      v);
    device_window_.clear();
    device_names_.clear();
    device_name_ids_.clear();
    auto put = store.put_device_activity(w.recording, acts);
    if (env_.flight_recorder) {
      env_.flight_recorder->add_devices(std::move(acts));
      env_.flight_recorder->add_devices(std::move(over_cap));
    }
    if (!put) return put;
    for (const auto& [key, v] : by_name) {
      metrics.push_back({key.first, "gpu.kernel_count", key.second, static_cast<double>(v.first)});
      metrics.push_back({key.first, "gpu.kernel_us", key.second, static_cast<double>(v.second) / 1e3});
    }
    for (const auto& [key, v] : api_window_) {
      metrics.push_back({key.first, "api.calls", api_name(key.second), static_cast<double>(v.first)});
      metrics.push_back({key.first, "api.time_us", api_name(key.second), static_cast<double>(v.second) / 1e3});
    }
    api_window_.clear();
    // Bytes of the memory calls that carry a size (allocations, synchronous copies).
    for (const auto& [key, bytes] : api_bytes_) {
      metrics.push_back({key.first, "api.bytes", api_name(key.second), static_cast<double>(bytes)});
    }
    api_bytes_.clear();
    // Once memory calls are sampled, the share of this window their probes were on: their sums
    // cover that share of it, and the diagnosis scales them by it (diagnose/loader.cpp).
    if (memory_sampled_ && now > memory_window_start_) {
      const bool on = memory_burst_on_;
      const double share = static_cast<double>(memory_probed_ns_ + (on ? now - memory_on_since_ : 0)) /
                           static_cast<double>(now - memory_window_start_);
      for (const auto& [pid, st] : procs_) metrics.push_back({pid, "api.memory_coverage", "", std::min(1.0, share)});
    }
    memory_window_start_ = now;
    memory_probed_ns_ = 0;
    if (!memory_sampled_ || memory_burst_on_) memory_on_since_ = now;
    for (auto& [pid, st] : procs_) {
      if (st.device >= 0) metrics.push_back({pid, "gpu.device", "", static_cast<double>(st.device)});
    }
    // Measured to the window's end (the row's end_ns is that instant), so that the entry time a
    // reader derives (end_ns - value) is the call's own, not shifted by how late the flush runs.
    in_flight_calls(w.mono_end_ns ? w.mono_end_ns : now, metrics);
    if (auto s = store.put_metrics(w.recording, w.start_ns, w.end_ns, metrics); !s) return s;

    // Sampled launches with their CPU stacks.
    std::vector<store::LaunchSample> launches;
    for (auto& [key, count] : launch_window_) {
      auto id = store.intern_stack(launch_stacks_[key.stack]);
      if (!id) return id.error();
      launches.push_back({key.pid, key.tid, key.kernel, *id, count});
    }
    launch_window_.clear();
    launch_stacks_.clear();
    launch_stack_index_.clear();
    if (auto s = store.put_launch_samples(w.recording, w.start_ns, w.end_ns, launches); !s) return s;

    // Processes that are gone and fully flushed are forgotten.
    for (auto it = procs_.begin(); it != procs_.end();) {
      if (!it->second.alive && it->second.inflight.empty()) it = procs_.erase(it);
      else ++it;
    }
    return {};
  }

  // BPF run time plus the trap of every uprobe hit, which no BPF counter sees (opts_.uprobe_cost_us).
  uint64_t kernel_cost_ns() const override {
    if (!skel_) return 0;
    return bpf_run_time(skel_->obj).ns + trap_cost_ns();
  }

  void stats(std::vector<std::pair<std::string, double>>& out) const override {
    if (!skel_) return;  // replay: the kernel's counters are the live run's
    auto sum = [&](uint32_t key) { return static_cast<double>(counter(key)); };
    out.emplace_back("gpu_comm.probe_entries", sum(STRATA_GC_ENTRIES));
    out.emplace_back("gpu_comm.probe_returns", sum(STRATA_GC_RETURNS));
    out.emplace_back("gpu_comm.ringbuf_drops", sum(STRATA_GC_RINGBUF_DROP));
    out.emplace_back("gpu_comm.unmatched_returns", sum(STRATA_GC_UNMATCHED_RETURN));
    out.emplace_back("gpu_comm.launch_bursts", static_cast<double>(bursts_));
    out.emplace_back("gpu_comm.launch_hits", static_cast<double>(launch_hits_));
    out.emplace_back("gpu_comm.probe_trap_cost_s", static_cast<double>(trap_cost_ns()) / 1e9);
    out.emplace_back("gpu_comm.launch_probe_cost_s", static_cast<double>(launch_hits_) * opts_.uprobe_cost_us / 1e6);
    out.emplace_back("gpu_comm.driver_launch_hits", static_cast<double>(driver_launch_hits_));
    out.emplace_back("gpu_comm.driver_functions_named", static_cast<double>(driver_functions_named_));
    out.emplace_back("gpu_comm.memory_hits", static_cast<double>(memory_hits_));
    out.emplace_back("gpu_comm.memory_probe_cost_s", static_cast<double>(memory_hits_) * opts_.uprobe_cost_us / 1e6);
    out.emplace_back("gpu_comm.memory_stacks", static_cast<double>(memory_stacks_));
    out.emplace_back("gpu_comm.memory_probes_sampled", memory_sampled_ ? 1.0 : 0.0);
    out.emplace_back("gpu_comm.timeline_lost", static_cast<double>(timeline_lost_));
    out.emplace_back("gpu_comm.timelines_refused", static_cast<double>(timelines_refused_));
    out.emplace_back("gpu_comm.timelines_removed", static_cast<double>(timelines_removed_));
    auto [gpu, no_timeline] = gpu_processes();
    out.emplace_back("gpu_comm.gpu_processes", static_cast<double>(gpu));
    out.emplace_back("gpu_comm.gpu_processes_without_timeline", static_cast<double>(no_timeline));
    out.emplace_back("gpu_comm.device_records_summarized", static_cast<double>(device_records_summarized_));
    out.emplace_back("gpu_comm.attached_files", static_cast<double>(files_.size()));
    out.emplace_back("gpu_comm.rejected_files_forgotten", static_cast<double>(rejected_.forgets()));
    out.emplace_back("gpu_comm.attach_errors", static_cast<double>(attach_errors_));
    out.emplace_back("gpu_comm.uprobe_multi", multi_ ? 1.0 : 0.0);
    out.emplace_back("gpu_comm.bpf_run_s", static_cast<double>(bpf_run_time(skel_->obj).ns) / 1e9);
  }

 private:
  // Every entry and return of the probes in a watched process (launches and memory calls among
  // them), each a trap into the kernel. Hits in processes nobody watches return at the first
  // check and are not counted.
  uint64_t trap_cost_ns() const {
    uint64_t hits = counter(STRATA_GC_ENTRIES) + counter(STRATA_GC_RETURNS) + counter(STRATA_GC_UNMATCHED_RETURN);
    return static_cast<uint64_t>(static_cast<double>(hits) * opts_.uprobe_cost_us * 1000);
  }

  uint64_t counter(uint32_t key) const {
    int ncpus = libbpf_num_possible_cpus();
    std::vector<uint64_t> values(ncpus > 0 ? ncpus : 1);
    if (bpf_map__lookup_elem(skel_->maps.gc_counters, &key, sizeof(key), values.data(),
                             values.size() * sizeof(uint64_t), 0) != 0)
      return 0;
    uint64_t s = 0;
    for (auto v : values) s += v;
    return s;
  }

  // The calls the watched processes are inside now (entered, not returned), read from the probes'
  // `calls` map: a metric row each (store::kInFlightMetric), the evidence of a rank stuck inside a
  // collective that its return events never show (a gloo call blocks until the collective is done;
  // a host waits for a hung NCCL collective in a stream synchronize). Costs nothing per call: one
  // walk of the map per window. Only calls inside for kInFlightReportS or more at `now` (the
  // window's end) are reported; one entered after it is the next window's.
  void in_flight_calls(uint64_t now, std::vector<store::Metric>& metrics) {
    if (!skel_) return;  // replay: no map to read
    const bpf_map* map = skel_->maps.calls;
    uint64_t key = 0, next = 0;
    const uint64_t* prev = nullptr;
    // A walk restarts from the first key when the one it stands on is deleted (a call returned):
    // each call is reported once, and the bound (the map's size) keeps the walk finite.
    std::set<uint64_t> walked;
    for (uint32_t steps = 0; steps < bpf_map__max_entries(map) &&
                             bpf_map__get_next_key(map, prev, &next, sizeof(next)) == 0;
         ++steps) {
      key = next;
      prev = &key;
      if (!walked.insert(key).second) continue;
      strata_api_call c{};
      if (bpf_map__lookup_elem(map, &key, sizeof(key), &c, sizeof(c), 0) != 0) continue;
      const auto api = static_cast<uint32_t>(key & 0xff);
      const auto tid = static_cast<uint32_t>(key >> 8);
      const bool sync = api == STRATA_API_CUDA_STREAM_SYNCHRONIZE || api == STRATA_API_CUDA_DEVICE_SYNCHRONIZE ||
                        api == STRATA_API_CUDA_EVENT_SYNCHRONIZE;
      if (!(api_is_collective(api) || sync) || c.enter_ns == 0) continue;
      auto it = procs_.find(c.tgid);
      if (it == procs_.end()) continue;
      ProcState& st = it->second;
      // A process that exited since the last window: the calls it died inside (their entries
      // stay, no return ever deletes them), once. Later windows do not have it.
      if (!st.alive && (st.exit_in_flight_done || st.exit_mono == 0)) continue;
      if (now < c.enter_ns) continue;
      const double inside_s = static_cast<double>(now - c.enter_ns) / 1e9;
      if (inside_s < kInFlightReportS) continue;
      if (st.alive) {
        // A thread that died inside the call leaves its entry behind (LRU): not a call in flight.
        struct stat sb;
        const std::string task = "/proc/" + std::to_string(c.tgid) + "/task/" + std::to_string(tid);
        if (::stat(task.c_str(), &sb) != 0) continue;
      }
      store::InFlightCall call;
      if (sync) {
        call.library = "cuda";
        call.op = api_name(api);
      } else if (api >= STRATA_API_GLOO_ALLREDUCE) {
        call.library = "gloo";
        call.op = api_collective_op(api);
        auto g = st.gloo_seq.find(api);
        call.seq = (g == st.gloo_seq.end() ? 0 : g->second) + 1;  // the number its return will get
      } else {
        call.library = "nccl";
        call.op = api_collective_op(api);
        auto comm = st.comms.find(nccl_comm_arg(api, c.args));
        if (comm != st.comms.end()) {
          call.comm_id = comm->second.id;
          call.seq = comm->second.seq + 1;
        }
      }
      metrics.push_back({c.tgid, store::kInFlightMetric, store::in_flight_label(call), inside_s});
    }
    for (auto& [pid, st] : procs_) {
      if (!st.alive) st.exit_in_flight_done = true;
    }
  }

  uint64_t to_unix(uint64_t mono) const {
    return mono ? static_cast<uint64_t>(static_cast<int64_t>(mono) + mono_to_unix_) : 0;
  }

  ProcState& proc(uint32_t pid) {
    auto it = procs_.find(pid);
    if (it != procs_.end()) return it->second;
    auto& st = procs_[pid];
    st.pid = pid;
    st.watch_start_mono = tape().mono_ns();
    st.steps = StepDetector(st.watch_start_mono);
    return st;
  }

  // A process's timeline appears with its first device work: one watched this long that maps CUDA
  // and still has none is taken to have no GPU timing source (CUDA initialization and a first
  // kernel take seconds, not this long).
  static constexpr uint64_t kTimelineGraceNs = 30 * kNs;

  // Watched processes that map a CUDA runtime or driver, and how many of them have had no device
  // timeline for kTimelineGraceNs (no CUPTI injection): their GPU times are the NVML figures and
  // launch->sync times only, which the agent says in its health.
  std::pair<size_t, size_t> gpu_processes() const {
    uint64_t now = monotonic_now_ns();
    size_t gpu = 0, without = 0;
    for (const auto& [pid, st] : procs_) {
      auto keys = st_files_.find(pid);
      if (!st.alive || keys == st_files_.end()) continue;
      bool cuda = false;
      for (const auto& key : keys->second) {
        auto f = files_.find(key);
        if (f == files_.end()) continue;
        for (const auto& rt : f->second.runtimes)
          cuda = cuda || rt.kind == RuntimeKind::kCudaRuntime || rt.kind == RuntimeKind::kCudaDriver;
      }
      if (!cuda) continue;
      ++gpu;
      if (!st.timeline && now > st.watch_start_mono + kTimelineGraceNs) ++without;
    }
    return {gpu, without};
  }

  // Finds the runtime libraries a process maps and attaches to each new one.
  void scan(ProcState& st) {
    st.last_scan = monotonic_now_ns();
    auto maps = read_proc_maps(st.pid);
    if (!maps) return;
    for (const auto& m : *maps) {
      if (!m.executable || m.path.empty() || m.path[0] != '/' || st.mapped_files.contains(m.path)) continue;
      // Probed only when the path still leads to the mapped file (device and inode of the maps
      // line), not to one swapped in under it or reached by a link out of the container.
      if (!open_mapped_file(st.pid, m)) {
        st.mapped_files.insert(m.path);
        continue;
      }
      consider_file(st, m.path);
    }
  }

  // A file the process maps (or will map): attach to the runtimes it carries, once per file.
  void consider_file(ProcState& st, const std::string& seen_path) {
    if (st.mapped_files.contains(seen_path)) return;
    st.mapped_files.insert(seen_path);
    // Read through the process's root: the file may live in its container.
    std::string path = "/proc/" + std::to_string(st.pid) + "/root" + seen_path;
    std::string key = file_key(path);
    auto it = files_.find(key);
    if (it == files_.end()) {
      if (rejected_.contains(key)) return;
      auto rts = recognize_runtimes(path);
      if (!rts || rts->empty()) {
        rejected_.insert(key);
        return;
      }
      AttachedFile f;
      f.runtimes = std::move(*rts);
      attach(f, path);
      it = files_.emplace(key, std::move(f)).first;
      file_paths_[key] = path;
    }
    it->second.users.insert(st.pid);
    st_files_[st.pid].insert(key);
    if (!it->second.always.empty()) {
      for (const auto& rf : it->second.runtimes)
        if (rf.kind == RuntimeKind::kDynamicLoader) st.loader_probed = true;
    }
  }

  static std::string file_key(const std::string& path) {
    struct stat s{};
    if (::stat(path.c_str(), &s) != 0) return path;
    return std::to_string(s.st_dev) + ":" + std::to_string(s.st_ino);
  }

  bool wanted(const RuntimeFile& rf) const {
    if (rf.kind == RuntimeKind::kDynamicLoader) return true;
    if (rf.kind == RuntimeKind::kNccl || rf.kind == RuntimeKind::kGloo) return opts_.comm;
    return opts_.gpu;
  }

  // Attaches entry and return probes for `probes` of one file.
  ProbeSet attach_probes(const std::string& path, const std::vector<ResolvedProbe>& probes) {
    ProbeSet set;
    if (probes.empty()) return set;
    if (multi_) {
      std::vector<uint64_t> offsets, cookies;
      for (const auto& p : probes) {
        offsets.push_back(p.file_offset);
        cookies.push_back(p.api);
      }
      for (bool ret : {false, true}) {
        int prog = bpf_program__fd(ret ? skel_->progs.api_exit : skel_->progs.api_enter);
        int fd = link_create_uprobe_multi(prog, path, offsets, cookies, ret);
        if (fd >= 0) set.multi_fds.push_back(fd);
        else ++attach_errors_;
      }
      return set;
    }
    for (const auto& p : probes) {
      for (bool ret : {false, true}) {
        LIBBPF_OPTS(bpf_uprobe_opts, uo);
        uo.bpf_cookie = p.api;
        uo.retprobe = ret;
        bpf_program* prog = ret ? skel_->progs.api_exit : skel_->progs.api_enter;
        bpf_link* l = bpf_program__attach_uprobe_opts(prog, -1, path.c_str(), p.file_offset, &uo);
        if (l) set.links.push_back(l);
        else ++attach_errors_;
      }
    }
    return set;
  }

  enum class ProbeClass { kAlways, kHot, kMemory };

  std::vector<ResolvedProbe> probes_of(const AttachedFile& f, ProbeClass cls) const {
    std::vector<ResolvedProbe> out;
    for (const auto& rf : f.runtimes) {
      if (!wanted(rf)) continue;
      for (const auto& p : rf.probes) {
        ProbeClass c = api_is_memory(p.api) ? ProbeClass::kMemory : p.hot ? ProbeClass::kHot : ProbeClass::kAlways;
        if (c == cls) out.push_back(p);
      }
    }
    return out;
  }

  void attach(AttachedFile& f, const std::string& path) {
    f.always = attach_probes(path, probes_of(f, ProbeClass::kAlways));
    if (!memory_sampled_) f.memory = attach_probes(path, probes_of(f, ProbeClass::kMemory));
  }

  // Memory-call probes stay on while their hits x cost fit opts_.memory_budget_cpu; past it they are
  // detached and run in bursts of their own for good (their counts are samples from then on, which
  // the stats say: gpu_comm.memory_probes_sampled, and api.memory_coverage per window). A period's
  // allowance spent early trips it at once: a storm of calls costs at most one allowance plus a
  // poll's worth of hits before it stops.
  void check_memory_rate(uint64_t now) {
    if (memory_sampled_ || !opts_.gpu) return;
    if (memory_rate_since_ == 0) {
      memory_rate_since_ = now;
      memory_hits_at_ = memory_hits_;
      return;
    }
    const double allowance = opts_.memory_budget_cpu * opts_.memory_rate_period_s / (opts_.uprobe_cost_us / 1e6);
    const double hits = static_cast<double>(memory_hits_ - memory_hits_at_);
    if (hits <= allowance) {
      if (static_cast<double>(now - memory_rate_since_) / 1e9 >= opts_.memory_rate_period_s) {
        memory_rate_since_ = now;  // a new period
        memory_hits_at_ = memory_hits_;
      }
      return;
    }
    memory_probed_ns_ += now - memory_on_since_;  // on until now; off until the next burst
    memory_sampled_ = true;
    for (auto& [key, f] : files_) f.memory.destroy();
    const double secs = static_cast<double>(now - memory_rate_since_) / 1e9;
    next_memory_burst_ = now + memory_gap_ns(secs > 0 ? hits / secs : 0);
  }

  // Off-time after a memory burst, so that hits x cost stays inside opts_.memory_budget_cpu at the
  // rate the calls came at.
  uint64_t memory_gap_ns(double rate) const {
    const double allowed = opts_.memory_budget_cpu / (opts_.uprobe_cost_us / 1e6);  // hits per second
    const double duty = rate > allowed ? allowed / rate : 1.0;
    const double period = std::clamp(opts_.memory_burst_s / duty, opts_.memory_burst_s, opts_.max_burst_period_s);
    return static_cast<uint64_t>((period - opts_.memory_burst_s) * 1e9);
  }

  // Sampled memory probes run in bursts of their own, of opts_.memory_burst_s: long enough to span
  // whole steps, since a program often makes its memory calls in one phase of the step (reads back
  // at the end of it): the launch bursts (0.2 s) would see that phase or miss it, and the counts
  // per step read from them would swing by the step's shape, not by the program.
  void drive_memory_bursts(uint64_t now) {
    if (!memory_sampled_ || !opts_.gpu) return;
    // The probes count from when they are all attached until they are all gone: attaching and
    // detaching take tens of ms per file here, a share of a short burst that must not count as
    // probed (it would scale the counts down by as much).
    if (memory_burst_on_) {
      if (now < memory_burst_end_) return;
      for (auto& [key, f] : files_) f.memory.destroy();
      const uint64_t off = tape().mono_ns();
      memory_probed_ns_ += off - memory_on_since_;
      memory_burst_on_ = false;
      const double secs = static_cast<double>(off - memory_on_since_burst_) / 1e9;
      next_memory_burst_ = off + memory_gap_ns(secs > 0 ? static_cast<double>(memory_burst_hits_) / secs : 0);
      return;
    }
    if (now < next_memory_burst_) return;
    for (auto& [key, f] : files_) f.memory = attach_probes(file_paths_[key], probes_of(f, ProbeClass::kMemory));
    const uint64_t on = tape().mono_ns();
    memory_burst_on_ = true;
    memory_on_since_ = memory_on_since_burst_ = on;
    memory_burst_end_ = on + static_cast<uint64_t>(opts_.memory_burst_s * 1e9);
    memory_burst_hits_ = 0;
  }

  void set_memory_stacks(bool on) {
    if (skel_ && skel_->bss) skel_->bss->memory_stacks = on ? 1 : 0;
  }

  void release_files(ProcState& st) {
    auto it = st_files_.find(st.pid);
    if (it == st_files_.end()) return;
    for (const auto& key : it->second) {
      auto f = files_.find(key);
      if (f == files_.end()) continue;
      f->second.users.erase(st.pid);
      if (f->second.users.empty()) {  // last user gone: detach cleanly
        f->second.always.destroy();
        f->second.hot.destroy();
        f->second.memory.destroy();
        files_.erase(f);
        file_paths_.erase(key);
      }
    }
    st_files_.erase(it);
  }

  // Hot probes (kernel launches) run in short bursts; the gap between bursts grows with the
  // launch rate so that hits x cost per hit stays inside the budget.
  void drive_bursts(uint64_t now) {
    if (!opts_.gpu) return;
    if (in_burst_) {
      if (now < burst_end_) return;
      for (auto& [key, f] : files_) f.hot.destroy();
      set_memory_stacks(false);
      in_burst_ = false;
      double secs = static_cast<double>(now - burst_start_) / 1e9;
      double rate = secs > 0 ? static_cast<double>(burst_hits_) / secs : 0;
      double allowed = opts_.launch_budget_cpu / (opts_.uprobe_cost_us / 1e6);  // hits per second
      double duty = rate > allowed ? allowed / rate : 1.0;
      double period = std::clamp(opts_.burst_s / duty, opts_.min_burst_period_s, opts_.max_burst_period_s);
      next_burst_ = now + static_cast<uint64_t>(period * 1e9);
      return;
    }
    if (now < next_burst_) return;
    bool any = false;
    for (auto& [key, f] : files_) {
      f.hot = attach_probes(file_paths_[key], probes_of(f, ProbeClass::kHot));
      any = any || !f.hot.empty();
    }
    if (!any) {
      next_burst_ = now + static_cast<uint64_t>(opts_.min_burst_period_s * 1e9);
      return;
    }
    ++bursts_;
    set_memory_stacks(true);
    in_burst_ = true;
    burst_start_ = now;
    burst_end_ = now + static_cast<uint64_t>(opts_.burst_s * 1e9);
    burst_hits_ = 0;
  }

  void read_timeline(ProcState& st, uint64_t now, bool force = false) {
    if (!opts_.gpu) return;
    if (!st.timeline) {
      if (now < st.next_timeline_try && !force) return;
      auto opened = open_timeline(st);
      if (opened == TimelineOpen::kNoTarget) return;  // gone before we knew whose it was: nothing to trust
      if (opened == TimelineOpen::kRefused && !st.timeline_refused) {
        st.timeline_refused = true;  // counted once per process; it is tried again, as a missing one
        ++timelines_refused_;
      }
      if (opened != TimelineOpen::kOpened) {
        // The file appears with the first device work: looked for five times a second in the grace
        // after the watch began, then every 5 s (a process started without the injection never gets
        // one, and each look is an open through /proc/PID/root; the window's flush looks too).
        st.next_timeline_try = now + (now < st.watch_start_mono + kTimelineGraceNs ? kNs / 5 : 5 * kNs);
        return;
      }
    }
    while (!st.recent_device.empty() && st.recent_device.front().end + 300 * kNs < now) st.recent_device.pop_front();
    for (auto& r : st.timeline->read_new(timeline_lost_)) {
      // Kept compact until the flush: the name as an index into this window's names (no string
      // copied per record; kernel names are long, and a rank runs 10k-100k kernels a second).
      DeviceRecord d;
      d.pid = st.pid;
      d.device = r.device;
      d.kind = r.kind;
      // A driver launch's func is its CUfunction handle: nothing to symbolize. The timing source's
      // own name comes first (CUPTI's is whole; a lookup's is cut at 127 bytes), else the name
      // the handle was looked up by.
      auto driver = st.driver_names.find(r.func);
      d.name = intern_device_name(driver != st.driver_names.end() && r.name.empty()
                                      ? std::string_view(driver->second)
                                      : kernel_name(st, r.func, r.name));
      d.stream = r.stream;
      d.start_ns = r.start_ns;
      d.end_ns = std::max(r.end_ns, r.start_ns);
      d.api_ns = r.api_ns;
      d.api_tid = static_cast<uint32_t>(r.api_tid);
      d.correlation = r.correlation;
      d.bytes = r.bytes;
      if (r.kind == STRATA_TL_COLLECTIVE) match_device_collective(st, r);
      const uint64_t max_end = st.recent_device.empty() ? d.end_ns : std::max(st.recent_device.back().max_end, d.end_ns);
      st.recent_device.push_back({d.start_ns, d.end_ns, max_end, r.kind == STRATA_TL_COLLECTIVE});
      device_window_.push_back(d);
    }
  }

  // The index of `name` among this window's device record names (device_names_), added if new.
  uint32_t intern_device_name(std::string_view name) {
    auto it = device_name_ids_.find(name);
    if (it != device_name_ids_.end()) return it->second;
    const auto id = static_cast<uint32_t>(device_names_.size());
    device_names_.push_back(std::make_unique<std::string>(name));
    device_name_ids_.emplace(std::string_view(*device_names_.back()), id);
    return id;
  }

  static const char* device_kind(uint32_t kind) {
    return kind == STRATA_TL_KERNEL     ? "kernel"
           : kind == STRATA_TL_MEMCPY   ? "memcpy"
           : kind == STRATA_TL_MEMSET   ? "memset"
                                        : "collective";
  }

  // Opens the process's device timeline into st.timeline (taped: capture.h).
  TimelineOpen open_timeline(ProcState& st) {
    if (tape().replaying()) {
      auto rec = tape().next(CaptureKind::kTimelineOpen, st.pid);
      if (!rec) return TimelineOpen::kNoTarget;
      ByteReader r(*rec);
      uint32_t pid = r.u32();
      auto what = static_cast<TimelineOpen>(r.u8());
      if (!r.at_end() || pid != st.pid || static_cast<uint8_t>(what) > static_cast<uint8_t>(TimelineOpen::kOpened)) {
        tape().fail("corrupt timeline record, or one for another pid");
        return TimelineOpen::kNoTarget;
      }
      if (what == TimelineOpen::kOpened) st.timeline = std::make_unique<ReplayTimeline>(tape(), st.pid);
      return what;
    }
    TimelineOpen what = TimelineOpen::kOpened;
    if (!st.timeline_target) st.timeline_target = timeline_target_of(st.pid);
    if (!st.timeline_target) {
      what = TimelineOpen::kNoTarget;
    } else if (auto t = open_timeline_for(*st.timeline_target); !t) {
      what = timeline_refused(t.error()) ? TimelineOpen::kRefused : TimelineOpen::kMissing;
    } else if (tape().capturing()) {
      st.timeline = std::make_unique<CapturedTimeline>(std::move(*t), tape(), st.pid);
    } else {
      st.timeline = std::move(*t);
    }
    if (tape().capturing()) {
      ByteWriter w;
      w.u32(st.pid);
      w.u8(static_cast<uint8_t>(what));
      tape().put(CaptureKind::kTimelineOpen, w.data());
    }
    return what;
  }

  // The kernel's name is the symbol of its host stub, read from the target's binary (taped).
  std::string_view kernel_name(ProcState& st, uint64_t func, std::string_view fallback) {
    if (!func) return fallback;
    auto it = st.kernel_names.find(func);
    if (it != st.kernel_names.end()) return it->second;
    std::string name;
    if (tape().replaying()) {
      auto rec = tape().next(CaptureKind::kKernelName, st.pid);
      const std::string payload = rec ? *rec : std::string();  // the reader views it: kept alive here
      ByteReader r(payload);
      uint32_t pid = r.u32();
      uint64_t f = r.u64();
      name = r.str();
      if (rec && (!r.at_end() || pid != st.pid || f != func))
        tape().fail("corrupt kernel name record, or one for another kernel (pid " + std::to_string(pid) + " 0x" +
                    hex_addr(f) + ", asked for pid " + std::to_string(st.pid) + " 0x" + hex_addr(func) + ")");
    } else {
      name = read_kernel_name(st, func, fallback);
      if (tape().capturing()) {
        ByteWriter w;
        w.u32(st.pid);
        w.u64(func);
        w.str(name);
        tape().put(CaptureKind::kKernelName, w.data());
      }
    }
    return st.kernel_names.emplace(func, std::move(name)).first->second;
  }

  std::string read_kernel_name(ProcState& st, uint64_t func, std::string_view fallback) {
    std::string name(fallback);
    auto maps = read_proc_maps(st.pid);
    if (maps) {
      if (const Mapping* m = find_mapping(*maps, func); m && !m->path.empty() && m->path[0] == '/') {
        // The build id of the mapped file itself (device and inode checked): the symbolizer reads
        // the path only when the file there carries it, so a file swapped in does not name kernels.
        if (auto file = open_mapped_file(st.pid, *m)) {
          std::vector<Frame> f(1);
          f[0].kind = FrameKind::kNative;
          f[0].module = "/proc/" + std::to_string(st.pid) + "/root" + m->path;
          f[0].offset = func - m->start + m->file_offset;
          if (auto id = symbolize::read_build_id(file->path())) f[0].build_id = *id;
          symbolizer_->symbolize(f);
          if (!f[0].function.empty()) name = f[0].function;
        }
      }
    }
    if (name.empty()) name = "kernel@0x" + hex_addr(func);
    return name;
  }

  static std::string hex_addr(uint64_t v) {
    char b[32];
    std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
    return b;
  }

  void match_device_collective(ProcState& st, const TimelineRecord& r) {
    for (auto& p : st.inflight) {
      if (p.device || p.rec.tid != static_cast<uint32_t>(r.api_tid)) continue;
      if (r.api_ns + 1000 < p.rec.enter_ns || r.api_ns > p.rec.exit_ns + 1000) continue;
      p.rec.device_start_ns = r.start_ns;
      p.rec.device_end_ns = std::max(r.end_ns, r.start_ns);
      p.device = true;
      return;
    }
    st.unmatched_device.push_back(r);
    st.unmatched_device.back().name = {};  // kept past the read its name was valid for; not needed
    if (st.unmatched_device.size() > 1024) st.unmatched_device.erase(st.unmatched_device.begin());
  }

  // Collectives leave the in-flight list in call order once their completion is known.
  void finalize_collectives(ProcState& st, uint64_t now, bool final, std::vector<store::CollectiveRecord>& out) {
    // Device records that arrived before their call was decoded.
    for (auto it = st.unmatched_device.begin(); it != st.unmatched_device.end();) {
      bool matched = false;
      for (auto& p : st.inflight) {
        if (!p.device && p.rec.tid == static_cast<uint32_t>(it->api_tid) && it->api_ns + 1000 >= p.rec.enter_ns &&
            it->api_ns <= p.rec.exit_ns + 1000) {
          p.rec.device_start_ns = it->start_ns;
          p.rec.device_end_ns = std::max(it->end_ns, it->start_ns);
          p.device = true;
          matched = true;
          break;
        }
      }
      it = matched ? st.unmatched_device.erase(it) : it + 1;
    }
    while (!st.inflight.empty()) {
      auto& p = st.inflight.front();
      bool host_sync = p.rec.library == "gloo";  // gloo calls block until the collective is done
      bool old = now > p.rec.exit_ns + 30 * kNs;
      if (!(p.device || host_sync || final || old || (p.sync_done_ns && !st.timeline))) break;
      store::CollectiveRecord r = p.rec;
      uint64_t done;
      if (p.device) {
        r.completion = "device";
        done = r.device_end_ns;
      } else if (host_sync) {
        r.completion = "host";
        done = r.exit_ns;
      } else if (p.sync_done_ns) {
        r.completion = "sync";
        done = p.sync_done_ns;
      } else {
        r.completion = "none";
        done = r.exit_ns;
      }
      CollectiveCall c;
      c.signature = r.op + ":" + std::to_string(r.bytes) + ":" + r.comm_id + ":" + std::to_string(r.peer);
      c.enter_ns = r.enter_ns;
      c.exit_ns = r.exit_ns;
      c.done_ns = done;
      c.device_ns = p.device ? r.device_end_ns - r.device_start_ns : 0;
      st.steps.add(std::move(c));
      r.enter_ns = to_unix(r.enter_ns);
      r.exit_ns = to_unix(r.exit_ns);
      r.device_start_ns = to_unix(r.device_start_ns);
      r.device_end_ns = to_unix(r.device_end_ns);
      if (env_.flight_recorder) env_.flight_recorder->add_collective(r);
      out.push_back(std::move(r));
      st.inflight.pop_front();
    }
  }

  // Device time inside a step, from this window's device records of that process.
  void fill_device_step(const ProcState& st, const DetectedStep& s, store::StepRecord& r) const {
    if (!st.timeline) return;
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    // Every record before the first whose max_end passes the step's start ended before the step.
    auto first = std::partition_point(st.recent_device.begin(), st.recent_device.end(),
                                      [&](const ProcState::Busy& d) { return d.max_end <= s.start_ns; });
    for (auto it = first; it != st.recent_device.end(); ++it) {
      const auto& d = *it;
      if (d.end <= s.start_ns || d.start >= s.end_ns) continue;
      uint64_t a = std::max(d.start, s.start_ns), b = std::min(d.end, s.end_ns);
      if (!d.collective) r.device_compute_ns += b - a;
      busy.emplace_back(a, b);
    }
    std::sort(busy.begin(), busy.end());
    uint64_t covered = 0, cur_a = 0, cur_b = 0;
    for (const auto& [a, b] : busy) {
      if (a > cur_b) {
        covered += cur_b - cur_a;
        cur_a = a;
        cur_b = b;
      } else {
        cur_b = std::max(cur_b, b);
      }
    }
    covered += cur_b - cur_a;
    uint64_t len = s.end_ns - s.start_ns;
    r.gpu_idle_ns = len > covered ? len - covered : 0;
    r.device_known = true;
  }

  static int on_event(void* ctx, void* data, size_t size) {
    auto* self = static_cast<GpuCommSource*>(ctx);
    // The raw record, for the capture: what replay decodes again (capture.h).
    if (self->tape().capturing()) self->api_batch_.str(std::string_view(static_cast<const char*>(data), size));
    if (size < sizeof(strata_api_event)) return 0;
    strata_api_event e;
    std::memcpy(&e, data, sizeof e);
    if (e.type != STRATA_EV_API) return 0;
    size_t need = sizeof e + e.ustack_len * sizeof(bpf_stack_build_id);
    if (need > size) return 0;  // lengths are checked, never trusted
    self->handle(e, static_cast<const uint8_t*>(data) + sizeof e);
    return 0;
  }

  void handle(const strata_api_event& e, const uint8_t* stack) {
    auto& st = proc(e.pid);
    auto& agg = api_window_[{e.pid, e.api}];
    agg.first += 1;
    agg.second += e.exit_ns > e.enter_ns ? e.exit_ns - e.enter_ns : 0;
    const __u64* a = e.args;
    switch (e.api) {
      case STRATA_API_NCCL_COMM_INIT_RANK:
      case STRATA_API_NCCL_COMM_INIT_RANK_CONFIG: {
        if (!(e.flags & STRATA_API_F_HAS_OUT) || e.ret != 0) return;
        CommState c;
        c.id = (e.flags & STRATA_API_F_HAS_ID) ? comm_id_of(e.nccl_id, sizeof e.nccl_id) : "";
        c.nranks = static_cast<int>(a[1]);
        c.rank = static_cast<int>(a[2]);  // rdx: the id (128 bytes) went on the stack
        st.comms[e.out] = c;
        new_comms_.push_back({e.pid, e.out, c.id, c.rank, c.nranks, e.exit_ns});
        return;
      }
      case STRATA_API_NCCL_COMM_INIT_ALL: {
        // (comm*, ndev, devlist): ndev ranks of one communicator in this process. No id is passed:
        // this process and its first handle name it.
        if (!(e.flags & (STRATA_API_F_HAS_OUT | STRATA_API_F_HAS_HANDLES)) || e.ret != 0) return;
        int ndev = static_cast<int>(a[1]);
        if (ndev < 1) return;
        uint64_t handles[kMaxInitAllHandles] = {e.out};
        size_t known = 1;
        if (e.flags & STRATA_API_F_HAS_HANDLES) {
          std::memcpy(handles, e.nccl_id, sizeof handles);
          known = std::min<size_t>(static_cast<size_t>(ndev), kMaxInitAllHandles);
        }
        uint8_t key[16];
        uint64_t pid = e.pid;
        std::memcpy(key, &pid, 8);
        std::memcpy(key + 8, &handles[0], 8);
        std::string id = comm_id_of(key, sizeof key);
        for (size_t i = 0; i < known; ++i) {
          if (handles[i] == 0) continue;
          CommState c;
          c.id = id;
          c.rank = static_cast<int>(i);
          c.nranks = ndev;
          st.comms[handles[i]] = c;
          new_comms_.push_back({e.pid, handles[i], c.id, c.rank, c.nranks, e.exit_ns});
        }
        return;
      }
      case STRATA_API_NCCL_COMM_SPLIT: {
        // (comm, color, key, newcomm*, config): every member of the parent calls it, in the same
        // order; those of one color form the new communicator. Its id: the parent's, which split
        // of it, and the color, the same on every member. Its position is not passed (NCCL orders
        // by key, then parent rank): left unknown (-1) for the diagnosis to place.
        if (e.ret != 0) return;
        auto parent = st.comms.find(a[0]);
        if (parent == st.comms.end()) return;
        uint64_t nth = ++parent->second.splits;  // counted on members that got no communicator too
        if (!(e.flags & STRATA_API_F_HAS_OUT) || e.out == 0 || parent->second.id.empty()) return;
        std::string key = parent->second.id + "/" + std::to_string(nth) + "/" + std::to_string(static_cast<int32_t>(a[1]));
        CommState c;
        c.id = comm_id_of(reinterpret_cast<const uint8_t*>(key.data()), key.size());
        st.comms[e.out] = c;
        new_comms_.push_back({e.pid, e.out, c.id, c.rank, c.nranks, e.exit_ns});
        return;
      }
      case STRATA_API_DL_STATE:
        st.maps_changed = true;
        return;
      case STRATA_API_NCCL_COMM_DESTROY:
        st.comms.erase(a[0]);
        return;
      case STRATA_API_CUDA_SET_DEVICE:
        if (e.ret == 0) st.device = static_cast<int>(a[0]);
        return;
      case STRATA_API_CUDA_STREAM_SYNCHRONIZE:
      case STRATA_API_CUDA_DEVICE_SYNCHRONIZE:
      case STRATA_API_CUDA_EVENT_SYNCHRONIZE:
        // Work enqueued before the sync started is done when it returns.
        for (auto& p : st.inflight) {
          bool same_stream = e.api != STRATA_API_CUDA_STREAM_SYNCHRONIZE || p.rec.stream == a[0];
          if (!p.sync_done_ns && same_stream && p.rec.exit_ns <= e.enter_ns) p.sync_done_ns = e.exit_ns;
        }
        return;
      case STRATA_API_CUDA_LAUNCH_KERNEL:
      case STRATA_API_CUDA_MEMCPY_ASYNC:
      case STRATA_API_CU_LAUNCH_KERNEL:
      case STRATA_API_CU_LAUNCH_KERNEL_EX:
        on_launch(st, e, stack);
        return;
      case STRATA_API_CU_MODULE_GET_FUNCTION:  // (CUfunction* out, CUmodule, name)
      case STRATA_API_CU_LIBRARY_GET_KERNEL:   // (CUkernel* out, CUlibrary, name): launchable as is
        if (e.ret == 0 && (e.flags & STRATA_API_F_HAS_OUT) && (e.flags & STRATA_API_F_HAS_NAME))
          name_driver_function(st, e.out, e.nccl_id);
        return;
      case STRATA_API_CU_FUNC_GET_NAME:    // (const char** name, CUfunction)
      case STRATA_API_CU_KERNEL_GET_NAME:  // (const char** name, CUkernel)
        if (e.ret == 0 && (e.flags & STRATA_API_F_HAS_NAME)) name_driver_function(st, a[1], e.nccl_id);
        return;
      case STRATA_API_CU_KERNEL_GET_FUNCTION: {  // (CUfunction* out, CUkernel): the kernel's name
        auto named = st.driver_names.find(a[1]);
        if (e.ret == 0 && (e.flags & STRATA_API_F_HAS_OUT) && named != st.driver_names.end()) {
          std::string name = named->second;  // copied: the insert may move the table
          name_driver_function(st, e.out, reinterpret_cast<const uint8_t*>(name.c_str()));
        }
        return;
      }
      case STRATA_API_CUDA_MALLOC:
      case STRATA_API_CUDA_FREE:
      case STRATA_API_CUDA_MEMCPY:
      case STRATA_API_CU_MEM_ALLOC:
      case STRATA_API_CU_MEM_FREE:
        on_memory(e, stack);
        return;
      default:
        break;
    }
    if (!api_is_collective(e.api)) return;
    PendingCollective p;
    auto& r = p.rec;
    r.pid = e.pid;
    r.tid = e.tid;
    r.op = api_collective_op(e.api);
    r.enter_ns = e.enter_ns;
    r.exit_ns = e.exit_ns;
    r.ret = static_cast<int>(e.ret);
    if (e.api >= STRATA_API_GLOO_ALLREDUCE) {
      r.library = "gloo";
      r.seq = ++st.gloo_seq[e.api];
      r.ret = 0;  // gloo's functions return void
    } else {
      r.library = "nccl";
      uint64_t comm = 0;
      // Argument positions per the NCCL 2.28 signatures (nccl.h).
      switch (e.api) {
        case STRATA_API_NCCL_ALLREDUCE:
        case STRATA_API_NCCL_REDUCESCATTER:  // (send, recv, count, dtype, op, comm, stream)
          r.count = a[2]; r.dtype = static_cast<int>(a[3]); r.redop = static_cast<int>(a[4]);
          comm = a[5]; r.stream = a[6];
          break;
        case STRATA_API_NCCL_ALLGATHER:  // (send, recv, sendcount, dtype, comm, stream)
          r.count = a[2]; r.dtype = static_cast<int>(a[3]); comm = a[4]; r.stream = a[5];
          break;
        case STRATA_API_NCCL_BROADCAST:  // (send, recv, count, dtype, root, comm, stream)
          r.count = a[2]; r.dtype = static_cast<int>(a[3]); r.peer = static_cast<int>(a[4]);
          comm = a[5]; r.stream = a[6];
          break;
        case STRATA_API_NCCL_REDUCE:  // (send, recv, count, dtype, op, root, comm, stream)
          r.count = a[2]; r.dtype = static_cast<int>(a[3]); r.redop = static_cast<int>(a[4]);
          r.peer = static_cast<int>(a[5]); comm = a[6]; r.stream = a[7];
          break;
        case STRATA_API_NCCL_SEND:
        case STRATA_API_NCCL_RECV:  // (buf, count, dtype, peer, comm, stream)
          r.count = a[1]; r.dtype = static_cast<int>(a[2]); r.peer = static_cast<int>(a[3]);
          comm = a[4]; r.stream = a[5];
          break;
      }
      r.bytes = r.count * nccl_dtype_size(r.dtype);
      r.comm_handle = comm;
      auto it = st.comms.find(comm);
      if (it != st.comms.end()) {
        r.comm_id = it->second.id;
        r.seq = ++it->second.seq;
      } else {
        // A communicator created before we attached: sequence numbers count from here.
        auto& c = st.comms[comm];
        r.seq = ++c.seq;
      }
    }
    st.inflight.push_back(std::move(p));
  }

  struct LaunchKey {
    uint32_t pid, tid;
    std::string kernel;
    uint32_t stack;
    bool operator<(const LaunchKey& o) const {
      return std::tie(pid, tid, kernel, stack) < std::tie(o.pid, o.tid, o.kernel, o.stack);
    }
  };

  void on_launch(ProcState& st, const strata_api_event& e, const uint8_t* stack) {
    ++launch_hits_;
    ++burst_hits_;
    std::string kernel;
    if (e.api == STRATA_API_CUDA_MEMCPY_ASYNC) {
      kernel = "[memcpy]";
    } else if (e.api == STRATA_API_CU_LAUNCH_KERNEL || e.api == STRATA_API_CU_LAUNCH_KERNEL_EX) {
      ++driver_launch_hits_;
      // cuLaunchKernel(f, ...), cuLaunchKernelEx(config, f, ...)
      kernel = driver_kernel_name(st, e.api == STRATA_API_CU_LAUNCH_KERNEL ? e.args[0] : e.args[1]);
    } else {
      kernel = kernel_name(st, e.args[0], "");
    }
    add_launch_sample(e, stack, kernel);
  }

  // The most CUfunction names kept per process: Triton compiles a few thousand kernels at most;
  // past this, launches of the others are named by the device timeline (or by handle).
  static constexpr size_t kMaxDriverNames = 1 << 16;

  void name_driver_function(ProcState& st, uint64_t func, const uint8_t* raw) {
    if (func == 0) return;
    // Lengths are never trusted: the name ends at its NUL or at the end of the field.
    size_t n = strnlen(reinterpret_cast<const char*>(raw), STRATA_NCCL_ID_BYTES);
    if (n == 0) return;
    if (st.driver_names.size() >= kMaxDriverNames && !st.driver_names.count(func)) return;
    auto [it, inserted] = st.driver_names.insert_or_assign(func, std::string(reinterpret_cast<const char*>(raw), n));
    (void)it;
    if (inserted) ++driver_functions_named_;
  }

  // A driver launch's kernel: the name its handle was looked up by, else the one the device timeline
  // gave it, else the handle.
  std::string driver_kernel_name(const ProcState& st, uint64_t func) const {
    if (auto it = st.driver_names.find(func); it != st.driver_names.end()) return it->second;
    if (auto it = st.kernel_names.find(func); it != st.kernel_names.end()) return it->second;
    return "CUfunction@0x" + hex_addr(func);
  }

  // A memory call: counted and timed with every API call (api_window_); its size, and its stack
  // when the probe took one (during a burst).
  void on_memory(const strata_api_event& e, const uint8_t* stack) {
    ++memory_hits_;
    if (memory_sampled_) ++memory_burst_hits_;  // its own bursts' rate sizes their gaps
    const __u64* a = e.args;
    uint64_t bytes = 0;
    switch (e.api) {
      case STRATA_API_CUDA_MALLOC:
      case STRATA_API_CU_MEM_ALLOC: bytes = a[1]; break;  // (out*, size)
      case STRATA_API_CUDA_MEMCPY: bytes = a[2]; break;   // (dst, src, count, kind)
      default: break;
    }
    if (e.ret == 0 && bytes > 0) api_bytes_[{e.pid, e.api}] += bytes;
    if (e.ustack_len == 0) return;
    ++memory_stacks_;
    add_launch_sample(e, stack, std::string("[") + api_name(e.api) + "]");
  }

  void add_launch_sample(const strata_api_event& e, const uint8_t* stack, const std::string& kernel) {
    SampleEvent se;
    se.pid = e.pid;
    se.tid = e.tid;
    for (unsigned i = 0; i < e.ustack_len; ++i) {
      bpf_stack_build_id f;
      std::memcpy(&f, stack + i * sizeof f, sizeof f);
      if (f.status == BPF_STACK_BUILD_ID_EMPTY) break;
      RawUserFrame u;
      u.has_build_id = f.status == BPF_STACK_BUILD_ID_VALID;
      if (u.has_build_id) std::memcpy(u.build_id.data(), f.build_id, u.build_id.size());
      u.offset_or_ip = u.has_build_id ? f.offset : f.ip;
      se.ustack.push_back(u);
    }
    Stack s;
    if (env_.normalizer) env_.normalizer->normalize(se, s);
    std::string key;
    for (const auto& f : s) key += f.build_id + f.module + std::to_string(f.offset) + ";";
    auto [it, inserted] = launch_stack_index_.emplace(key, static_cast<uint32_t>(launch_stacks_.size()));
    if (inserted) launch_stacks_.push_back(std::move(s));
    launch_window_[LaunchKey{e.pid, e.tid, kernel, it->second}] += 1;
  }

  GpuCommOptions opts_;
  SourceEnv env_;
  gpu_comm_bpf* skel_ = nullptr;
  ring_buffer* ring_ = nullptr;
  ByteWriter api_batch_;  // this drain's raw records, when capturing
  int64_t mono_to_unix_ = 0;
  std::unique_ptr<symbolize::Symbolizer> symbolizer_ = symbolize::make_caching_symbolizer();

  std::map<uint32_t, ProcState> procs_;
  std::map<std::string, AttachedFile> files_;          // by dev:inode
  std::map<std::string, std::string> file_paths_;
  ForgetfulSet<std::string> rejected_{kMaxRejectedFiles};  // files that are no runtime, by dev:inode
  std::map<uint32_t, std::set<std::string>> st_files_; // pid -> file keys

  std::vector<store::CommunicatorRecord> new_comms_;
  // This window's device records, names interned in device_names_ (index), until the flush.
  struct DeviceRecord {
    uint32_t pid = 0;
    int device = 0;
    uint32_t kind = 0;  // enum strata_timeline_kind
    uint32_t name = 0;  // index into device_names_
    uint32_t api_tid = 0;
    uint64_t stream = 0;
    uint64_t start_ns = 0, end_ns = 0, api_ns = 0;  // CLOCK_MONOTONIC
    uint64_t correlation = 0;
    uint64_t bytes = 0;
  };
  std::vector<DeviceRecord> device_window_;
  std::vector<std::unique_ptr<std::string>> device_names_;            // stable addresses: viewed below
  std::unordered_map<std::string_view, uint32_t> device_name_ids_;
  std::map<std::pair<uint32_t, uint32_t>, std::pair<uint64_t, uint64_t>> api_window_;  // calls, ns
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> api_bytes_;                         // memory calls' bytes
  std::map<LaunchKey, uint64_t> launch_window_;
  std::vector<Stack> launch_stacks_;
  std::unordered_map<std::string, uint32_t> launch_stack_index_;

  bool multi_ = false;
  bool in_burst_ = false;
  uint64_t next_burst_ = 0, burst_start_ = 0, burst_end_ = 0, burst_hits_ = 0;
  uint64_t bursts_ = 0, launch_hits_ = 0, attach_errors_ = 0;
  uint64_t driver_launch_hits_ = 0, driver_functions_named_ = 0;
  uint64_t memory_hits_ = 0, memory_stacks_ = 0;
  bool memory_sampled_ = false;  // memory probes past their budget: burst-only from then on
  uint64_t memory_rate_since_ = 0, memory_hits_at_ = 0;
  // The memory probes' on-time in the current window (api.memory_coverage): since when they are on
  // (always before they are sampled, during bursts after), and the time they were on before that.
  uint64_t memory_window_start_ = 0, memory_on_since_ = 0, memory_probed_ns_ = 0;
  bool memory_burst_on_ = false;  // sampled memory probes attached now
  uint64_t next_memory_burst_ = 0, memory_burst_end_ = 0, memory_on_since_burst_ = 0, memory_burst_hits_ = 0;
  uint64_t timeline_lost_ = 0, device_records_summarized_ = 0;
  uint64_t timelines_removed_ = 0;  // files of exited processes removed after their last read
  uint64_t timelines_refused_ = 0;  // processes whose timeline file was refused (abi/gpu_timeline.h)
};

}  // namespace

Result<std::unique_ptr<Source>> start_gpu_comm_source(const GpuCommOptions& opts, const SourceEnv& env) {
  auto s = std::make_unique<GpuCommSource>(opts, env);
  if (auto st = s->init(); !st) return st.error();
  return std::unique_ptr<Source>(std::move(s));
}

std::unique_ptr<Source> replay_gpu_comm_source(const GpuCommOptions& opts, const SourceEnv& env) {
  auto s = std::make_unique<GpuCommSource>(opts, env);
  s->init_replay();
  return s;
}

}  // namespace strata::agent
