// libstrata_cupti.so: the GPU timing source on real GPUs. The CUDA driver loads the library named by
// CUDA_INJECTION64_PATH when the process calls cuInit and calls InitializeInjection (the CUPTI
// injection convention), so `strata record` gets device-side kernel, copy and memset times — NCCL's
// kernels included — without changing the job. Records go into the process's GPU timeline file
// (abi/gpu_timeline.h) at $STRATA_TIMELINE_DIR/<pid>.timeline, CLOCK_MONOTONIC, which the agent's
// GPU timing source follows exactly as it follows the testbed's.
//
// Fail safe above all: libcupti is dlopened (never linked), every CUPTI call is checked, and any
// failure leaves the process untouched and writes nothing. The file is created at the first record,
// so a process without GPU work leaves no file behind.
//
// What it costs the process: CUPTI's concurrent-kernel tracing (no serialization), plus an enter
// callback on the launch / async copy APIs only (a clock read and five stores into a fixed table),
// which gives each record its host thread, call time and stream. Buffers are bounded (kMaxBuffers
// x kBufferSize); beyond that CUPTI drops records and the loss is counted, never waited for.
//
// One CUPTI client per process: a job that runs PyTorch's profiler (Kineto) at the same time
// competes for the callbacks. STRATA_CUPTI_CALLBACKS=0 leaves the API callbacks to the job (records
// then lack their host thread and call time); STRATA_CUPTI_VERBOSE=1 says on stderr what happened.
#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/gpu/cupti/timeline_writer.h"

namespace strata::agent::cupti {
namespace {

constexpr size_t kBufferSize = 2u << 20;  // bytes per CUPTI activity buffer
constexpr int kMaxBuffers = 32;           // in flight at once: 64 MiB at most
constexpr auto kFlushPeriod = std::chrono::milliseconds(250);
constexpr size_t kApiSlots = 1u << 16;  // launches remembered until their record arrives

uint64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("STRATA_CUPTI_VERBOSE");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return v;
}

void note(const std::string& msg) {
  if (verbose()) std::fprintf(stderr, "strata-cupti[%d]: %s\n", static_cast<int>(getpid()), msg.c_str());
}

// The CUPTI entry points, looked up in the libcupti this process can load. Types come from cupti.h.
struct CuptiApi {
  decltype(&cuptiGetVersion) get_version = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityRegisterTimestampCallback) register_timestamp = nullptr;
  decltype(&cuptiGetTimestamp) get_timestamp = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiActivityGetNumDroppedRecords) dropped = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiSubscribe) subscribe = nullptr;
  decltype(&cuptiUnsubscribe) unsubscribe = nullptr;
  decltype(&cuptiEnableCallback) enable_callback = nullptr;

  std::string error(CUptiResult r) const {
    const char* s = nullptr;
    if (result_string) result_string(r, &s);
    return std::string(s ? s : "CUPTI error") + " (" + std::to_string(static_cast<int>(r)) + ")";
  }
};

// Where libcupti may be: the user's choice, the loader's search path, next to the CUDA libraries
// the process already mapped (pip wheels put it beside libcudart), the toolkit.
std::vector<std::string> cupti_candidates() {
  std::vector<std::string> out;
  if (const char* e = std::getenv("STRATA_CUPTI_LIBRARY"); e && *e) out.push_back(e);
  out.push_back("libcupti.so.13");
  std::vector<std::string> dirs;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* d = static_cast<std::vector<std::string>*>(data);
        std::string p = info->dlpi_name ? info->dlpi_name : "";
        auto slash = p.rfind('/');
        if (slash == std::string::npos) return 0;
        std::string base = p.substr(slash + 1);
        if (base.rfind("libcudart.so", 0) == 0 || base.rfind("libcuda.so", 0) == 0 ||
            base.rfind("libnccl.so", 0) == 0) {
          d->push_back(p.substr(0, slash));
          d->push_back(p.substr(0, slash) + "/../../cuda_cupti/lib");  // nvidia-*-cu1x wheel layout
        }
        return 0;
      },
      &dirs);
  dirs.push_back("/usr/local/cuda/lib64");
  dirs.push_back("/usr/local/cuda/extras/CUPTI/lib64");
  for (const auto& d : dirs) out.push_back(d + "/libcupti.so.13");
  return out;
}

