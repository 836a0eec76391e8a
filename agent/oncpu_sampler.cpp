#include "agent/oncpu_sampler.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/perf_event.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "abi/oncpu.h"
#include "agent/libbpf_log.h"
#include "bpf/oncpu.skel.h"
#include "common/parse.h"

namespace strata::agent {
namespace {

constexpr int kCapSysAdmin = 21;
constexpr int kCapPerfmon = 38;
constexpr int kCapBpf = 39;

uint64_t effective_caps() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) return parse_int_prefix<uint64_t>(line.substr(7), 16).value_or(0);
  }
  return 0;
}

int perf_event_open(perf_event_attr* attr, int cpu) {
  return static_cast<int>(syscall(SYS_perf_event_open, attr, -1, cpu, -1, PERF_FLAG_FD_CLOEXEC));
}

std::vector<int> online_cpus() {
  std::vector<int> cpus;
  std::ifstream in("/sys/devices/system/cpu/online");
  std::string spec;
  std::getline(in, spec);
  std::stringstream ss(spec);
  std::string part;
  while (std::getline(ss, part, ',')) {
    auto dash = part.find('-');
    auto lo = parse_int<int>(std::string_view(part).substr(0, dash));
    auto hi = dash == std::string::npos ? lo : parse_int<int>(std::string_view(part).substr(dash + 1));
    if (!lo || !hi) continue;
    for (int c = *lo; c <= *hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

class LiveSampler final : public OnCpuSampler {
 public:
  ~LiveSampler() override {
    if (wait_fd_ >= 0) close(wait_fd_);
    ring_buffer__free(ring_);
    for (auto* link : links_) bpf_link__destroy(link);
    for (int fd : perf_fds_) close(fd);
    oncpu_bpf__destroy(skel_);
    if (stats_fd_ >= 0) close(stats_fd_);
  }

  Status init(const SamplerOptions& opts) {
    setup_libbpf_logging();
    skel_ = oncpu_bpf__open();
    if (!skel_) return Error::from_errno("cannot open the on-CPU BPF program", errno);
    skel_->rodata->follow_children = opts.follow_children;
    skel_->rodata->user_stack_mode = opts.user_stack_mode;
    // For the bench: compare the methods' costs on the same workload without a rebuild.
    if (const char* m = std::getenv("STRATA_USER_STACK_MODE"); m && *m >= '0' && *m <= '3')
      skel_->rodata->user_stack_mode = static_cast<uint32_t>(*m - '0');
    mode_ = skel_->rodata->user_stack_mode;
    // The kernel CFI walk's tables are preallocated: full size only in the mode that uses them.
    // The adaptive mode needs only the processes' mapping lists (which modules keep frame pointers).
    if (mode_ == STRATA_USTACK_BOTH) bpf_map__set_max_entries(skel_->maps.kcfi_procs, opts.kcfi_max_procs);
    if (mode_ == STRATA_USTACK_KERNEL_CFI) {
      kcfi_row_capacity_ = opts.kcfi_max_rows;
      kcfi_module_capacity_ = opts.kcfi_max_modules;
      bpf_map__set_max_entries(skel_->maps.kcfi_rows, opts.kcfi_max_rows);
      bpf_map__set_max_entries(skel_->maps.kcfi_modules, opts.kcfi_max_modules);
      bpf_map__set_max_entries(skel_->maps.kcfi_procs, opts.kcfi_max_procs);
      kcfi_page_capacity_ = opts.kcfi_max_pages;
      bpf_map__set_max_entries(skel_->maps.kcfi_pages, opts.kcfi_max_pages);
    }
    skel_->rodata->snapshot_pages = opts.snapshot_pages;
    auto cpus = online_cpus();
    int ncpus = libbpf_num_possible_cpus();
    uint32_t rb = opts.ringbuf_bytes_per_cpu * static_cast<uint32_t>(ncpus > 0 ? ncpus : 1);
    uint32_t rb_pow2 = 1u << 20;  // at least 1 MiB, a power of two as the kernel requires
    while (rb_pow2 < rb && rb_pow2 < (1u << 28)) rb_pow2 <<= 1;
    bpf_map__set_max_entries(skel_->maps.events, rb_pow2);
    bpf_map__set_max_entries(skel_->maps.targets, opts.max_targets);

    if (int err = oncpu_bpf__load(skel_); err) {
      return Error::from_errno("cannot load the on-CPU BPF program (see the libbpf messages above)", -err);
    }
    // Measure our own BPF run time; the kernel keeps these stats while the fd is open.
    stats_fd_ = bpf_enable_stats(BPF_STATS_RUN_TIME);

    for (int cpu : opts.sample_cpu ? cpus : std::vector<int>{}) {
      perf_event_attr attr{};
      attr.size = sizeof(attr);
      attr.type = PERF_TYPE_SOFTWARE;
      attr.config = PERF_COUNT_SW_CPU_CLOCK;
      attr.sample_period = 1'000'000'000ull / (opts.frequency_hz ? opts.frequency_hz : 99);
      int fd = perf_event_open(&attr, cpu);
      if (fd < 0) {
        if (errno == ENODEV) continue;  // CPU went offline meanwhile
        return Error::from_errno("perf_event_open(cpu-clock) on CPU " + std::to_string(cpu), errno);
      }
      perf_fds_.push_back(fd);
      bpf_link* link = bpf_program__attach_perf_event(skel_->progs.on_cpu_sample, fd);
      if (!link) return Error::from_errno("cannot attach the sampler to CPU " + std::to_string(cpu), errno);
      links_.push_back(link);
    }
    if (int err = oncpu_bpf__attach(skel_); err) {
      return Error::from_errno("cannot attach the process-tracking tracepoints", -err);
    }
    ring_ = ring_buffer__new(bpf_map__fd(skel_->maps.events), &LiveSampler::on_event, this, nullptr);
    if (!ring_) return Error::from_errno("cannot open the sample ring buffer", errno);
    return {};
  }

  Status add_target(uint32_t pid) override {
    uint8_t one = 1;
    if (bpf_map__update_elem(skel_->maps.targets, &pid, sizeof(pid), &one, sizeof(one), BPF_ANY) != 0) {
      return Error::from_errno("cannot watch pid " + std::to_string(pid), errno);
    }
    // The bitmap's bits are only ever changed atomically in BPF: run set_target for this pid.
    strata_set_target_args args{pid, 1};
    LIBBPF_OPTS(bpf_test_run_opts, run, .ctx_in = &args, .ctx_size_in = sizeof(args));
    if (int err = bpf_prog_test_run_opts(bpf_program__fd(skel_->progs.set_target), &run); err != 0)
      return Error::from_errno("cannot watch pid " + std::to_string(pid) + " (target bitmap)", -err);
    return {};
  }

  Result<int> poll(int timeout_ms, EventSink& sink) override {
    sink_ = &sink;
    // Samples do not wake us (see bpf/strata_ringbuf.bpf.h): wait for a process event, another
    // source's wake-up or the timeout, then drain whatever is there.
    int n = 0;
    if (wait_fd_ >= 0) {
      epoll_event ev[4];
      int r = epoll_wait(wait_fd_, ev, 4, timeout_ms);
      if (r < 0 && errno != EINTR) {
        sink_ = nullptr;
        return Error::from_errno("waiting for ring buffers", errno);
      }
    } else {
      n = ring_buffer__poll(ring_, timeout_ms);
    }
    if (n < 0 && n != -EINTR) {
      sink_ = nullptr;
      return Error::from_errno("polling the sample ring buffer", -n);
    }
    int m = ring_buffer__consume(ring_);
    sink_ = nullptr;
    if (m < 0) return Error::from_errno("reading the sample ring buffer", -m);
    return (n > 0 ? n : 0) + m;
  }

  Status set_frequency(unsigned hz) override {
    uint64_t period = 1'000'000'000ull / (hz ? hz : 99);
    for (int fd : perf_fds_) {
      if (ioctl(fd, PERF_EVENT_IOC_PERIOD, &period) != 0)
        return Error::from_errno("cannot change the sampling period", errno);
    }
    return {};
  }

  int targets_map_fd() const override { return bpf_map__fd(skel_->maps.targets); }
  int target_bits_fd() const override { return bpf_map__fd(skel_->maps.target_bits); }

  Status set_python_process(uint32_t pid, const strata_py_offsets* offsets) override {
    if (!offsets) {
      bpf_map__delete_elem(skel_->maps.py_procs, &pid, sizeof(pid), 0);
      return {};
    }
    if (bpf_map__update_elem(skel_->maps.py_procs, &pid, sizeof(pid), offsets, sizeof(*offsets), BPF_ANY) != 0) {
      return Error::from_errno("cannot register the Python interpreter of pid " + std::to_string(pid), errno);
    }
    return {};
  }

  uint32_t user_stack_mode() const override { return mode_; }

  Result<uint32_t> load_unwind_module(const strata_unwind_row* rows, size_t n) override {
    if (mode_ != STRATA_USTACK_KERNEL_CFI) return Error{"kernel unwind tables are off (user stack mode " + std::to_string(mode_) + ")"};
    if (n > kcfi_row_capacity_ - kcfi_rows_used_ || kcfi_modules_ >= kcfi_module_capacity_) {
      kcfi_full_++;
      return Error{"kernel unwind table full"};
    }
    // One batched update per module (arrays support it); rows are few syscalls' worth otherwise.
    std::vector<uint32_t> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = kcfi_rows_used_ + static_cast<uint32_t>(i);
    uint32_t count = static_cast<uint32_t>(n);
    int fd = bpf_map__fd(skel_->maps.kcfi_rows);
    if (n > 0 && bpf_map_update_batch(fd, keys.data(), rows, &count, nullptr) != 0) {
      for (size_t i = 0; i < n; ++i) {
        if (bpf_map_update_elem(fd, &keys[i], &rows[i], BPF_ANY) != 0)
          return Error::from_errno("cannot load unwind rows", errno);
      }
    }
    uint32_t id = kcfi_modules_;
    strata_kcfi_module mod{kcfi_rows_used_, static_cast<uint32_t>(n), 0, 0, 0, 0};
    // The page index: per 4 KiB page the last row starting at or below the page's start, so the
    // kernel searches a few rows, not all (modules without room for it are searched whole).
    if (n > 0) {
      uint32_t base = rows[0].pc >> 12, pages = (rows[n - 1].pc >> 12) - base + 1;
      if (pages <= kcfi_page_capacity_ - kcfi_pages_used_) {
        std::vector<uint32_t> index(pages), pkeys(pages);
        size_t r = 0;
        for (uint32_t p = 0; p < pages; ++p) {
          uint64_t start = static_cast<uint64_t>(base + p) << 12;
          while (r + 1 < n && rows[r + 1].pc <= start) ++r;
          index[p] = kcfi_rows_used_ + static_cast<uint32_t>(r);
          pkeys[p] = kcfi_pages_used_ + p;
        }
        uint32_t pcount = pages;
        int pfd = bpf_map__fd(skel_->maps.kcfi_pages);
        bool ok = bpf_map_update_batch(pfd, pkeys.data(), index.data(), &pcount, nullptr) == 0;
        for (uint32_t p = 0; !ok && p < pages; ++p) ok = bpf_map_update_elem(pfd, &pkeys[p], &index[p], BPF_ANY) == 0;
        if (ok) {
          mod.page_first = kcfi_pages_used_;
          mod.page_count = pages;
          mod.base_page = base;
          kcfi_pages_used_ += pages;
        }
      }
    }
    if (bpf_map__update_elem(skel_->maps.kcfi_modules, &id, sizeof(id), &mod, sizeof(mod), BPF_ANY) != 0)
      return Error::from_errno("cannot load an unwind module", errno);
    kcfi_rows_used_ += static_cast<uint32_t>(n);
    kcfi_modules_++;
    return id;
  }

  Status set_process_mappings(uint32_t pid, const strata_proc_mappings* maps) override {
    if (mode_ != STRATA_USTACK_KERNEL_CFI && mode_ != STRATA_USTACK_BOTH) return {};
    if (!maps) {
      bpf_map__delete_elem(skel_->maps.kcfi_procs, &pid, sizeof(pid), 0);
      return {};
    }
    if (bpf_map__update_elem(skel_->maps.kcfi_procs, &pid, sizeof(pid), maps, sizeof(*maps), BPF_ANY) != 0)
      return Error::from_errno("cannot give the kernel the mappings of pid " + std::to_string(pid), errno);
    return {};
  }

  SamplerCounters counters() const override {
    SamplerCounters c;
    int ncpus = libbpf_num_possible_cpus();
    std::vector<uint64_t> values(ncpus > 0 ? ncpus : 1);
    auto sum = [&](uint32_t key) -> uint64_t {
      if (bpf_map__lookup_elem(skel_->maps.counters, &key, sizeof(key), values.data(),
                               values.size() * sizeof(uint64_t), 0) != 0)
        return 0;
      uint64_t s = 0;
      for (auto v : values) s += v;
      return s;
    };
    c.samples = sum(STRATA_CNT_SAMPLES);
    c.emitted = sum(STRATA_CNT_EMITTED);
    c.ringbuf_drops = sum(STRATA_CNT_RINGBUF_DROP);
    c.kstack_errors = sum(STRATA_CNT_KSTACK_ERR);
    c.ustack_errors = sum(STRATA_CNT_USTACK_ERR);
    c.proc_events = sum(STRATA_CNT_PROC_EVENTS);
    c.proc_drops = sum(STRATA_CNT_PROC_DROP);
    c.targets_full = sum(STRATA_CNT_TARGETS_FULL);
    c.snapshot_errors = sum(STRATA_CNT_SNAPSHOT_ERR);
    c.py_samples = sum(STRATA_CNT_PY_SAMPLES);
    c.py_no_thread = sum(STRATA_CNT_PY_NO_THREAD);
    c.py_read_errors = sum(STRATA_CNT_PY_READ_ERR);
    c.py_truncated = sum(STRATA_CNT_PY_TRUNCATED);
    c.kcfi_walks = sum(STRATA_CNT_KCFI_WALKS);
    for (uint32_t i = 0; i < 7; ++i) c.kcfi_stops[i] = sum(STRATA_CNT_KCFI_END + i);
    c.kcfi_frames = sum(STRATA_CNT_KCFI_FRAMES);
    c.copies_skipped = sum(STRATA_CNT_COPY_SKIPPED);
    c.kcfi_fp_frames = sum(STRATA_CNT_KCFI_FP_FRAMES);
    c.kcfi_rows = kcfi_rows_used_;
    c.kcfi_pages = kcfi_pages_used_;
    c.kcfi_row_capacity = kcfi_row_capacity_;
    c.kcfi_modules = kcfi_modules_;
    c.kcfi_full = kcfi_full_;
    c.bpf_stats = stats_fd_ >= 0;
    for (bpf_program* prog = bpf_object__next_program(skel_->obj, nullptr); prog;
         prog = bpf_object__next_program(skel_->obj, prog)) {
      bpf_prog_info info{};
      uint32_t len = sizeof(info);
      if (bpf_obj_get_info_by_fd(bpf_program__fd(prog), &info, &len) == 0) {
        c.bpf_run_ns += info.run_time_ns;
        if (prog == skel_->progs.on_cpu_sample) c.bpf_sample_run_ns = info.run_time_ns;
        c.bpf_run_cnt += info.run_cnt;
      }
    }
    return c;
  }

 private:
  static int on_event(void* ctx, void* data, size_t size) {
    auto* self = static_cast<LiveSampler*>(ctx);
    if (!self->sink_ || size < sizeof(uint32_t)) return 0;
    uint32_t type;
    std::memcpy(&type, data, sizeof(type));
    if (type == STRATA_EV_SAMPLE) {
      self->decode_sample(static_cast<const uint8_t*>(data), size);
    } else if (size >= sizeof(strata_proc_event)) {
      strata_proc_event raw;
      std::memcpy(&raw, data, sizeof(raw));
      ProcEvent e;
      e.type = type == STRATA_EV_FORK   ? ProcEvent::Type::kFork
               : type == STRATA_EV_EXEC ? ProcEvent::Type::kExec
                                        : ProcEvent::Type::kExit;
      e.pid = raw.pid;
      e.ppid = raw.ppid;
      e.ts_ns = raw.ts_ns;
      e.comm.assign(raw.comm, strnlen(raw.comm, sizeof(raw.comm)));
      self->sink_->on_proc(e);
    }
    return 0;
  }

  void decode_sample(const uint8_t* data, size_t size) {
    if (size < sizeof(strata_sample)) return;
    strata_sample hdr;
    std::memcpy(&hdr, data, sizeof(hdr));
    size_t need = sizeof(hdr) + hdr.kstack_len * sizeof(uint64_t) +
                  hdr.ustack_len * sizeof(uint64_t) + hdr.py_len * sizeof(strata_py_frame) +
                  hdr.stack_len;
    if (need > size) return;  // never trust a length: the layout is checked, not assumed
    sample_.pid = hdr.pid;
    sample_.tid = hdr.tid;
    sample_.cpu = hdr.cpu;
    sample_.ts_ns = hdr.ts_ns;
    sample_.comm.assign(hdr.comm, strnlen(hdr.comm, sizeof(hdr.comm)));
    const uint8_t* p = data + sizeof(hdr);
    sample_.kstack.resize(hdr.kstack_len);
    // No kernel frames (a sample taken in user mode): data() of the empty vector may be null, which
    // memcpy must not get even for 0 bytes.
    if (hdr.kstack_len) std::memcpy(sample_.kstack.data(), p, hdr.kstack_len * sizeof(uint64_t));
    p += hdr.kstack_len * sizeof(uint64_t);
    sample_.ustack.clear();
    append_user_ips(p, hdr.ustack_len, sample_.ustack);
    p = data + sizeof(hdr) + hdr.kstack_len * sizeof(uint64_t) + hdr.ustack_len * sizeof(uint64_t);
    sample_.pystack.resize(hdr.py_len);
    for (unsigned i = 0; i < hdr.py_len; ++i, p += sizeof(strata_py_frame)) {
      strata_py_frame f;
      std::memcpy(&f, p, sizeof(f));
      sample_.pystack[i] = RawPythonFrame{f.code, f.lasti, f.flags};
    }
    sample_.has_regs = hdr.flags & STRATA_SAMPLE_HAS_REGS;
    sample_.ip = hdr.ip;
    sample_.sp = hdr.sp;
    sample_.bp = hdr.bp;
    sample_.stack_base = hdr.stack_base;
    sample_.stack.assign(p, p + hdr.stack_len);
    sample_.kernel_cfi = hdr.flags & STRATA_SAMPLE_KERNEL_CFI;
    sample_.kcfi_stop = hdr.kcfi_stop;
    sample_.kcfi_frames = hdr.kcfi_frames;
    sample_.kcfi_fp_frames = hdr.kcfi_fp_frames;
    restore_uretprobe_returns(sample_, hdr.uret, std::min<unsigned>(hdr.uret_len, STRATA_MAX_URETPROBES));
    sink_->on_sample(sample_);
  }

  Status add_wake_fd(int fd) override {
    if (fd < 0) return {};
    if (wait_fd_ < 0) {
      wait_fd_ = epoll_create1(EPOLL_CLOEXEC);
      if (wait_fd_ < 0) return Error::from_errno("epoll_create1", errno);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = ring_buffer__epoll_fd(ring_);
      if (epoll_ctl(wait_fd_, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0)
        return Error::from_errno("epoll_ctl on the sample ring buffer", errno);
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(wait_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return Error::from_errno("epoll_ctl", errno);
    return {};
  }

  oncpu_bpf* skel_ = nullptr;
  ring_buffer* ring_ = nullptr;
  int wait_fd_ = -1;  // epoll over our ring's epoll fd and other sources' wake fds, once one is added
  std::vector<int> perf_fds_;
  std::vector<bpf_link*> links_;
  int stats_fd_ = -1;
  uint32_t mode_ = 2;
  uint32_t kcfi_row_capacity_ = 0, kcfi_module_capacity_ = 0;  // mode 3 only
  uint32_t kcfi_rows_used_ = 0, kcfi_modules_ = 0;
  uint32_t kcfi_page_capacity_ = 0, kcfi_pages_used_ = 0;
  uint64_t kcfi_full_ = 0;
  EventSink* sink_ = nullptr;
  SampleEvent sample_;  // reused: no allocation per sample once warm
};

}  // namespace

Status check_bpf_permissions() {
  uint64_t caps = effective_caps();
  auto has = [&](int cap) { return (caps >> cap) & 1; };
  if (has(kCapSysAdmin)) return {};
  if (has(kCapBpf) && has(kCapPerfmon)) return {};
  std::string missing;
  if (!has(kCapBpf)) missing += "CAP_BPF";
  if (!has(kCapPerfmon)) missing += std::string(missing.empty() ? "" : " and ") + "CAP_PERFMON";
  return Error{"missing capability " + missing +
               " (or CAP_SYS_ADMIN): run as root, or grant them with "
               "`setcap cap_bpf,cap_perfmon,cap_sys_resource+ep $(which strata)`"};
}

Result<std::unique_ptr<OnCpuSampler>> OnCpuSampler::start(const SamplerOptions& opts) {
  auto sampler = std::make_unique<LiveSampler>();
  if (auto st = sampler->init(opts); !st) return st.error();
  return std::unique_ptr<OnCpuSampler>(std::move(sampler));
}

}  // namespace strata::agent
