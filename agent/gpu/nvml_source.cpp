#include "agent/gpu/nvml_source.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "abi/nvml_abi.h"

namespace strata::agent {
namespace {

uint64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The NVML entry points. The core ones are required; every other one may be missing in an old
// driver (null: that series is skipped).
struct NvmlApi {
  void* lib = nullptr;
  nvmlInit_v2_fn init = nullptr;
  nvmlShutdown_fn shutdown = nullptr;
  nvmlErrorString_fn error_string = nullptr;
  nvmlDeviceGetCount_v2_fn get_count = nullptr;
  nvmlDeviceGetHandleByIndex_v2_fn get_handle = nullptr;
  nvmlDeviceGetClockInfo_fn clock = nullptr;
  nvmlDeviceGetMaxClockInfo_fn max_clock = nullptr;
  nvmlDeviceGetTemperature_fn temperature = nullptr;
  nvmlDeviceGetPowerUsage_fn power = nullptr;
  nvmlDeviceGetEnforcedPowerLimit_fn power_limit = nullptr;
  nvmlDeviceGetUtilizationRates_fn utilization = nullptr;
  nvmlDeviceGetMemoryInfo_fn memory = nullptr;
  nvmlDeviceGetCurrentClocksEventReasons_fn reasons = nullptr;
  nvmlDeviceGetTotalEccErrors_fn ecc = nullptr;
  nvmlDeviceGetPcieThroughput_fn pcie_throughput = nullptr;
  nvmlDeviceGetPcieReplayCounter_fn pcie_replay = nullptr;
  nvmlDeviceGetCurrPcieLinkGeneration_fn pcie_gen = nullptr;
  nvmlDeviceGetCurrPcieLinkWidth_fn pcie_width = nullptr;
  nvmlDeviceGetMaxPcieLinkWidth_fn pcie_max_width = nullptr;
  nvmlDeviceGetNvLinkState_fn nvlink_state = nullptr;
  nvmlDeviceGetNvLinkErrorCounter_fn nvlink_errors = nullptr;
  nvmlDeviceGetFieldValues_fn field_values = nullptr;
  // Xids: the event API, and the PCI address that joins a kernel-log Xid to its device.
  nvmlDeviceGetPciInfo_v3_fn pci_info = nullptr;
  nvmlEventSetCreate_fn event_set_create = nullptr;
  nvmlDeviceRegisterEvents_fn register_events = nullptr;
  nvmlEventSetWait_v2_fn event_wait = nullptr;
  nvmlEventSetFree_fn event_set_free = nullptr;

  bool has_events() const { return event_set_create && register_events && event_wait && event_set_free; }