template <typename Fn>
bool sym(void* lib, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  return out != nullptr;
}

bool load_cupti(CuptiApi& a) {
  void* lib = nullptr;
  std::string tried;
  for (const auto& c : cupti_candidates()) {
    lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      note("loaded " + c);
      break;
    }
    tried += " " + c;
  }
  if (!lib) {
    note("no libcupti.so.13 (tried" + tried + "); set STRATA_CUPTI_LIBRARY");
    return false;
  }
  bool ok = sym(lib, "cuptiGetVersion", a.get_version) && sym(lib, "cuptiGetResultString", a.result_string) &&
            sym(lib, "cuptiActivityRegisterCallbacks", a.register_callbacks) &&
            sym(lib, "cuptiActivityEnable", a.enable) && sym(lib, "cuptiActivityDisable", a.disable) &&
            sym(lib, "cuptiActivityGetNextRecord", a.next_record) &&
            sym(lib, "cuptiActivityGetNumDroppedRecords", a.dropped) &&
            sym(lib, "cuptiActivityFlushAll", a.flush_all) && sym(lib, "cuptiGetTimestamp", a.get_timestamp);
  // Optional: older CUPTI lacks the timestamp callback; the callback API is only for host context.
  sym(lib, "cuptiActivityRegisterTimestampCallback", a.register_timestamp);
  sym(lib, "cuptiSubscribe", a.subscribe);
  sym(lib, "cuptiUnsubscribe", a.unsubscribe);
  sym(lib, "cuptiEnableCallback", a.enable_callback);
  if (!ok) {
    note("libcupti lacks the activity API");
    return false;
  }
  uint32_t v = 0;
  // Records are read through cupti.h's CUDA 13 layouts: another major version may lay them out
  // differently, so it is refused rather than misread.
  if (a.get_version(&v) != CUPTI_SUCCESS || v / 10000 != CUPTI_API_VERSION / 10000) {
    note("libcupti API version " + std::to_string(v) + " is not the CUDA 13 one this library reads (" +
         std::to_string(CUPTI_API_VERSION) + ")");
    return false;
  }
  return true;
}

// What the launching call looked like, by correlation id: written on the application's thread at
// API entry, read when the device record arrives. A fixed table, no locks: a slot is overwritten
// 65536 launches later, and a torn read is caught by re-checking the id.
struct ApiSlot {
  std::atomic<uint64_t> correlation{0};
  std::atomic<uint64_t> api_ns{0};
  std::atomic<uint64_t> stream{0};
  std::atomic<uint64_t> func{0};
  std::atomic<int32_t> tid{0};
};

struct State {
  CuptiApi api;
  CUpti_SubscriberHandle subscriber = nullptr;
  int64_t clock_offset_ns = 0;  // added to CUPTI times when the timestamp callback is unavailable
  ApiSlot slots[kApiSlots];
  std::mutex writer_m;  // one writer per file: CUPTI may complete buffers on several threads
  std::unique_ptr<TimelineWriter> writer;
  bool writer_failed = false;
  pid_t pid = 0;
  std::atomic<int> buffers{0};
  std::atomic<uint64_t> records{0}, dropped{0}, refused_buffers{0};
  std::mutex flush_m;
  std::condition_variable flush_cv;
  bool stopping = false;
  std::thread flusher;
};

State* g_state = nullptr;  // set once by InitializeInjection; never freed (callbacks may still run)
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_tracing{false};  // start() succeeded

thread_local int32_t t_tid = 0;

uint64_t CUPTIAPI monotonic_timestamp() { return mono_ns(); }

