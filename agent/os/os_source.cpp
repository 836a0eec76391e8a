#include "agent/os/os_source.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "abi/offcpu.h"
#include "abi/os.h"
#include "agent/bpf_stats.h"
#include "agent/capture.h"
#include "agent/cost_budget.h"
#include "agent/libbpf_log.h"
#include "agent/normalizer.h"
#include "agent/os/cgroup.h"
#include "agent/os/offcpu_aggregator.h"
#include "agent/os/os_metrics.h"
#include "agent/os/proc_readers.h"
#include "agent/process_info.h"
#include "bpf/offcpu.skel.h"
#include "bpf/os.skel.h"
#include "symbolize/symbolizer.h"

namespace strata::agent::os {
namespace {

uint64_t env_u64(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  unsigned long long n = std::strtoull(v, &end, 10);
  return end && *end == 0 ? n : fallback;
}

uint32_t ringbuf_size(uint32_t per_cpu) {
  int ncpus = libbpf_num_possible_cpus();
  uint64_t want = static_cast<uint64_t>(per_cpu) * static_cast<uint64_t>(ncpus > 0 ? ncpus : 1);
  uint32_t size = 1u << 20;  // a power of two, as the kernel requires
  while (size < want && size < (1u << 28)) size <<= 1;
  return size;
}

// The tracepoint behind a "tp_btf/NAME" program exists in this kernel (its BTF has btf_trace_NAME).
bool tracepoint_exists(const btf* vmlinux, const char* section) {
  const char* slash = std::strchr(section, '/');
  if (!vmlinux || !slash) return true;  // cannot tell: let the load say
  std::string type = std::string("btf_trace_") + (slash + 1);
  return btf__find_by_name_kind(vmlinux, type.c_str(), BTF_KIND_TYPEDEF) >= 0;
}

// Where __schedule lies in the kernel text: off-CPU kernel stacks are cut to start there, whatever
// frames of BPF and tracepoint glue the kernel's walk put above it (their number differs between
// kernels and with how the program was compiled). {0, 0} when unknown.
std::pair<uint64_t, uint64_t> schedule_text_range() {
  auto kallsyms = symbolize::Kallsyms::shared();
  auto range = kallsyms ? kallsyms->range_of("__schedule") : std::nullopt;
  return range ? *range : std::pair<uint64_t, uint64_t>{0, 0};
}

bool process_alive(uint32_t pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

// What the OS layer reads of the machine besides its ring buffer, through the tape
// (agent/capture.h): live it is read (and written to a capture); in replay it comes from the
// capture, in the order the live run read it. Each read is one kOsRead record: the read's kind, the
// pid it is about (0: the node), then its answer.
enum class OsRead : uint8_t {
  kScheduleRange = 1, kFaults = 2, kCgroup = 3, kCgroupOf = 4, kSockets = 5, kTcpLinks = 6, kAlive = 7,
  kIrqNames = 8, kNodeMaps = 9, kProcMaps = 10,
};

// A process's cpu.stat and the cgroup it belongs to (read_cgroup).
struct CgroupReading {
  std::optional<CpuStat> stat;
  std::string cgroup;
};

// The whole node's maps of one window: IRQ time by process, CPU neighbours and retransmits.
struct NodeMaps {
  std::map<uint32_t, std::map<std::pair<uint16_t, uint16_t>, uint64_t>> irq;
  std::vector<Neighbour> neighbours;
  std::map<uint64_t, uint64_t> retrans;  // socket inode -> segments
};

// A process's kernel-side counters.
struct ProcMaps {
  std::optional<strata_sched_stats> sched;
  std::optional<strata_os_stats> os;
};

// A kernel struct as its bytes: the capture is read by the same build that the ABI headers made.
template <typename T>
void put_pod(ByteWriter& w, const std::optional<T>& v) {
  w.u8(v ? 1 : 0);
  if (v) w.str(std::string_view(reinterpret_cast<const char*>(&*v), sizeof(T)));
}
template <typename T>
void get_pod(ByteReader& r, std::optional<T>& v) {
  if (!r.u8()) return;
  std::string b = r.str();
  if (b.size() != sizeof(T)) {
    (void)r.bytes(r.left() + 1);  // a size this build does not know: the record is corrupt
    return;
  }
  T t;
  std::memcpy(&t, b.data(), sizeof(T));
  v = t;
}

void put(ByteWriter& w, const std::pair<uint64_t, uint64_t>& v) { w.u64(v.first), w.u64(v.second); }
void get(ByteReader& r, std::pair<uint64_t, uint64_t>& v) { v.first = r.u64(), v.second = r.u64(); }
void put(ByteWriter& w, const std::optional<Faults>& v) {
  w.u8(v ? 1 : 0);
  if (v) w.u64(v->minor), w.u64(v->major);
}
void get(ByteReader& r, std::optional<Faults>& v) {
  if (r.u8()) v = Faults{r.u64(), r.u64()};
}
void put(ByteWriter& w, const CgroupReading& v) {
  w.u8(v.stat ? 1 : 0);
  if (v.stat) w.u64(v.stat->nr_periods), w.u64(v.stat->nr_throttled), w.u64(v.stat->throttled_us), w.u8(v.stat->has_throttling);
  w.str(v.cgroup);
}
void get(ByteReader& r, CgroupReading& v) {
  if (r.u8()) {
    CpuStat c;
    c.nr_periods = r.u64(), c.nr_throttled = r.u64(), c.throttled_us = r.u64(), c.has_throttling = r.u8() != 0;
    v.stat = c;
  }
  v.cgroup = r.str();
}
void put(ByteWriter& w, const std::string& v) { w.str(v); }
void get(ByteReader& r, std::string& v) { v = r.str(); }
void put(ByteWriter& w, bool v) { w.u8(v ? 1 : 0); }
void get(ByteReader& r, bool& v) { v = r.u8() != 0; }
void put(ByteWriter& w, const std::map<int, uint64_t>& v) {
  w.u32(static_cast<uint32_t>(v.size()));
  for (const auto& [fd, ino] : v) w.u32(static_cast<uint32_t>(fd)), w.u64(ino);
}
void get(ByteReader& r, std::map<int, uint64_t>& v) {
  for (uint32_t n = r.u32(); r.ok() && n > 0; --n) {
    int fd = static_cast<int>(r.u32());
    v[fd] = r.u64();
  }
}
// The links, then each one's busy time in the same order: a block of its own after them, so
// captures made before it was read (which end after the links) replay as they did, with no busy time.
void put(ByteWriter& w, const std::vector<TcpLink>& v) {
  w.u32(static_cast<uint32_t>(v.size()));
  for (const auto& l : v) w.str(l.local), w.str(l.remote), w.u64(l.srtt_us), w.u64(l.bytes_acked), w.u64(l.bytes_received);
  w.u32(static_cast<uint32_t>(v.size()));
  for (const auto& l : v) w.u64(l.busy_us);
}
void get(ByteReader& r, std::vector<TcpLink>& v) {
  for (uint32_t n = r.u32(); r.ok() && n > 0; --n) {
    TcpLink l;
    l.local = r.str(), l.remote = r.str();
    l.srtt_us = r.u64(), l.bytes_acked = r.u64(), l.bytes_received = r.u64();
    v.push_back(std::move(l));
  }
  if (r.ok() && !r.at_end()) {
    uint32_t n = r.u32();
    for (uint32_t i = 0; r.ok() && i < n; ++i) {
      uint64_t busy = r.u64();
      if (i < v.size()) v[i].busy_us = busy;
    }
  }
}
void put(ByteWriter& w, const std::map<unsigned, std::string>& v) {
  w.u32(static_cast<uint32_t>(v.size()));
  for (const auto& [irq, name] : v) w.u32(irq), w.str(name);
}
void get(ByteReader& r, std::map<unsigned, std::string>& v) {
  for (uint32_t n = r.u32(); r.ok() && n > 0; --n) {
    unsigned irq = r.u32();
    v[irq] = r.str();
  }
}
void put(ByteWriter& w, const NodeMaps& v) {
  w.u32(static_cast<uint32_t>(v.irq.size()));
  for (const auto& [tgid, by] : v.irq) {
    w.u32(tgid), w.u32(static_cast<uint32_t>(by.size()));
    for (const auto& [kv, ns] : by) w.u32(kv.first), w.u32(kv.second), w.u64(ns);
  }
  w.u32(static_cast<uint32_t>(v.neighbours.size()));
  for (const auto& n : v.neighbours) w.u32(n.cpu), w.u32(n.tgid), w.str(n.comm), w.u64(n.run_ns);
  w.u32(static_cast<uint32_t>(v.retrans.size()));
  for (const auto& [ino, segs] : v.retrans) w.u64(ino), w.u64(segs);
}
void get(ByteReader& r, NodeMaps& v) {
  for (uint32_t n = r.u32(); r.ok() && n > 0; --n) {
    auto& by = v.irq[r.u32()];
    for (uint32_t m = r.u32(); r.ok() && m > 0; --m) {
      auto kind = static_cast<uint16_t>(r.u32());
      auto vec = static_cast<uint16_t>(r.u32());
      by[{kind, vec}] = r.u64();
    }
  }
  for (uint32_t n = r.u32(); r.ok() && n > 0; --n) {
    Neighbour nb;
    nb.cpu = r.u32(), nb.tgid = r.u32(), nb.comm = r.str(), nb.run_ns = r.u64();
    v.neighbours.push_back(std::move(nb));
  }
  for (uint32_t n = r.u32(); r.ok() && n > 0; --n) {
    uint64_t ino = r.u64();
    v.retrans[ino] = r.u64();
  }
}
void put(ByteWriter& w, const ProcMaps& v) { put_pod(w, v.sched), put_pod(w, v.os); }
void get(ByteReader& r, ProcMaps& v) { get_pod(r, v.sched), get_pod(r, v.os); }

class OsLayerSource final : public Source {
 public:
  OsLayerSource(const OsLayerOptions& opts, Normalizer& normalizer, Tape& tape)
      : opts_(opts), tape_(tape), agg_(normalizer) {}

  // Replay (agent/capture.h): no BPF; the ring buffer's drains and every read come from the tape.
  void init_replay() { schedule_ = taped(OsRead::kScheduleRange, 0, schedule_text_range); }

  ~OsLayerSource() override {
    ring_buffer__free(ring_);
    offcpu_bpf__destroy(sched_);
    os_bpf__destroy(os_);
    if (stats_fd_ >= 0) close(stats_fd_);
  }

  Status init(int target_bits_fd) {
    setup_libbpf_logging();
    sched_ = offcpu_bpf__open();
    if (!sched_) return Error::from_errno("cannot open the off-CPU BPF program", errno);
    sched_->rodata->capture_stacks = opts_.offcpu;
    sched_->rodata->sched_metrics = opts_.os;
    sched_->rodata->min_block_ns = opts_.min_block_us * 1000;
    sched_->rodata->max_events_per_sec = opts_.max_events_per_sec;
    sched_->rodata->max_captures_per_sec = opts_.max_captures_per_sec;
    sched_->data->capture_target_per_sec = std::max<uint32_t>(1, opts_.capture_target_per_sec);
    sched_->rodata->explore_per_sec = opts_.explore_per_sec;
    schedule_ = taped(OsRead::kScheduleRange, 0, schedule_text_range);
    sched_->rodata->snapshot_pages = opts_.snapshot_pages;
    sched_->rodata->max_snapshots_per_sec = opts_.max_snapshots_per_sec;
    uint32_t slots = 1;  // a power of two
    while (slots < opts_.snapshot_slots && slots < (1u << 16)) slots <<= 1;
    sched_->rodata->pool_mask = slots - 1;
    bpf_map__set_max_entries(sched_->maps.snap_pool, slots);
    bpf_map__set_max_entries(sched_->maps.events, ringbuf_size(opts_.ringbuf_bytes_per_cpu));
    bpf_map__set_max_entries(sched_->maps.sched_stats, opts_.max_processes);
    if (target_bits_fd >= 0 && bpf_map__reuse_fd(sched_->maps.target_bits, target_bits_fd) != 0)
      return Error::from_errno("cannot share the bitmap of watched processes", errno);
    if (int err = offcpu_bpf__load(sched_); err)
      return Error::from_errno("cannot load the off-CPU BPF program (see the libbpf messages above)", -err);
    if (int err = offcpu_bpf__attach(sched_); err)
      return Error::from_errno("cannot attach to tp_btf/sched_switch", -err);
    if (opts_.offcpu) {
      ring_ = ring_buffer__new(bpf_map__fd(sched_->maps.events), &OsLayerSource::on_event, this, nullptr);
      if (!ring_) return Error::from_errno("cannot open the off-CPU ring buffer", errno);
    }
    if (opts_.os) {
      if (auto st = init_os(target_bits_fd); !st) return st;
    }
    stats_fd_ = bpf_enable_stats(BPF_STATS_RUN_TIME);
    return {};
  }

  Status init_os(int target_bits_fd) {
    os_ = os_bpf__open();
    if (!os_) return Error::from_errno("cannot open the OS-event BPF program", errno);
    bpf_map__set_max_entries(os_->maps.os_stats, opts_.max_processes);
    if (target_bits_fd >= 0 && bpf_map__reuse_fd(os_->maps.target_bits, target_bits_fd) != 0)
      return Error::from_errno("cannot share the bitmap of watched processes", errno);
    // Tracepoints differ between kernels (block_io_start is 6.5+): probe, never infer from versions.
    btf* vmlinux = btf__load_vmlinux_btf();
    for (bpf_program* p = bpf_object__next_program(os_->obj, nullptr); p; p = bpf_object__next_program(os_->obj, p)) {
      if (!tracepoint_exists(vmlinux, bpf_program__section_name(p))) {
        bpf_program__set_autoload(p, false);
        missing_.push_back(bpf_program__section_name(p));
      }
    }
    btf__free(vmlinux);
    if (int err = os_bpf__load(os_); err)
      return Error::from_errno("cannot load the OS-event BPF program (see the libbpf messages above)", -err);
    if (int err = os_bpf__attach(os_); err) return Error::from_errno("cannot attach the OS-event tracepoints", -err);
    return {};
  }

  std::string name() const override {
    return opts_.offcpu && opts_.os ? "offcpu+os" : opts_.offcpu ? "offcpu" : "os";
  }

  void on_process(const store::ProcessInfo& p) override {
    pids_.insert(p.pid);
    if (!opts_.os || last_.count(p.pid)) return;
    // /proc and cgroup counters count from here; the kernel maps count from zero anyway.
    ProcSnapshot& s = last_[p.pid];
    s.faults = faults(p.pid);
    read_cgroup(p.pid, s);
  }

  void on_process_exit(uint32_t pid) override { exited_.insert(pid); }

  int wake_fd() const override { return ring_ ? ring_buffer__epoll_fd(ring_) : -1; }

  Status poll() override {
    if (opts_.os) {
      follow_cgroup_moves();
      follow_tcp_links();
    }
    if (!opts_.offcpu) return {};
    if (tape_.replaying()) {
      auto rec = tape_.next(CaptureKind::kOffCpuPoll);
      if (!rec) return {};
      ByteReader r(*rec);
      while (r.ok() && r.left() > 0) {
        std::string raw = r.str();
        if (!r.ok()) break;
        decode(reinterpret_cast<const uint8_t*>(raw.data()), raw.size());
      }
      if (!r.ok()) tape_.fail("corrupt off-CPU record");
      return {};
    }
    if (!ring_) return {};
    int n = ring_buffer__consume(ring_);
    if (tape_.capturing()) tape_.put(CaptureKind::kOffCpuPoll, drained_.take());
    drained_ = ByteWriter();
    if (n < 0 && n != -EINTR) return Error::from_errno("reading the off-CPU ring buffer", -n);
    return {};
  }

  // A process that moves to another cgroup (a container runtime, a job launcher, the testbed's
  // faults) is rebased on its new cgroup's counters within a second, so the window it moved in
  // counts the throttling after the move (comparing counters of two cgroups would give nothing).
  void follow_cgroup_moves() {
    uint64_t now = tape_.mono_ns();
    if (now - last_cgroup_check_ns_ < kCgroupCheckNs) return;
    last_cgroup_check_ns_ = now;
    for (auto& [pid, snap] : last_) {
      if (exited_.count(pid)) continue;
      std::string cg = taped(OsRead::kCgroupOf, pid, [&] { return cgroups_.cgroup_of(pid); });
      if (!cg.empty() && cg != snap.cgroup) read_cgroup(pid, snap);
    }
  }

  // Each watched process's TCP connections, every 2 s: a rank that exits before its window closes
  // (the end of a job) still has the connections it last had.
  void follow_tcp_links() {
    uint64_t now = tape_.mono_ns();
    if (now - last_tcp_check_ns_ < kTcpCheckNs) return;
    last_tcp_check_ns_ = now;
    for (uint32_t pid : pids_) {
      if (exited_.count(pid)) continue;
      auto links = tcp_links(pid, sockets(pid));
      if (!links.empty()) tcp_latest_[pid] = std::move(links);
    }
  }

  Status flush(store::Writer& store, const WindowContext& w) override {
    if (auto st = poll(); !st) return st;
    if (opts_.offcpu) {
      if (auto st = agg_.flush(store, w.recording, w.start_ns, w.end_ns); !st) return st;
    }
    if (opts_.os) {
      auto metrics = collect_metrics();
      if (!metrics.empty()) {
        if (auto st = store.put_metrics(w.recording, w.start_ns, w.end_ns, metrics); !st) return st;
      }
    }
    forget_exited();
    return {};
  }

  void stats(std::vector<std::pair<std::string, double>>& out) const override {
    uint64_t c[STRATA_OFFCPU_CNT__COUNT] = {};
    int ncpus = libbpf_num_possible_cpus();
    std::vector<strata_offcpu_cpu_state> per_cpu(ncpus > 0 ? ncpus : 1);
    uint32_t zero = 0;
    if (sched_ && bpf_map__lookup_elem(sched_->maps.cpu_states, &zero, sizeof(zero), per_cpu.data(),
                             per_cpu.size() * sizeof(per_cpu[0]), 0) == 0) {
      for (const auto& s : per_cpu)
        for (int i = 0; i < STRATA_OFFCPU_CNT__COUNT; ++i) c[i] += s.counters[i];
    }
    auto d = [](uint64_t v) { return static_cast<double>(v); };
    if (opts_.offcpu) {
      out.push_back({"offcpu_blocks", d(c[STRATA_OFFCPU_CNT_BLOCKS])});
      out.push_back({"offcpu_long_blocks", d(c[STRATA_OFFCPU_CNT_LONG])});
      out.push_back({"offcpu_events", d(c[STRATA_OFFCPU_CNT_EMITTED])});
      out.push_back({"offcpu_ringbuf_drops", d(c[STRATA_OFFCPU_CNT_RINGBUF_DROP])});
      out.push_back({"offcpu_rate_limited", d(c[STRATA_OFFCPU_CNT_RATE_LIMITED])});
      out.push_back({"offcpu_captures", d(c[STRATA_OFFCPU_CNT_CAPTURES])});
      out.push_back({"offcpu_capture_skipped", d(c[STRATA_OFFCPU_CNT_CAPTURE_SKIPPED])});
      out.push_back({"offcpu_sampled_out", d(c[STRATA_OFFCPU_CNT_SAMPLED_OUT])});
      out.push_back({"offcpu_bare_sampled_out", d(c[STRATA_OFFCPU_CNT_BARE_SAMPLED_OUT])});
      out.push_back({"offcpu_no_user_stack", d(c[STRATA_OFFCPU_CNT_NO_USER_STACK])});
      out.push_back({"offcpu_snapshots", d(c[STRATA_OFFCPU_CNT_SNAPSHOTS])});
      out.push_back({"offcpu_snapshot_skipped", d(c[STRATA_OFFCPU_CNT_SNAPSHOT_SKIPPED])});
      out.push_back({"offcpu_snapshot_lost", d(c[STRATA_OFFCPU_CNT_SNAPSHOT_LOST])});
      out.push_back({"offcpu_snapshot_sent", d(c[STRATA_OFFCPU_CNT_SNAPSHOT_SENT])});
      out.push_back({"offcpu_snapshot_dropped", d(c[STRATA_OFFCPU_CNT_SNAPSHOT_DROPPED])});
      out.push_back({"offcpu_stored_us", d(agg_.stored_us())});
    }
    out.push_back({"offcpu_storage_failures", d(c[STRATA_OFFCPU_CNT_STORAGE_FAIL])});
    if (opts_.os) out.push_back({"os_neighbours_full", d(c[STRATA_OFFCPU_CNT_NEIGHBOURS_FULL])});
    if (os_) {
      uint64_t oc[STRATA_OS_CNT__COUNT] = {};
      std::vector<uint64_t> v(ncpus > 0 ? ncpus : 1);
      for (uint32_t k = 0; k < STRATA_OS_CNT__COUNT; ++k) {
        if (bpf_map__lookup_elem(os_->maps.counters, &k, sizeof(k), v.data(), v.size() * sizeof(uint64_t), 0) == 0)
          for (auto x : v) oc[k] += x;
      }
      out.push_back({"os_map_full", d(oc[STRATA_OS_CNT_IRQ_FULL] + oc[STRATA_OS_CNT_STATS_FULL] +
                                      oc[STRATA_OS_CNT_BIO_FULL] + oc[STRATA_OS_CNT_RETRANS_FULL])});
      out.push_back({"os_missing_tracepoints", d(missing_.size())});
    }
    const BpfRunTime run = run_time();
    out.push_back({"os_bpf_run_s", static_cast<double>(run.ns) / 1e9});
    out.push_back({"os_bpf_runs", d(run.runs)});
  }

  uint64_t kernel_cost_ns() const override { return run_time().ns; }

  // Each level halves the stack captures a CPU takes before sampling them (CostBudget::scaled_at):
  // blocked time stays whole (weighted), its stacks get fewer.
  void set_cost_level(int level) override {
    if (!sched_ || !sched_->data) return;
    sched_->data->capture_target_per_sec = CostBudget::scaled_at(level, opts_.capture_target_per_sec);
  }

 private:
  BpfRunTime run_time() const {
    BpfRunTime t = bpf_run_time(sched_ ? sched_->obj : nullptr);
    BpfRunTime o = bpf_run_time(os_ ? os_->obj : nullptr);
    return {t.ns + o.ns, t.runs + o.runs};
  }

  static int on_event(void* ctx, void* data, size_t size) {
    auto* self = static_cast<OsLayerSource*>(ctx);
    if (self->tape_.capturing()) self->drained_.str(std::string_view(static_cast<const char*>(data), size));
    self->decode(static_cast<const uint8_t*>(data), size);
    return 0;
  }

  // One read of the machine, through the tape (OsRead above).
  template <typename Live>
  auto taped(OsRead what, uint32_t pid, Live live) -> std::remove_cvref_t<decltype(live())> {
    using T = std::remove_cvref_t<decltype(live())>;
    if (tape_.replaying()) {
      T v{};
      auto rec = tape_.next(CaptureKind::kOsRead);
      if (!rec) return v;  // the tape says what ran out
      ByteReader r(*rec);
      if (r.u8() != static_cast<uint8_t>(what) || r.u32() != pid) {
        tape_.fail("the capture's next OS-layer read is another than read " + std::to_string(static_cast<int>(what)) +
                   " of pid " + std::to_string(pid) + " (this pipeline reads differently from the one that made it)");
        return v;
      }
      get(r, v);
      if (!r.at_end()) tape_.fail("corrupt OS-layer read");
      return v;
    }
    T v = live();
    if (tape_.capturing()) {
      ByteWriter w;
      w.u8(static_cast<uint8_t>(what));
      w.u32(pid);
      put(w, v);
      tape_.put(CaptureKind::kOsRead, w.data());
    }
    return v;
  }

  std::optional<Faults> faults(uint32_t pid) {
    return taped(OsRead::kFaults, pid, [&] { return read_faults(pid); });
  }
  std::map<int, uint64_t> sockets(uint32_t pid) {
    return taped(OsRead::kSockets, pid, [&] { return socket_fds(pid); });
  }
  std::vector<TcpLink> tcp_links(uint32_t pid, const std::map<int, uint64_t>& sockets) {
    return taped(OsRead::kTcpLinks, pid, [&] { return read_tcp_links(pid, sockets); });
  }

  void decode(const uint8_t* data, size_t size) {
    if (size < sizeof(strata_offcpu_event)) return;
    strata_offcpu_event hdr;
    std::memcpy(&hdr, data, sizeof(hdr));
    if (hdr.type != STRATA_OFFCPU_EV_BLOCK) return;
    size_t frames = sizeof(hdr) + hdr.kstack_len * sizeof(uint64_t) + hdr.ustack_len * sizeof(uint64_t);
    bool snapshot = (hdr.flags & STRATA_OFFCPU_F_SNAPSHOT) != 0;
    size_t need = frames + (snapshot ? hdr.stack_len : 0);
    if (need > size) return;  // never trust a length
    SampleEvent& s = event_.sample;
    s.pid = hdr.pid;
    s.tid = hdr.tid;
    s.cpu = hdr.cpu;
    s.ts_ns = hdr.ts_ns;
    s.comm.assign(hdr.comm, strnlen(hdr.comm, sizeof(hdr.comm)));
    const uint8_t* p = data + sizeof(hdr);
    s.kstack.resize(hdr.kstack_len);
    if (hdr.kstack_len) std::memcpy(s.kstack.data(), p, hdr.kstack_len * sizeof(uint64_t));
    p += hdr.kstack_len * sizeof(uint64_t);
    if (schedule_.first) {
      for (size_t i = 0; i < s.kstack.size(); ++i) {
        if (s.kstack[i] >= schedule_.first && s.kstack[i] < schedule_.second) {
          s.kstack.erase(s.kstack.begin(), s.kstack.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
      }
    }
    s.ustack.clear();
    append_user_ips(p, hdr.ustack_len, s.ustack);
    s.has_regs = snapshot && hdr.stack_len > 0;
    s.ip = s.has_regs ? hdr.ip : 0;
    s.sp = s.has_regs ? hdr.sp : 0;
    s.bp = s.has_regs ? hdr.bp : 0;
    s.stack_base = s.has_regs ? hdr.stack_base : 0;
    if (s.has_regs) {
      s.stack.assign(data + frames, data + frames + hdr.stack_len);
      restore_uretprobe_returns(s, hdr.uret, std::min<unsigned>(hdr.uret_len, STRATA_MAX_URETPROBES));
    } else {
      s.stack.clear();
    }
    event_.blocked_ns = hdr.blocked_ns;
    event_.reason = hdr.reason;
    agg_.add(event_);
  }

  void read_cgroup(uint32_t pid, ProcSnapshot& s) {
    CgroupReading c = taped(OsRead::kCgroup, pid, [&] {
      CgroupReading out;
      auto file = cgroups_.cpu_stat_file(pid);
      if (!file) return out;
      auto stat = cgroups_.read(*file);
      if (!stat) return out;
      out.stat = *stat;
      out.cgroup = cgroups_.cgroup_of(pid);
      return out;
    });
    if (!c.stat) return;
    s.cpu_stat = c.stat;
    s.cgroup = std::move(c.cgroup);
  }

  // The whole node's maps of this window; neighbours and retransmits are taken (deleted) as read.
  NodeMaps read_node_maps() {
    NodeMaps m;
    {
      strata_irq_key k{}, next{};
      const void* prev = nullptr;
      while (bpf_map__get_next_key(os_->maps.irq_time, prev, &next, sizeof(next)) == 0) {
        k = next;
        prev = &k;
        uint64_t ns = 0;
        if (bpf_map__lookup_elem(os_->maps.irq_time, &k, sizeof(k), &ns, sizeof(ns), 0) == 0)
          m.irq[k.tgid][{k.kind, k.vector}] = ns;
      }
    }
    {
      std::vector<strata_neighbour_key> keys;
      strata_neighbour_key k{}, next{};
      const void* prev = nullptr;
      while (bpf_map__get_next_key(sched_->maps.neighbours, prev, &next, sizeof(next)) == 0) {
        keys.push_back(next);
        k = next;
        prev = &k;
      }
      // The kernel names a neighbour once per window, at its first slice; a process renamed
      // since (prctl(PR_SET_NAME) right after its exec, as a hog or a worker pool does) is named
      // as it is now, once per process. One that has gone keeps its name from the kernel.
      std::map<uint32_t, std::string> now_named;
      for (const auto& key : keys) {
        strata_neighbour_value v{};
        if (bpf_map__lookup_and_delete_elem(sched_->maps.neighbours, &key, sizeof(key), &v, sizeof(v), 0) != 0) continue;
        auto [named, fresh] = now_named.try_emplace(key.tgid);
        if (fresh) named->second = process_comm(key.tgid);
        std::string comm = named->second.empty() ? std::string(v.comm, strnlen(v.comm, sizeof(v.comm))) : named->second;
        m.neighbours.push_back(Neighbour{key.cpu, key.tgid, std::move(comm), v.run_ns});
      }
    }
    {
      std::vector<uint64_t> keys;
      uint64_t k = 0, next = 0;
      const void* prev = nullptr;
      while (bpf_map__get_next_key(os_->maps.retransmits, prev, &next, sizeof(next)) == 0) {
        keys.push_back(next);
        k = next;
        prev = &k;
      }
      for (uint64_t key : keys) {
        uint64_t n = 0;
        if (bpf_map__lookup_and_delete_elem(os_->maps.retransmits, &key, sizeof(key), &n, sizeof(n), 0) == 0)
          m.retrans[key] += n;
      }
    }
    return m;
  }

  ProcMaps read_proc_maps(uint32_t pid) {
    ProcMaps m;
    strata_sched_stats ss;
    if (bpf_map__lookup_elem(sched_->maps.sched_stats, &pid, sizeof(pid), &ss, sizeof(ss), 0) == 0) m.sched = ss;
    strata_os_stats os;
    if (bpf_map__lookup_elem(os_->maps.os_stats, &pid, sizeof(pid), &os, sizeof(os), 0) == 0) m.os = os;
    return m;
  }

  std::vector<store::Metric> collect_metrics() {
    NodeMaps maps = taped(OsRead::kNodeMaps, 0, [&] { return read_node_maps(); });
    auto& irq = maps.irq;
    auto& retrans = maps.retrans;
    MetricInputs in;
    in.neighbours = std::move(maps.neighbours);
    auto irq_names = taped(OsRead::kIrqNames, 0, read_irq_names);
    in.irq_names = &irq_names;

    std::vector<store::Metric> out;
    for (uint32_t pid : pids_) {
      ProcSnapshot now;
      ProcMaps kernel = taped(OsRead::kProcMaps, pid, [&] { return read_proc_maps(pid); });
      now.sched = kernel.sched;
      now.os = kernel.os ? *kernel.os : strata_os_stats{};  // nothing happened yet: zeros, so peers compare
      auto it = irq.find(pid);
      if (it != irq.end()) now.irq_ns = it->second;
      bool alive = !exited_.count(pid) && taped(OsRead::kAlive, pid, [&] { return process_alive(pid); });
      ProcSnapshot& before = last_[pid];
      std::map<int, uint64_t> fds;  // fd -> inode, read once while it lives
      if (alive) {
        now.faults = faults(pid);
        read_cgroup(pid, now);
        fds = sockets(pid);  // one scan of /proc/PID/fd for connections and retransmits
        now.tcp = tcp_links(pid, fds);
      }
      if (!now.faults) now.faults = before.faults;  // gone: its last reading, a zero delta
      if (now.tcp.empty()) {
        auto t = tcp_latest_.find(pid);
        if (t != tcp_latest_.end()) now.tcp = std::move(t->second);
      }
      tcp_latest_.erase(pid);
      if (!now.cpu_stat) {
        now.cpu_stat = before.cpu_stat;
        now.cgroup = before.cgroup;
      }
      in.tcp_retransmits = 0;
      if (!retrans.empty() && alive) {
        for (const auto& [fd, ino] : fds) {
          auto r = retrans.find(ino);
          if (r != retrans.end()) in.tcp_retransmits += r->second;
        }
      }
      if (!now.sched && !before.sched && !alive) continue;  // never ran while watched
      auto m = process_metrics(pid, before, now, in);
      out.insert(out.end(), m.begin(), m.end());
      before = std::move(now);
    }
    return out;
  }

  void forget_exited() {
    for (uint32_t pid : exited_) {
      pids_.erase(pid);
      last_.erase(pid);
      tcp_latest_.erase(pid);
      if (sched_) bpf_map__delete_elem(sched_->maps.sched_stats, &pid, sizeof(pid), 0);
      if (os_) bpf_map__delete_elem(os_->maps.os_stats, &pid, sizeof(pid), 0);
    }
    if (os_ && !exited_.empty()) {
      std::vector<strata_irq_key> dead;
      strata_irq_key k{}, next{};
      const void* prev = nullptr;
      while (bpf_map__get_next_key(os_->maps.irq_time, prev, &next, sizeof(next)) == 0) {
        if (exited_.count(next.tgid)) dead.push_back(next);
        k = next;
        prev = &k;
      }
      for (const auto& d : dead) bpf_map__delete_elem(os_->maps.irq_time, &d, sizeof(d), 0);
    }
    exited_.clear();
  }

  // How often a watched process's cgroup and TCP connections are looked at between windows: a
  // move or a connection made mid-window is seen within this, at one /proc read per process.
  static constexpr uint64_t kCgroupCheckNs = 1'000'000'000;
  static constexpr uint64_t kTcpCheckNs = 2'000'000'000;

  OsLayerOptions opts_;
  Tape& tape_;
  ByteWriter drained_;  // this drain's raw records, when capturing
  offcpu_bpf* sched_ = nullptr;
  std::pair<uint64_t, uint64_t> schedule_{0, 0};  // __schedule's text, where off-CPU kernel stacks start
  os_bpf* os_ = nullptr;
  ring_buffer* ring_ = nullptr;
  int stats_fd_ = -1;
  OffCpuAggregator agg_;
  OffCpuEvent event_;  // reused: no allocation per event once warm
  CgroupReader cgroups_;
  uint64_t last_cgroup_check_ns_ = 0;
  uint64_t last_tcp_check_ns_ = 0;
  std::map<uint32_t, std::vector<TcpLink>> tcp_latest_;  // the latest reading of each process
  std::set<uint32_t> pids_;
  std::set<uint32_t> exited_;
  std::map<uint32_t, ProcSnapshot> last_;
  std::vector<std::string> missing_;
};

}  // namespace

OsLayerOptions options_from_env(bool offcpu, bool os) {
  OsLayerOptions o;
  o.offcpu = offcpu;
  o.os = os;
  o.min_block_us = env_u64("STRATA_OFFCPU_MIN_BLOCK_US", o.min_block_us);
  o.max_events_per_sec = static_cast<uint32_t>(env_u64("STRATA_OFFCPU_MAX_EVENTS", o.max_events_per_sec));
  o.max_captures_per_sec = static_cast<uint32_t>(env_u64("STRATA_OFFCPU_MAX_CAPTURES", o.max_captures_per_sec));
  o.capture_target_per_sec =
      static_cast<uint32_t>(env_u64("STRATA_OFFCPU_CAPTURE_TARGET", o.capture_target_per_sec));
  o.max_snapshots_per_sec = static_cast<uint32_t>(env_u64("STRATA_OFFCPU_MAX_SNAPSHOTS", o.max_snapshots_per_sec));
  o.snapshot_slots = static_cast<uint32_t>(env_u64("STRATA_OFFCPU_SNAPSHOT_SLOTS", o.snapshot_slots));
  // Frame pointers only (STRATA_USER_STACK_MODE=0, as for the on-CPU sampler): no stack copies.
  if (const char* m = std::getenv("STRATA_USER_STACK_MODE"); m && *m == '0') o.snapshot_pages = 0;
  return o;
}

Result<std::unique_ptr<Source>> start_os_layer(const OsLayerOptions& opts, const SourceEnv& env) {
  if (!env.normalizer) return Error{"the OS layer needs the recorder's normalizer"};
  auto src = std::make_unique<OsLayerSource>(opts, *env.normalizer, env.tape ? *env.tape : live_tape());
  if (auto st = src->init(env.target_bits_fd); !st) return st.error().environment();
  return std::unique_ptr<Source>(std::move(src));
}

Result<std::unique_ptr<Source>> replay_os_layer(const OsLayerOptions& opts, const SourceEnv& env) {
  if (!env.normalizer) return Error{"the OS layer needs the recorder's normalizer"};
  if (!env.tape || !env.tape->replaying()) return Error{"the OS layer's replay needs a replaying tape"};
  auto src = std::make_unique<OsLayerSource>(opts, *env.normalizer, *env.tape);
  src->init_replay();
  return std::unique_ptr<Source>(std::move(src));
}

}  // namespace strata::agent::os