  std::string error(nvmlReturn_t r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return (s ? std::string(s) : std::string("error")) + " (" + std::to_string(static_cast<int>(r)) + ")";
  }
};

template <typename Fn>
Fn lookup(void* lib, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (void* p = dlsym(lib, n)) return reinterpret_cast<Fn>(p);
  }
  return nullptr;
}

Result<NvmlApi> load_nvml(const std::string& path) {
  NvmlApi a;
  // RTLD_LOCAL: NVML's symbols stay out of the agent's global namespace.
  a.lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!a.lib) {
    const char* e = dlerror();
    return Error{"cannot load " + path + " (no NVIDIA driver here?): " + (e ? e : "dlopen failed")};
  }
  // The _v2 names are what nvml.h maps the plain ones to since driver 325; the plain ones are the
  // fallback for stand-ins that export only those.
  a.init = lookup<nvmlInit_v2_fn>(a.lib, {"nvmlInit_v2", "nvmlInit"});
  a.shutdown = lookup<nvmlShutdown_fn>(a.lib, {"nvmlShutdown"});
  a.error_string = lookup<nvmlErrorString_fn>(a.lib, {"nvmlErrorString"});
  a.get_count = lookup<nvmlDeviceGetCount_v2_fn>(a.lib, {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
  a.get_handle = lookup<nvmlDeviceGetHandleByIndex_v2_fn>(
      a.lib, {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
  if (!a.init || !a.shutdown || !a.get_count || !a.get_handle) {
    // No dlclose: a half-usable NVML may still have run constructors; leaving it mapped is harmless.
    return Error{path + " lacks nvmlInit/nvmlDeviceGetCount/nvmlDeviceGetHandleByIndex: not an NVML library"};
  }
  a.clock = lookup<nvmlDeviceGetClockInfo_fn>(a.lib, {"nvmlDeviceGetClockInfo"});
  a.max_clock = lookup<nvmlDeviceGetMaxClockInfo_fn>(a.lib, {"nvmlDeviceGetMaxClockInfo"});
  a.temperature = lookup<nvmlDeviceGetTemperature_fn>(a.lib, {"nvmlDeviceGetTemperature"});
  a.power = lookup<nvmlDeviceGetPowerUsage_fn>(a.lib, {"nvmlDeviceGetPowerUsage"});
  a.power_limit = lookup<nvmlDeviceGetEnforcedPowerLimit_fn>(a.lib, {"nvmlDeviceGetEnforcedPowerLimit"});
  a.utilization = lookup<nvmlDeviceGetUtilizationRates_fn>(a.lib, {"nvmlDeviceGetUtilizationRates"});
  a.memory = lookup<nvmlDeviceGetMemoryInfo_fn>(a.lib, {"nvmlDeviceGetMemoryInfo"});
  // "Clocks event reasons" is the 535+ driver name of the same call and bits as "throttle reasons".
  a.reasons = lookup<nvmlDeviceGetCurrentClocksEventReasons_fn>(
      a.lib, {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"});
  a.ecc = lookup<nvmlDeviceGetTotalEccErrors_fn>(a.lib, {"nvmlDeviceGetTotalEccErrors"});
  a.pcie_throughput = lookup<nvmlDeviceGetPcieThroughput_fn>(a.lib, {"nvmlDeviceGetPcieThroughput"});
  a.pcie_replay = lookup<nvmlDeviceGetPcieReplayCounter_fn>(a.lib, {"nvmlDeviceGetPcieReplayCounter"});
  a.pcie_gen = lookup<nvmlDeviceGetCurrPcieLinkGeneration_fn>(a.lib, {"nvmlDeviceGetCurrPcieLinkGeneration"});
  a.pcie_width = lookup<nvmlDeviceGetCurrPcieLinkWidth_fn>(a.lib, {"nvmlDeviceGetCurrPcieLinkWidth"});
  a.pcie_max_width = lookup<nvmlDeviceGetMaxPcieLinkWidth_fn>(a.lib, {"nvmlDeviceGetMaxPcieLinkWidth"});
  a.nvlink_state = lookup<nvmlDeviceGetNvLinkState_fn>(a.lib, {"nvmlDeviceGetNvLinkState"});
  a.nvlink_errors = lookup<nvmlDeviceGetNvLinkErrorCounter_fn>(a.lib, {"nvmlDeviceGetNvLinkErrorCounter"});
  a.field_values = lookup<nvmlDeviceGetFieldValues_fn>(a.lib, {"nvmlDeviceGetFieldValues"});
  // _v2 and _v3 fill the same nvmlPciInfo_t (v3 changed only how busId is formatted); the
  // unversioned one is an older, shorter struct and is not used.
  a.pci_info = lookup<nvmlDeviceGetPciInfo_v3_fn>(a.lib, {"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"});
  a.event_set_create = lookup<nvmlEventSetCreate_fn>(a.lib, {"nvmlEventSetCreate"});
  a.register_events = lookup<nvmlDeviceRegisterEvents_fn>(a.lib, {"nvmlDeviceRegisterEvents"});
  // Only _v2: the unversioned wait fills the older nvmlEventData_t without the instance ids.
  a.event_wait = lookup<nvmlEventSetWait_v2_fn>(a.lib, {"nvmlEventSetWait_v2"});
  a.event_set_free = lookup<nvmlEventSetFree_fn>(a.lib, {"nvmlEventSetFree"});
  return a;
}

// The clocks-event reason bits and their metric names.
struct Reason {
  unsigned long long bit;
  const char* name;
};
constexpr std::array<Reason, 9> kReasons = {{
    {nvmlClocksEventReasonGpuIdle, "gpu_idle"},
    {nvmlClocksEventReasonApplicationsClocksSetting, "applications_clocks"},
    {nvmlClocksEventReasonSwPowerCap, "sw_power_cap"},
    {nvmlClocksThrottleReasonHwSlowdown, "hw_slowdown"},
    {nvmlClocksEventReasonSyncBoost, "sync_boost"},
    {nvmlClocksEventReasonSwThermalSlowdown, "sw_thermal"},
    {nvmlClocksThrottleReasonHwThermalSlowdown, "hw_thermal"},
    {nvmlClocksThrottleReasonHwPowerBrakeSlowdown, "hw_power_brake"},
    {nvmlClocksEventReasonDisplayClockSetting, "display_clocks"},
}};
// Reasons that lower the clocks of a GPU that has work: the ones a slow step can blame.
constexpr unsigned long long kSlowdownMask =
    nvmlClocksEventReasonSwPowerCap | nvmlClocksThrottleReasonHwSlowdown | nvmlClocksEventReasonSwThermalSlowdown |
    nvmlClocksThrottleReasonHwThermalSlowdown | nvmlClocksThrottleReasonHwPowerBrakeSlowdown;

// One call per series; a series a device refuses once is not asked again.
enum Query : unsigned {
  kSmClock, kMemClock, kMaxSm, kMaxMem, kTemp, kPower, kPowerLimit, kUtil, kMemory, kReasonsQ,
  kEccCorr, kEccUnc, kPcieTx, kPcieRx, kPcieReplay, kPcieGen, kPcieWidth, kPcieMaxWidth, kNvlink,
  kNvlinkErrors, kNvlinkData, kQueryCount
};

struct Stat {
  uint32_t n = 0;
  double sum = 0, min = std::numeric_limits<double>::max(), max = std::numeric_limits<double>::lowest();
  void add(double v) {
    ++n;
    sum += v;
    min = std::min(min, v);
    max = std::max(max, v);
  }
  double mean() const { return n ? sum / n : 0; }
};

// A cumulative hardware counter turned into "new in this window". The first reading is the baseline.
struct Counter {
  std::optional<uint64_t> prev;
  uint64_t window_new = 0;
  bool seen = false;  // read at least once in the window
  void update(uint64_t v) {
    if (prev && v >= *prev) window_new += v - *prev;  // a reset (driver reload) restarts the baseline
    prev = v;
    seen = true;
  }
};

// What the polls of one window saw on one device.
struct Window {
  uint32_t polls = 0;
  Stat sm, mem_clock, temp, power, util, mem_util, pcie_tx, pcie_rx;
  std::optional<double> max_sm, max_mem, power_limit, mem_used_max, mem_total, link_gen, link_width,
      link_max_width, nvlinks_active;
  uint32_t reason_polls = 0;  // polls where the reasons could be read
  unsigned long long reasons_or = 0;
  std::array<uint32_t, kReasons.size()> per_reason{};
  uint32_t slowdown_polls = 0;
  double nvlink_tx_bytes = 0, nvlink_rx_bytes = 0, nvlink_s = 0;
  bool nvlink_rate_known = false;
  bool lost = false;
  std::vector<unsigned> xids;  // Xids reported in the window, in order
};

// How long the Xid thread waits for an NVML event (or between reads of the kernel log) per round:
// an Xid reaches its window within this, and the source stops within it. One second: a window is
// ten, so an Xid is still in the window it happened in (or the next); each round is a wake-up of
// the thread, and in this VM a wake-up costs ~100 us of the agent's CPU (at 200 ms the Xid thread
// was 9% of the agent's CPU on a DDP job, by perf; the agent's whole budget is 0.2% of the job's).
constexpr unsigned kXidWaitMs = 1000;
// Events taken per round at most: a driver that reports an Xid storm cannot keep the thread from
// seeing the stop.
constexpr int kMaxXidsPerRound = 64;
// Reads of the kernel log per round at most, and the longest line kept: a kernel log line is at
// most ~1 KiB (the kernel's LOG_LINE_MAX); a longer run without a newline is not a log line.
constexpr int kMaxLogReadsPerRound = 64;
constexpr size_t kMaxLogLine = 8192;

struct Device {
  unsigned index = 0;
  nvmlDevice_t handle = nullptr;
  std::array<bool, kQueryCount> off{};  // series this device does not support
  std::vector<unsigned> nvlinks;        // links NVML knows on this device (up or down)
  Counter ecc_corr, ecc_unc, pcie_replays, nvlink_errs;
  std::optional<std::pair<uint64_t, uint64_t>> nvlink_prev;  // cumulative tx, rx KiB
  uint64_t nvlink_prev_ns = 0;
  bool lost = false;
  bool xid_events = false;                             // Xids come through NVML's events
  std::optional<std::array<unsigned, 3>> pci;          // domain, bus, device: for kernel-log Xids
  Window w;
};

class NvmlSource final : public Source {
 public:
  NvmlSource(NvmlApi api, std::vector<Device> devices, NvmlOptions opts)
      : api_(api), devices_(std::move(devices)), opts_(std::move(opts)) {
    for (auto& d : devices_) discover_nvlinks(d);
    setup_xids();
  }

  void start_threads() override {
    if (opts_.thread && !thread_.joinable()) thread_ = std::thread([this] { run(); });
    if (opts_.thread && !xid_thread_.joinable() && (event_set_ || log_fd_ >= 0))
      xid_thread_ = std::thread([this] { watch_xids(); });
  }

  ~NvmlSource() override {
    {
      std::lock_guard lock(stop_m_);
      stop_ = true;
    }
    stop_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (xid_thread_.joinable()) xid_thread_.join();
    if (event_set_) api_.event_set_free(event_set_);
    if (log_fd_ >= 0) close(log_fd_);
    api_.shutdown();
    // NVML stays loaded: unloading the driver's library buys nothing and some drivers' exit
    // handlers do not survive it.
  }

  std::string name() const override { return "nvml"; }

  Status poll() override {
    if (opts_.thread) return {};
    xid_round(0);
    uint64_t now = mono_ns();
    if (last_sample_ns_ == 0 || now - last_sample_ns_ >= static_cast<uint64_t>(opts_.period_s * 1e9)) {
      last_sample_ns_ = now;
      sample();
    }
    return {};
  }

  Status flush(store::Writer& store, const WindowContext& w) override {
    std::vector<store::Metric> out;
    {
      std::lock_guard lock(m_);
      for (auto& d : devices_) {
        emit(d, out);
        d.w = Window{};
        for (Counter* c : {&d.ecc_corr, &d.ecc_unc, &d.pcie_replays, &d.nvlink_errs}) {
          c->window_new = 0;
          c->seen = false;
        }
      }
    }
    if (out.empty()) return {};
    return store.put_metrics(w.recording, w.start_ns, w.end_ns, out);
  }

  void stats(std::vector<std::pair<std::string, double>>& out) const override {
    std::lock_guard lock(m_);
    out.emplace_back("nvml.devices", static_cast<double>(devices_.size()));
    out.emplace_back("nvml.polls", static_cast<double>(polls_));
    out.emplace_back("nvml.errors", static_cast<double>(errors_));
    out.emplace_back("nvml.poll_ms_mean", polls_ ? static_cast<double>(poll_ns_) / 1e6 / static_cast<double>(polls_) : 0);
    size_t by_events = 0;
    for (const auto& d : devices_) by_events += d.xid_events ? 1 : 0;
    out.emplace_back("nvml.xid_event_devices", static_cast<double>(by_events));  // Xids through NVML events
    out.emplace_back("nvml.xid_kernel_log", log_fd_ >= 0 ? 1 : 0);            // the kernel log is read
    out.emplace_back("nvml.xids", static_cast<double>(xids_));
  }

 private:
  void run() {
    std::unique_lock lock(stop_m_);
    while (!stop_) {
      lock.unlock();
      sample();
      lock.lock();
      stop_cv_.wait_for(lock, std::chrono::duration<double>(opts_.period_s), [this] { return stop_; });
    }
  }

  // Returns whether `r` carried a value. Refusals switch the series off for this device for good;
  // anything else is counted and retried at the next poll.
  bool ok(Device& d, Query q, nvmlReturn_t r) {
    if (r == NVML_SUCCESS) return true;
    switch (r) {
      case NVML_ERROR_NOT_SUPPORTED:
      case NVML_ERROR_NO_PERMISSION:
      case NVML_ERROR_FUNCTION_NOT_FOUND:
      case NVML_ERROR_INVALID_ARGUMENT:  // e.g. a clock type this board does not have
        d.off[q] = true;
        break;
      case NVML_ERROR_GPU_IS_LOST:
        d.lost = true;
        ++errors_;
        break;
      default:
        ++errors_;
    }
    return false;
  }

  static bool want(const Device& d, Query q, bool have_call) { return have_call && !d.off[q]; }

  // Xids: NVML's events for every device that takes the registration; the kernel log for the rest,
  // when their PCI addresses are known (the log names a GPU by nothing else).
  void setup_xids() {
    if (api_.has_events() && api_.event_set_create(&event_set_) == NVML_SUCCESS) {
      for (auto& d : devices_)
        d.xid_events = api_.register_events(d.handle, nvmlEventTypeXidCriticalError, event_set_) == NVML_SUCCESS;
      if (std::none_of(devices_.begin(), devices_.end(), [](const Device& d) { return d.xid_events; })) {
        api_.event_set_free(event_set_);
        event_set_ = nullptr;
      }
    } else {
      event_set_ = nullptr;
    }
    if (opts_.kernel_log.empty() || !api_.pci_info) return;
    bool want_log = false;
    for (auto& d : devices_) {
      if (d.xid_events) continue;
      nvmlPciInfo_t p{};
      if (api_.pci_info(d.handle, &p) == NVML_SUCCESS) {
        d.pci = std::array<unsigned, 3>{p.domain, p.bus, p.device};
        want_log = true;
      }
    }
    if (!want_log) return;
    // Non-blocking, from its end: only Xids raised from now on are this run's. Unreadable (no
    // CAP_SYSLOG under dmesg_restrict, a container without /dev/kmsg): no Xids for those devices.
    log_fd_ = open(opts_.kernel_log.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (log_fd_ >= 0) (void)lseek(log_fd_, 0, SEEK_END);
  }

  bool stopping() {
    std::lock_guard lock(stop_m_);
    return stop_;
  }

  void watch_xids() {
    while (!stopping()) {
      bool waited = false;
      bool got = xid_round(kXidWaitMs, &waited);
      if (!got && !waited) {
        // Nothing blocked this round (no event set, or its wait failed at once): wait here.
        std::unique_lock lock(stop_m_);
        stop_cv_.wait_for(lock, std::chrono::milliseconds(kXidWaitMs), [this] { return stop_; });
      }
    }
  }

  void add_xid(Device& d, unsigned code) {
    std::lock_guard lock(m_);
    d.w.xids.push_back(code);
    ++xids_;
  }

  // One round: the NVML events that arrive within wait_ms, then what the kernel log holds. Whether
  // any Xid came; *waited: whether NVML's wait ran to its timeout.
  bool xid_round(unsigned wait_ms, bool* waited = nullptr) {
    bool got = false;
    if (event_set_) {
      nvmlEventData_t e{};
      nvmlReturn_t r = api_.event_wait(event_set_, &e, wait_ms);
      for (int n = 0; r == NVML_SUCCESS; r = api_.event_wait(event_set_, &e, 0)) {
        if (e.eventType & nvmlEventTypeXidCriticalError) {
          for (auto& d : devices_) {
            if (d.handle == e.device) add_xid(d, static_cast<unsigned>(e.eventData));
          }
          got = true;
        }
        if (++n >= kMaxXidsPerRound) break;
      }
      if (r == NVML_ERROR_TIMEOUT && waited) *waited = wait_ms > 0;
      else if (r != NVML_SUCCESS && r != NVML_ERROR_TIMEOUT) ++errors_;
    }
    if (log_fd_ >= 0) got |= read_kernel_log();
    return got;
  }

  bool read_kernel_log() {
    bool got = false;
    char buf[4096];
    for (int i = 0; i < kMaxLogReadsPerRound; ++i) {
      ssize_t n = read(log_fd_, buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR || errno == EPIPE) continue;  // EPIPE: /dev/kmsg overwrote records we had not read
        break;                                            // EAGAIN: nothing more now
      }
      if (n == 0) break;  // a plain file at its end
      log_buf_.append(buf, static_cast<size_t>(n));
      // /dev/kmsg gives one record per read, a file many lines: split on newlines either way.
      for (size_t nl; (nl = log_buf_.find('\n')) != std::string::npos;) {
        if (auto x = parse_kernel_xid(std::string_view(log_buf_).substr(0, nl))) {
          for (auto& d : devices_) {
            if (!d.xid_events && d.pci && (*d.pci)[0] == x->domain && (*d.pci)[1] == x->bus && (*d.pci)[2] == x->device) {
              add_xid(d, x->code);
              got = true;
            }
          }
        }
        log_buf_.erase(0, nl + 1);
      }
      if (log_buf_.size() > kMaxLogLine) log_buf_.clear();
    }
    return got;
  }

  void discover_nvlinks(Device& d) {
    if (!api_.nvlink_state) return;
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
      nvmlEnableState_t st{};
      if (api_.nvlink_state(d.handle, link, &st) == NVML_SUCCESS) d.nvlinks.push_back(link);
    }
    if (d.nvlinks.empty()) d.off[kNvlink] = d.off[kNvlinkErrors] = d.off[kNvlinkData] = true;
  }

  void sample() {
    uint64_t t0 = mono_ns();
    // The NVML calls run outside the lock, so a flush never waits for a slow driver call; only the
    // fold into the window takes it.
    for (auto& d : devices_) {
      Sample s = read_device(d);
      std::lock_guard lock(m_);
      fold(d, s);
    }
    std::lock_guard lock(m_);
    ++polls_;
    poll_ns_ += mono_ns() - t0;
  }

  struct Sample {
    std::optional<unsigned> sm, mem_clock, max_sm, max_mem, temp, power_mw, power_limit_mw, pcie_tx, pcie_rx,
        link_gen, link_width, link_max_width, nvlinks_active;
    std::optional<nvmlUtilization_t> util;
    std::optional<nvmlMemory_t> memory;
    std::optional<unsigned long long> reasons, ecc_corr, ecc_unc, pcie_replays, nvlink_errs;
    std::optional<std::pair<uint64_t, uint64_t>> nvlink_kib;
    uint64_t t_ns = 0;
  };

  // Only touches `d.off` and `d.lost` besides reading: both are this thread's alone
  // (flush reads neither).
  Sample read_device(Device& d) {
    Sample s;
    s.t_ns = mono_ns();
    nvmlDevice_t h = d.handle;
    unsigned v = 0;
    unsigned long long ull = 0;
    auto u = [&](Query q, bool have_call, auto call, std::optional<unsigned>& dst) {
      if (want(d, q, have_call) && ok(d, q, call())) dst = v;
    };
    u(kSmClock, api_.clock != nullptr, [&] { return api_.clock(h, NVML_CLOCK_SM, &v); }, s.sm);
    u(kMemClock, api_.clock != nullptr, [&] { return api_.clock(h, NVML_CLOCK_MEM, &v); }, s.mem_clock);
    u(kMaxSm, api_.max_clock != nullptr, [&] { return api_.max_clock(h, NVML_CLOCK_SM, &v); }, s.max_sm);
    u(kMaxMem, api_.max_clock != nullptr, [&] { return api_.max_clock(h, NVML_CLOCK_MEM, &v); },
      s.max_mem);
    u(kTemp, api_.temperature != nullptr,
      [&] { return api_.temperature(h, NVML_TEMPERATURE_GPU, &v); }, s.temp);
    u(kPower, api_.power != nullptr, [&] { return api_.power(h, &v); }, s.power_mw);
    u(kPowerLimit, api_.power_limit != nullptr, [&] { return api_.power_limit(h, &v); },
      s.power_limit_mw);
    if (want(d, kUtil, api_.utilization != nullptr)) {
      nvmlUtilization_t x{};
      if (ok(d, kUtil, api_.utilization(h, &x))) s.util = x;
    }
    if (want(d, kMemory, api_.memory != nullptr)) {
      nvmlMemory_t x{};
      if (ok(d, kMemory, api_.memory(h, &x))) s.memory = x;
    }
    if (want(d, kReasonsQ, api_.reasons != nullptr) && ok(d, kReasonsQ, api_.reasons(h, &ull))) {
      s.reasons = ull;
    }
    if (want(d, kEccCorr, api_.ecc != nullptr) &&
        ok(d, kEccCorr, api_.ecc(h, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &ull))) {
      s.ecc_corr = ull;
    }
    if (want(d, kEccUnc, api_.ecc != nullptr) &&
        ok(d, kEccUnc, api_.ecc(h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &ull))) {
      s.ecc_unc = ull;
    }
    u(kPcieTx, api_.pcie_throughput != nullptr,
      [&] { return api_.pcie_throughput(h, NVML_PCIE_UTIL_TX_BYTES, &v); }, s.pcie_tx);
    u(kPcieRx, api_.pcie_throughput != nullptr,
      [&] { return api_.pcie_throughput(h, NVML_PCIE_UTIL_RX_BYTES, &v); }, s.pcie_rx);
    if (want(d, kPcieReplay, api_.pcie_replay != nullptr) &&
        ok(d, kPcieReplay, api_.pcie_replay(h, &v))) {
      s.pcie_replays = v;
    }
    u(kPcieGen, api_.pcie_gen != nullptr, [&] { return api_.pcie_gen(h, &v); }, s.link_gen);
    u(kPcieWidth, api_.pcie_width != nullptr, [&] { return api_.pcie_width(h, &v); }, s.link_width);
    u(kPcieMaxWidth, api_.pcie_max_width != nullptr, [&] { return api_.pcie_max_width(h, &v); },
      s.link_max_width);
    read_nvlinks(d, s);
    return s;
  }

  void read_nvlinks(Device& d, Sample& s) {
    if (d.nvlinks.empty()) return;
    if (want(d, kNvlink, api_.nvlink_state != nullptr)) {
      unsigned up = 0;
      for (unsigned link : d.nvlinks) {
        nvmlEnableState_t st{};
        if (api_.nvlink_state(d.handle, link, &st) == NVML_SUCCESS && st == NVML_FEATURE_ENABLED) ++up;
      }
      s.nvlinks_active = up;
    }
    if (want(d, kNvlinkErrors, api_.nvlink_errors != nullptr)) {
      unsigned long long total = 0;
      bool any = false;
      for (unsigned link : d.nvlinks) {
        for (auto c : {NVML_NVLINK_ERROR_DL_REPLAY, NVML_NVLINK_ERROR_DL_RECOVERY, NVML_NVLINK_ERROR_DL_CRC_FLIT,
                       NVML_NVLINK_ERROR_DL_CRC_DATA}) {
          unsigned long long x = 0;
          if (api_.nvlink_errors(d.handle, link, c, &x) == NVML_SUCCESS) {
            total += x;
            any = true;
          }
        }
      }
      if (any) s.nvlink_errs = total;
      else d.off[kNvlinkErrors] = true;
    }
    if (want(d, kNvlinkData, api_.field_values != nullptr)) {
      std::vector<nvmlFieldValue_t> f(2 * d.nvlinks.size());
      for (size_t i = 0; i < d.nvlinks.size(); ++i) {
        f[2 * i].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
        f[2 * i].scopeId = d.nvlinks[i];
        f[2 * i + 1].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
        f[2 * i + 1].scopeId = d.nvlinks[i];
      }
      if (!ok(d, kNvlinkData, api_.field_values(d.handle, static_cast<int>(f.size()), f.data()))) return;
      // Drivers differ: some count per link, some give every link the GPU's total. Identical
      // cumulative counters on every link are the second kind (per-link byte counts never agree
      // exactly): take one of them instead of the sum.
      std::vector<uint64_t> tx, rx;
      for (size_t i = 0; i < f.size(); ++i) {
        if (f[i].nvmlReturn != NVML_SUCCESS) continue;
        uint64_t x = f[i].valueType == NVML_VALUE_TYPE_DOUBLE ? static_cast<uint64_t>(f[i].value.dVal)
                                                                 : f[i].value.ullVal;
        if (f[i].valueType == NVML_VALUE_TYPE_UNSIGNED_INT) x = f[i].value.uiVal;
        (i % 2 == 0 ? tx : rx).push_back(x);
      }
      if (tx.empty() && rx.empty()) {
        d.off[kNvlinkData] = true;
        return;
      }
      auto total = [](const std::vector<uint64_t>& xs) {
        if (xs.size() > 1 && std::all_of(xs.begin(), xs.end(), [&](uint64_t x) { return x == xs[0]; })) return xs[0];
        uint64_t sum = 0;
        for (uint64_t x : xs) sum += x;
        return sum;
      };
      s.nvlink_kib = std::make_pair(total(tx), total(rx));
    }
  }

  void fold(Device& d, const Sample& s) {
    Window& w = d.w;
    ++w.polls;
    if (s.sm) w.sm.add(*s.sm);
    if (s.mem_clock) w.mem_clock.add(*s.mem_clock);
    if (s.max_sm) w.max_sm = *s.max_sm;
    if (s.max_mem) w.max_mem = *s.max_mem;
    if (s.temp) w.temp.add(*s.temp);
    if (s.power_mw) w.power.add(*s.power_mw / 1000.0);
    if (s.power_limit_mw) w.power_limit = *s.power_limit_mw / 1000.0;
    if (s.util) {
      w.util.add(s.util->gpu);
      w.mem_util.add(s.util->memory);
    }
    if (s.memory) {
      double used = static_cast<double>(s.memory->used) / (1024.0 * 1024.0);
      w.mem_used_max = std::max(w.mem_used_max.value_or(0), used);
      w.mem_total = static_cast<double>(s.memory->total) / (1024.0 * 1024.0);
    }
    if (s.reasons) {
      ++w.reason_polls;
      w.reasons_or |= *s.reasons;
      for (size_t i = 0; i < kReasons.size(); ++i) {
        if (*s.reasons & kReasons[i].bit) ++w.per_reason[i];
      }
      if (*s.reasons & kSlowdownMask) ++w.slowdown_polls;
    }
    if (s.ecc_corr) d.ecc_corr.update(*s.ecc_corr);
    if (s.ecc_unc) d.ecc_unc.update(*s.ecc_unc);
    if (s.pcie_replays) d.pcie_replays.update(*s.pcie_replays);
    if (s.nvlink_errs) d.nvlink_errs.update(*s.nvlink_errs);
    // NVML reports PCIe in KB/s (1024 B).
    if (s.pcie_tx) w.pcie_tx.add(*s.pcie_tx * 1024.0 / 1e6);
    if (s.pcie_rx) w.pcie_rx.add(*s.pcie_rx * 1024.0 / 1e6);
    if (s.link_gen) w.link_gen = *s.link_gen;
    if (s.link_width) w.link_width = *s.link_width;
    if (s.link_max_width) w.link_max_width = *s.link_max_width;
    if (s.nvlinks_active) w.nvlinks_active = *s.nvlinks_active;
    if (s.nvlink_kib) {
      if (d.nvlink_prev && s.nvlink_kib->first >= d.nvlink_prev->first &&
          s.nvlink_kib->second >= d.nvlink_prev->second && s.t_ns > d.nvlink_prev_ns) {
        w.nvlink_tx_bytes += static_cast<double>(s.nvlink_kib->first - d.nvlink_prev->first) * 1024.0;
        w.nvlink_rx_bytes += static_cast<double>(s.nvlink_kib->second - d.nvlink_prev->second) * 1024.0;
        w.nvlink_s += static_cast<double>(s.t_ns - d.nvlink_prev_ns) / 1e9;
        w.nvlink_rate_known = true;
      }
      d.nvlink_prev = s.nvlink_kib;
      d.nvlink_prev_ns = s.t_ns;
    }
    if (d.lost) w.lost = true;
  }

  static void emit(const Device& d, std::vector<store::Metric>& out) {
    const Window& w = d.w;
    std::string label = "gpu" + std::to_string(d.index);
    auto put = [&](const std::string& name, double v) { out.push_back({0, name, label, v}); };
    // Xids whether or not a poll ran (a lost GPU answers no query, but its Xid is the news).
    std::vector<unsigned> xids = w.xids;
    std::sort(xids.begin(), xids.end());
    xids.erase(std::unique(xids.begin(), xids.end()), xids.end());
    for (unsigned x : xids) put("gpu.xid", x);
    if (w.polls == 0) return;
    put("gpu.polls", w.polls);
    if (w.sm.n) {
      put("gpu.sm_clock_mhz", w.sm.mean());
      put("gpu.sm_clock_min_mhz", w.sm.min);
    }
    if (w.max_sm) put("gpu.max_sm_clock_mhz", *w.max_sm);
    if (w.mem_clock.n) put("gpu.mem_clock_mhz", w.mem_clock.mean());
    if (w.max_mem) put("gpu.max_mem_clock_mhz", *w.max_mem);
    if (w.reason_polls) {
      put("gpu.throttle_reasons", static_cast<double>(w.reasons_or));
      for (size_t i = 0; i < kReasons.size(); ++i) {
        if (w.per_reason[i]) put(std::string("gpu.throttle.") + kReasons[i].name, 1.0 * w.per_reason[i] / w.reason_polls);
      }
      put("gpu.throttled", 1.0 * w.slowdown_polls / w.reason_polls);
    }
    if (w.temp.n) {
      put("gpu.temp_c", w.temp.mean());
      put("gpu.temp_max_c", w.temp.max);
    }
    if (w.power.n) put("gpu.power_w", w.power.mean());
    if (w.power_limit) put("gpu.power_limit_w", *w.power_limit);
    if (w.util.n) {
      put("gpu.util_pct", w.util.mean());
      put("gpu.mem_util_pct", w.mem_util.mean());
    }
    if (w.mem_used_max) put("gpu.mem_used_mb", *w.mem_used_max);
    if (w.mem_total) put("gpu.mem_total_mb", *w.mem_total);
    if (d.ecc_corr.seen) put("gpu.ecc_corrected", static_cast<double>(d.ecc_corr.window_new));
    if (d.ecc_unc.seen) put("gpu.ecc_uncorrected", static_cast<double>(d.ecc_unc.window_new));
    if (w.pcie_tx.n) put("gpu.pcie_tx_mb_s", w.pcie_tx.mean());
    if (w.pcie_rx.n) put("gpu.pcie_rx_mb_s", w.pcie_rx.mean());
    if (d.pcie_replays.seen) put("gpu.pcie_replays", static_cast<double>(d.pcie_replays.window_new));
    if (w.link_gen) put("gpu.pcie_link_gen", *w.link_gen);
    if (w.link_width) put("gpu.pcie_link_width", *w.link_width);
    if (w.link_max_width) put("gpu.pcie_link_max_width", *w.link_max_width);
    if (w.nvlinks_active) put("gpu.nvlink_links_active", *w.nvlinks_active);
    if (w.nvlink_rate_known && w.nvlink_s > 0) {
      put("gpu.nvlink_tx_mb_s", w.nvlink_tx_bytes / 1e6 / w.nvlink_s);
      put("gpu.nvlink_rx_mb_s", w.nvlink_rx_bytes / 1e6 / w.nvlink_s);
    }
    if (d.nvlink_errs.seen) put("gpu.nvlink_errors", static_cast<double>(d.nvlink_errs.window_new));
    if (w.lost) put("gpu.lost", 1);
  }

  NvmlApi api_;
  std::vector<Device> devices_;
  NvmlOptions opts_;
  mutable std::mutex m_;  // the windows, counters and stats; not held during NVML calls
  uint64_t polls_ = 0, poll_ns_ = 0;
  std::atomic<uint64_t> errors_{0};
  uint64_t xids_ = 0;  // under m_
  uint64_t last_sample_ns_ = 0;
  // The Xid thread's own (or poll()'s without threads).
  nvmlEventSet_t event_set_ = nullptr;
  int log_fd_ = -1;
  std::string log_buf_;
  std::mutex stop_m_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;  // last: started after everything it uses exists
  std::thread xid_thread_;
};

}  // namespace

std::optional<KernelXid> parse_kernel_xid(std::string_view line) {
  constexpr std::string_view kTag = "NVRM: Xid (";
  auto at = line.find(kTag);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view s = line.substr(at + kTag.size());
  auto eat = [&](std::string_view lit) {
    if (s.substr(0, lit.size()) != lit) return false;
    s.remove_prefix(lit.size());
    return true;
  };
  auto number = [&](int base, unsigned max, unsigned& out) {
    const char* b = s.data();
    auto [p, ec] = std::from_chars(b, b + s.size(), out, base);
    if (ec != std::errc() || p == b || out > max) return false;
    s.remove_prefix(static_cast<size_t>(p - b));
    return true;
  };
  KernelXid x;
  unsigned function = 0;
  (void)eat("PCI:");  // older drivers print the address without it
  // domain:bus:device[.function] as PCI has them: 16 (or 32) bits, 8 bits, 5 bits, 3 bits.
  if (!number(16, 0xffffffffu, x.domain) || !eat(":") || !number(16, 0xff, x.bus) || !eat(":") ||
      !number(16, 0x1f, x.device))
    return std::nullopt;
  if (eat(".") && !number(16, 7, function)) return std::nullopt;
  if (!eat("): ")) return std::nullopt;
  // The Xid: a decimal number (999: one the driver cannot name), then its details or the end.
  if (!number(10, 0xffff, x.code) || x.code == 0) return std::nullopt;
  if (!s.empty() && s.front() != ',' && s.front() != ' ' && s.front() != '\n') return std::nullopt;
  return x;
}

Result<std::unique_ptr<Source>> start_nvml_source(const NvmlOptions& opts) {
  std::string path = opts.library;
  if (path.empty()) {
    const char* env = std::getenv("STRATA_NVML_LIBRARY");
    path = (env && *env) ? env : "libnvidia-ml.so.1";
  }
  auto api = load_nvml(path);
  if (!api) return api.error();
  if (nvmlReturn_t r = api->init(); r != NVML_SUCCESS) {
    return Error{"nvmlInit failed (" + path + "): " + api->error(r)};
  }
  unsigned count = 0;
  if (nvmlReturn_t r = api->get_count(&count); r != NVML_SUCCESS) {
    api->shutdown();
    return Error{"nvmlDeviceGetCount failed: " + api->error(r)};
  }
  std::vector<Device> devices;
  for (unsigned i = 0; i < count; ++i) {
    Device d;
    d.index = i;
    // A device NVML cannot open (lost, or hidden from this container) is skipped; the rest are polled.
    if (api->get_handle(i, &d.handle) == NVML_SUCCESS) devices.push_back(std::move(d));
  }
  if (devices.empty()) {
    api->shutdown();
    return Error{"NVML sees no GPU on this node"};
  }
  NvmlOptions o = opts;
  if (o.period_s < 0) o.period_s = 0;
  return std::unique_ptr<Source>(std::make_unique<NvmlSource>(*api, std::move(devices), std::move(o)));
}

}  // namespace strata::agent