void remember_launch(uint32_t correlation, uint64_t stream, uint64_t func) {
  if (t_tid == 0) t_tid = static_cast<int32_t>(syscall(SYS_gettid));
  ApiSlot& s = g_state->slots[correlation % kApiSlots];
  s.correlation.store(0, std::memory_order_relaxed);
  s.api_ns.store(mono_ns(), std::memory_order_relaxed);
  s.stream.store(stream, std::memory_order_relaxed);
  s.func.store(func, std::memory_order_relaxed);
  s.tid.store(t_tid, std::memory_order_relaxed);
  s.correlation.store(correlation, std::memory_order_release);
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER || g_state == nullptr) return;
  const void* p = cb->functionParams;
  uint64_t stream = 0, func = 0;
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    switch (cbid) {
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000: {
        const auto* a = static_cast<const cudaLaunchKernel_v7000_params*>(p);
        stream = reinterpret_cast<uint64_t>(a->stream);
        func = reinterpret_cast<uint64_t>(a->func);
        break;
      }
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060:
      case CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060: {
        const auto* a = static_cast<const cudaLaunchKernelExC_v11060_params*>(p);
        stream = a->config ? reinterpret_cast<uint64_t>(a->config->stream) : 0;
        func = reinterpret_cast<uint64_t>(a->func);
        break;
      }
      case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020:
        stream = reinterpret_cast<uint64_t>(static_cast<const cudaMemcpyAsync_v3020_params*>(p)->stream);
        break;
      case CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020:
        stream = 0;  // synchronous: the legacy default stream; its copy gets the calling thread and time
        break;
      case CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020:
        stream = reinterpret_cast<uint64_t>(static_cast<const cudaMemsetAsync_v3020_params*>(p)->stream);
        break;
      default:
        break;
    }
  } else if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    switch (cbid) {
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
        stream = reinterpret_cast<uint64_t>(static_cast<const cuLaunchKernel_params*>(p)->hStream);
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
      case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
        const auto* a = static_cast<const cuLaunchKernelEx_params*>(p);
        stream = a->config ? reinterpret_cast<uint64_t>(a->config->hStream) : 0;
        break;
      }
      default:
        break;
    }
  }
  remember_launch(cb->correlationId, stream, func);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *max_records = 0;  // as many as fit
  *buffer = nullptr;
  *size = 0;
  if (g_state->buffers.fetch_add(1) >= kMaxBuffers) {
    // Bounded memory: CUPTI drops the records it cannot place, and reports them as dropped.
    g_state->buffers.fetch_sub(1);
    g_state->refused_buffers.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  void* p = std::aligned_alloc(8, kBufferSize);  // CUPTI needs 8-byte alignment
  if (!p) {
    g_state->buffers.fetch_sub(1);
    return;
  }
  *buffer = static_cast<uint8_t*>(p);
  *size = kBufferSize;
}

// Kernel names as CUPTI gives them are mangled; the timeline carries a readable, short one.
void set_name(strata_timeline_record& r, const char* mangled) {
  if (!mangled) mangled = "";
  int status = 0;
  char* dem = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && dem ? dem : mangled;
  std::free(dem);
  if (name.rfind("void ", 0) == 0) name.erase(0, 5);
  // Too long for the slot: the argument list goes first (the kernel's own name matters most).
  if (name.size() >= STRATA_TIMELINE_NAME_LEN) {
    if (auto paren = name.find('('); paren != std::string::npos && paren > 0) name.resize(paren);
  }
  std::strncpy(r.name, name.c_str(), STRATA_TIMELINE_NAME_LEN - 1);
  r.name[STRATA_TIMELINE_NAME_LEN - 1] = '\0';
}

// NCCL's device kernels: ncclDevKernel_<Coll>_<Op>_<type>_<algo>_<proto> (2.19+), ncclKernel_* before;
// matched inside the mangled name too (_Z40ncclDevKernel_AllReduce_...).
bool is_nccl_kernel(const char* name) {
  return name && (std::strstr(name, "ncclDevKernel") != nullptr || std::strstr(name, "ncclKernel_") != nullptr);
}

uint32_t cuda_copy_kind(uint8_t cupti_kind) {
  switch (cupti_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return 0;  // cudaMemcpyHostToHost
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return 1;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return 2;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return 3;
    default: return 4;  // cudaMemcpyDefault: array copies and unknown
  }
}

const char* copy_name(uint8_t cupti_kind) {
  switch (cupti_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP: return "memcpy PtoP";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH: return "memcpy HtoH";
    default: return "memcpy";
  }
}

// Host context from the launch table; without it, the CUPTI stream id stands in for the stream
// (it still separates streams, though it is not the cudaStream_t value).
void fill_host(strata_timeline_record& r, uint32_t correlation, uint32_t stream_id) {
  r.correlation_id = correlation;
  r.stream = stream_id;
  const ApiSlot& s = g_state->slots[correlation % kApiSlots];
  if (s.correlation.load(std::memory_order_acquire) != correlation) return;
  uint64_t api_ns = s.api_ns.load(std::memory_order_relaxed);
  uint64_t stream = s.stream.load(std::memory_order_relaxed);
  uint64_t func = s.func.load(std::memory_order_relaxed);
  int32_t tid = s.tid.load(std::memory_order_relaxed);
  if (s.correlation.load(std::memory_order_acquire) != correlation) return;  // overwritten meanwhile
  r.api_ns = api_ns;
  r.api_tid = tid;
  r.stream = stream;
  (void)func;  // the host stub is not symbolizable for library kernels; CUPTI's name is used instead
}

uint64_t to_mono(uint64_t cupti_ns) {
  return cupti_ns == 0 ? 0 : static_cast<uint64_t>(static_cast<int64_t>(cupti_ns) + g_state->clock_offset_ns);
}

bool convert(const CUpti_Activity* rec, strata_timeline_record& r) {
  std::memset(&r, 0, sizeof r);
  switch (rec->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
      r.kind = is_nccl_kernel(k->name) ? STRATA_TL_COLLECTIVE : STRATA_TL_KERNEL;
      r.device = static_cast<int32_t>(k->deviceId);
      r.start_ns = to_mono(k->start);
      r.end_ns = to_mono(k->end);
      r.grid_threads = static_cast<uint64_t>(k->gridX) * k->gridY * k->gridZ * k->blockX * k->blockY * k->blockZ;
      fill_host(r, k->correlationId, k->streamId);
      set_name(r, k->name);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
      r.kind = STRATA_TL_MEMCPY;
      r.device = static_cast<int32_t>(m->deviceId);
      r.start_ns = to_mono(m->start);
      r.end_ns = to_mono(m->end);
      r.bytes = m->bytes;
      r.copy_kind = cuda_copy_kind(m->copyKind);
      fill_host(r, m->correlationId, m->streamId);
      std::strncpy(r.name, copy_name(m->copyKind), STRATA_TIMELINE_NAME_LEN - 1);
      return true;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
      r.kind = STRATA_TL_MEMSET;
      r.device = static_cast<int32_t>(m->deviceId);
      r.start_ns = to_mono(m->start);
      r.end_ns = to_mono(m->end);
      r.bytes = m->bytes;
      fill_host(r, m->correlationId, m->streamId);
      std::strncpy(r.name, "memset", STRATA_TIMELINE_NAME_LEN - 1);
      return true;
    }
    default:
      return false;
  }
}

void write_record(const strata_timeline_record& r) {
  std::lock_guard lock(g_state->writer_m);
  // A forked child inherits this state but not the right to the parent's file.
  if (getpid() != g_state->pid || g_state->writer_failed) return;
  if (!g_state->writer) {
    auto w = TimelineWriter::create(TimelineWriter::default_path(g_state->pid), STRATA_TIMELINE_DEFAULT_CAPACITY,
                                    mono_ns());
    if (!w) {
      g_state->writer_failed = true;  // say it once, then stay quiet
      note(w.error().message);
      return;
    }
    g_state->writer = std::move(*w);
    note("writing " + g_state->writer->path());
  }
  g_state->writer->append(r);
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t, size_t valid) {
  if (buffer) {
    CUpti_Activity* rec = nullptr;
    while (g_state->api.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
      strata_timeline_record r;
      if (convert(rec, r)) {
        write_record(r);
        g_state->records.fetch_add(1, std::memory_order_relaxed);
      }
    }
    std::free(buffer);
    g_state->buffers.fetch_sub(1);
  }
  size_t dropped = 0;
  if (g_state->api.dropped(ctx, stream_id, &dropped) == CUPTI_SUCCESS && dropped > 0) {
    g_state->dropped.fetch_add(dropped, std::memory_order_relaxed);
  }
}

// Delivers completed records a few times a second, so the agent sees them while the job runs
// (CUPTI on its own hands buffers over only when they fill).
void flush_loop() {
  std::unique_lock lock(g_state->flush_m);
  while (!g_state->stopping) {
    g_state->flush_cv.wait_for(lock, kFlushPeriod, [] { return g_state->stopping; });
    if (g_state->stopping) break;
    lock.unlock();
    g_state->api.flush_all(0);
    lock.lock();
  }
}

void at_exit() {
  if (!g_state || getpid() != g_state->pid) return;
  {
    std::lock_guard lock(g_state->flush_m);
    g_state->stopping = true;
  }
  g_state->flush_cv.notify_all();
  if (g_state->flusher.joinable()) g_state->flusher.join();
  // Forced: the last, partly filled buffers too. Fails harmlessly if CUDA is already torn down.
  g_state->api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  note("records " + std::to_string(g_state->records.load()) + ", dropped by CUPTI " +
       std::to_string(g_state->dropped.load()));
}

void subscribe_launches(State& s) {
  const char* e = std::getenv("STRATA_CUPTI_CALLBACKS");
  if (e && std::strcmp(e, "0") == 0) return;
  if (!s.api.subscribe || !s.api.enable_callback) return;
  if (CUptiResult r = s.api.subscribe(&s.subscriber, on_api, nullptr); r != CUPTI_SUCCESS) {
    // Another CUPTI client (a profiler) holds the callbacks: records come without host context.
    note("no API callbacks: " + s.api.error(r));
    s.subscriber = nullptr;
    return;
  }
  for (CUpti_CallbackId id : {CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000,
                              CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_ptsz_v7000,
                              CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_v11060,
                              CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernelExC_ptsz_v11060,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemcpy_v3020,
                              CUPTI_RUNTIME_TRACE_CBID_cudaMemsetAsync_v3020}) {
    s.api.enable_callback(1, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API, id);
  }
  // NCCL and some libraries launch through the driver API directly.
  for (CUpti_CallbackId id : {CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
                              CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz}) {
    s.api.enable_callback(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
  }
}

bool start() {
  auto* s = new State();  // never freed: CUPTI may call back until the process ends
  if (!load_cupti(s->api)) {
    delete s;
    return false;
  }
  s->pid = getpid();
  g_state = s;
  // CLOCK_MONOTONIC timestamps straight from CUPTI when it allows (it converts GPU times through
  // this clock); else a fixed offset measured now, between two reads of our clock.
  bool own_clock = s->api.register_timestamp && s->api.register_timestamp(monotonic_timestamp) == CUPTI_SUCCESS;
  if (!own_clock) {
    uint64_t a = mono_ns(), c = 0;
    if (s->api.get_timestamp(&c) != CUPTI_SUCCESS) c = 0;
    uint64_t b = mono_ns();
    s->clock_offset_ns = c ? static_cast<int64_t>(a / 2 + b / 2) - static_cast<int64_t>(c) : 0;
  }
  if (CUptiResult r = s->api.register_callbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS) {
    note("cuptiActivityRegisterCallbacks: " + s->api.error(r));
    g_state = nullptr;  // nothing was enabled; the half-set-up state stays allocated, unused
    return false;
  }
  int enabled = 0;
  for (CUpti_ActivityKind k : {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                               CUPTI_ACTIVITY_KIND_MEMSET}) {
    CUptiResult r = s->api.enable(k);
    if (r == CUPTI_SUCCESS) ++enabled;
    else note("cuptiActivityEnable(" + std::to_string(static_cast<int>(k)) + "): " + s->api.error(r));
  }
  if (enabled == 0) return false;  // no GPU or no driver: nothing will ever arrive
  subscribe_launches(*s);
  s->flusher = std::thread(flush_loop);
  std::atexit(at_exit);
  note("tracing kernels, copies and memsets");
  return true;
}

}  // namespace
}  // namespace strata::agent::cupti

// Called by the CUDA driver (CUDA_INJECTION64_PATH) once, at cuInit. Returns 1 when tracing, 0 when
// it stays out of the way; the driver carries on either way.
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  using namespace strata::agent::cupti;
  bool expected = false;
  if (!g_initialized.compare_exchange_strong(expected, true)) return g_tracing.load() ? 1 : 0;
  try {
    g_tracing.store(start());
    return g_tracing.load() ? 1 : 0;
  } catch (...) {
    // Nothing may escape into the driver's cuInit.
    return 0;
  }
}
