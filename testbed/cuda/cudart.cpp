// libcudart.so.13 stand-in: the CUDA runtime API on a simulated GPU.
//
// Compiled against the toolkit's own cuda_runtime_api.h, so every exported function has the real
// CUDA 13 signature (the compiler rejects a mismatch). Each stream has a worker thread that runs its
// work in order; a kernel "runs" by sleeping for the duration the cost model gives (cost_model.h),
// times the device's slowdown factor (gpu_state.h), so a simulated GPU costs almost no CPU. Finished
// work is published on the device timeline (timeline.h), as CUPTI activity records would be.
//
// Simplifications (documented, not hidden): the legacy default stream does not synchronize with
// other streams; device memory is host memory; there is no context layer. The driver API stand-in
// (libcuda.so.1, libcuda.cpp) runs its launches and allocations on this library's modeled GPU
// through testbed-private entry points (cudart_internal.h): the reverse of the real layering
// (libcudart calls libcuda), so one process has one modeled GPU whichever API it uses.
#include <cuda_runtime_api.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "testbed/common/testbed_env.h"
#include "testbed/cost_model.h"
#include "testbed/cuda/cudart_internal.h"
#include "testbed/timeline.h"

// The runtime's opaque handle types (the header only declares them).
struct CUevent_st {
  std::mutex m;
  std::condition_variable cv;
  uint64_t recorded = 0;  // generation of the latest cudaEventRecord
  uint64_t done = 0;      // generation the device has reached
  uint64_t time_ns = 0;   // device time when `done` was reached
  bool timing = true;
};

namespace testbed::cuda {
namespace {

enum class OpKind { kKernel, kMemcpy, kMemset, kRecord, kWait, kHostFn, kDeviceFn };

struct Op {
  OpKind kind = OpKind::kKernel;
  const void* func = nullptr;  // kernel / collective stub, or a driver launch's CUfunction
  const char* name = nullptr;  // a driver launch's kernel name (lives as long as its CUfunction)
  uint64_t threads = 0;
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  int value = 0;
  cudaMemcpyKind copy_kind = cudaMemcpyDefault;
  CUevent_st* event = nullptr;
  uint64_t gen = 0;
  cudaHostFn_t host_fn = nullptr;
  strataTestbedDeviceFn device_fn = nullptr;
  void* user = nullptr;
  uint64_t api_ns = 0;
  uint64_t correlation = 0;
  int api_tid = 0;
  uint64_t stream_value = 0;
};

}  // namespace
}  // namespace testbed::cuda

struct CUstream_st {
  int device = 0;
  uint64_t value = 0;  // the cudaStream_t the application sees (0 for the default stream)
  std::mutex m;
  std::condition_variable cv_work;
  std::condition_variable cv_done;
  std::deque<testbed::cuda::Op> queue;
  uint64_t submitted = 0;
  uint64_t completed = 0;
  bool destroying = false;
  // The device clock of this stream: when its last work finished. Work starts at
  // max(device_time, when it was enqueued), so a worker thread woken late by a busy host CPU does
  // not stretch the device's timeline: host CPU trouble shows as launch gaps, not slower kernels.
  uint64_t device_time = 0;  // touched by the worker only
};

namespace testbed::cuda {
namespace {

thread_local int t_device = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

int current_tid() { return static_cast<int>(::syscall(SYS_gettid)); }

// ---- device timeline -----------------------------------------------------------------------------
class Timeline {
 public:
  // The kernel's name as the timeline records it.
  std::string name_of(const Op& op) {
    std::lock_guard lock(m_);
    return display_name(op);
  }

  void append(const Op& op, int device, uint64_t start_ns, uint64_t end_ns, uint32_t kind) {
    std::lock_guard lock(m_);
    if (!ensure_open()) return;
    uint64_t n = header_->write_index;
    auto& rec = records_[n % header_->capacity];
    std::atomic_ref<uint64_t>(rec.seq).store(0, std::memory_order_release);
    rec.kind = kind;
    rec.device = device;
    rec.start_ns = start_ns;
    rec.end_ns = end_ns;
    rec.api_ns = op.api_ns;
    rec.correlation_id = op.correlation;
    rec.func = reinterpret_cast<uint64_t>(op.func);
    rec.stream = op.stream_value;
    rec.bytes = op.bytes;
    rec.grid_threads = op.threads;
    rec.api_tid = op.api_tid;
    rec.copy_kind = static_cast<uint32_t>(op.copy_kind);
    std::memset(rec.name, 0, sizeof(rec.name));
    const std::string& name = display_name(op);
    std::memcpy(rec.name, name.data(), std::min(name.size(), sizeof(rec.name) - 1));
    std::atomic_ref<uint64_t>(rec.seq).store(n + 1, std::memory_order_release);
    std::atomic_ref<uint64_t>(header_->write_index).store(n + 1, std::memory_order_release);
  }

 private:
  // Opens (or, after a fork, reopens) this process's file.
  bool ensure_open() {
    int pid = static_cast<int>(::getpid());
    if (header_ != nullptr && pid == pid_) return true;
    if (failed_ && pid == pid_) return false;
    pid_ = pid;
    header_ = nullptr;
    std::string path = timeline_dir() + "/" + std::to_string(pid) + ".timeline";
    const uint32_t capacity = STRATA_TIMELINE_DEFAULT_CAPACITY;
    size_t size = STRATA_TIMELINE_HEADER_SIZE + size_t{capacity} * sizeof(strata_timeline_record);
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      std::fprintf(stderr, "testbed cudart: cannot create timeline %s: %s\n", path.c_str(),
                   std::strerror(errno));
      if (fd >= 0) ::close(fd);
      failed_ = true;
      return false;
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) {
      failed_ = true;
      return false;
    }
    header_ = static_cast<strata_timeline_header*>(p);
    records_ = reinterpret_cast<strata_timeline_record*>(static_cast<char*>(p) +
                                                         STRATA_TIMELINE_HEADER_SIZE);
    header_->version = STRATA_TIMELINE_VERSION;
    header_->header_size = STRATA_TIMELINE_HEADER_SIZE;
    header_->record_size = sizeof(strata_timeline_record);
    header_->capacity = capacity;
    header_->pid = pid;
    header_->clock_id = CLOCK_MONOTONIC;
    header_->start_ns = monotonic_ns();
    std::atomic_ref<uint64_t>(header_->magic).store(STRATA_TIMELINE_MAGIC, std::memory_order_release);
    return true;
  }

  // The symbol of the stub, demangled, as a profiler would show it; cached per stub.
  const std::string& display_name(const Op& op) {
    static const std::string kMemcpy = "[CUDA memcpy]";
    static const std::string kMemset = "[CUDA memset]";
    if (op.kind == OpKind::kMemcpy) return kMemcpy;
    if (op.kind == OpKind::kMemset) return kMemset;
    auto it = names_.find(op.func);
    if (it != names_.end()) return it->second;
    if (op.name != nullptr) return names_.emplace(op.func, op.name).first->second;  // driver launch
    std::string name = "<unknown kernel>";
    Dl_info info{};
    if (op.func != nullptr && ::dladdr(op.func, &info) != 0 && info.dli_sname != nullptr) {
      int status = 0;
      char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      name = (status == 0 && demangled) ? demangled : info.dli_sname;
      std::free(demangled);
    }
    return names_.emplace(op.func, std::move(name)).first->second;
  }

  std::mutex m_;
  int pid_ = 0;
  bool failed_ = false;
  strata_timeline_header* header_ = nullptr;
  strata_timeline_record* records_ = nullptr;
  std::unordered_map<const void*, std::string> names_;
};

// ---- process-wide state --------------------------------------------------------------------------
// Heap-allocated and never destroyed: stream workers may still run while the process exits, and
// must not find destroyed globals.
struct Runtime {
  std::mutex m;
  std::set<CUstream_st*> streams;
  CUstream_st* default_streams[STRATA_GPU_STATE_MAX_DEVICES] = {};
  std::unordered_map<void*, size_t> allocations;
  std::atomic<uint64_t> correlation{0};
  Timeline timeline;
  double static_slowdown = 1.0;
  int device_count = 8;
};

Runtime& rt() {
  static Runtime* r = [] {
    auto* runtime = new Runtime;
    if (const char* s = std::getenv("STRATA_TESTBED_GPU_SLOWDOWN"); s && *s) {
      double f = std::strtod(s, nullptr);
      if (f >= 1.0) runtime->static_slowdown = f;
    }
    strata_gpu_state* state = map_gpu_state();
    runtime->device_count = static_cast<int>(state ? state->num_devices : configured_device_count());
    return runtime;
  }();
  return *r;
}

strata_gpu_device_state* device_state(int device) {
  strata_gpu_state* state = map_gpu_state();
  if (state == nullptr || device < 0 || device >= static_cast<int>(STRATA_GPU_STATE_MAX_DEVICES)) {
    return nullptr;
  }
  return &state->dev[device];
}

cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

// A hung device executes nothing: the worker waits (sleeping, not spinning) until the fault clears.
void wait_while_hung(strata_gpu_device_state* ds) {
  if (ds == nullptr) return;
  while (std::atomic_ref<uint32_t>(ds->hang).load(std::memory_order_acquire) != 0) {
    sleep_until_ns(monotonic_ns() + 20'000'000);
  }
}

double slowdown(strata_gpu_device_state* ds) {
  double f = rt().static_slowdown;
  if (ds != nullptr) {
    float injected = std::atomic_ref<float>(ds->slowdown).load(std::memory_order_relaxed);
    if (injected > 1.0f) f *= injected;
  }
  return f;
}

// One kernel slower than the rest (a kernel regression after an upgrade): its factor, else 1.
double kernel_slowdown(strata_gpu_device_state* ds, const Op& op) {
  if (ds == nullptr || op.kind != OpKind::kKernel) return 1.0;
  float f = std::atomic_ref<float>(ds->kernel_slowdown).load(std::memory_order_acquire);
  if (!(f > 1.0f)) return 1.0;
  char want[sizeof ds->slow_kernel + 1] = {};
  std::memcpy(want, ds->slow_kernel, sizeof ds->slow_kernel);
  return want[0] != 0 && rt().timeline.name_of(op).find(want) != std::string::npos ? f : 1.0;
}

// How far ahead of real time the device's modeled clock may run before the worker sleeps it off.
constexpr uint64_t kSleepSlackNs = 50'000;

void add_busy(strata_gpu_device_state* ds, uint64_t ns) {
  if (ds != nullptr) std::atomic_ref<uint64_t>(ds->busy_ns).fetch_add(ns, std::memory_order_relaxed);
}

void execute(CUstream_st* s, Op& op) {
  strata_gpu_device_state* ds = device_state(s->device);
  if (ds != nullptr && std::atomic_ref<uint32_t>(ds->hang).load(std::memory_order_acquire) != 0) {
    wait_while_hung(ds);
    s->device_time = std::max(s->device_time, monotonic_ns());  // the device clock stood still
  }
  uint64_t ready = std::max(s->device_time, op.api_ns);  // when the device can start this work
  switch (op.kind) {
    case OpKind::kKernel:
    case OpKind::kMemcpy:
    case OpKind::kMemset: {
      uint64_t cost = STRATA_COST_LAUNCH_NS;
      uint32_t kind = STRATA_TL_KERNEL;
      if (op.kind == OpKind::kKernel) {
        cost += op.threads * STRATA_COST_PS_PER_THREAD / 1000;
      } else if (op.kind == OpKind::kMemcpy) {
        kind = STRATA_TL_MEMCPY;
        if (op.bytes > 0) std::memmove(op.dst, op.src, op.bytes);
        bool on_device = op.copy_kind == cudaMemcpyDeviceToDevice;
        cost += op.bytes * 1000 /
                (on_device ? STRATA_COST_HBM_BYTES_PER_US : STRATA_COST_PCIE_BYTES_PER_US);
      } else {
        kind = STRATA_TL_MEMSET;
        if (op.bytes > 0) std::memset(op.dst, op.value, op.bytes);
        cost += op.bytes * 1000 / STRATA_COST_HBM_BYTES_PER_US;
      }
      uint64_t end = ready + static_cast<uint64_t>(static_cast<double>(cost) * slowdown(ds) * kernel_slowdown(ds, op));
      // The modeled clock is exact either way (the next op starts at `end`); only when the work
      // completes in real time moves. A sleep per tiny kernel would cost the host a wake-up each,
      // CPU time a real GPU never takes from its process (thousands per step when a rank launches
      // tiny kernels one by one): a kernel that ends within kSleepSlackNs completes at once. Copies
      // and sets keep their time exactly: a synchronous copy's host waits for each one.
      if (op.kind != OpKind::kKernel || end > monotonic_ns() + kSleepSlackNs) sleep_until_ns(end);
      s->device_time = end;
      add_busy(ds, end - ready);
      rt().timeline.append(op, s->device, ready, end, kind);
      break;
    }
    case OpKind::kRecord: {
      std::lock_guard lock(op.event->m);
      op.event->done = std::max(op.event->done, op.gen);
      op.event->time_ns = ready;
      s->device_time = ready;
      op.event->cv.notify_all();
      break;
    }
    case OpKind::kWait: {
      std::unique_lock lock(op.event->m);
      op.event->cv.wait(lock, [&] { return op.event->done >= op.gen; });
      s->device_time = std::max(ready, op.event->time_ns);
      break;
    }
    case OpKind::kHostFn:
      op.host_fn(op.user);
      s->device_time = std::max(ready, monotonic_ns());
      break;
    case OpKind::kDeviceFn: {
      // Communication runs in real time: it waits for real peers.
      sleep_until_ns(ready);
      uint64_t start = std::max(ready, monotonic_ns());
      op.device_fn(op.user);  // failures are the caller's to record (NCCL's async error)
      uint64_t end = monotonic_ns();
      s->device_time = end;
      add_busy(ds, end - start);
      rt().timeline.append(op, s->device, start, end, STRATA_TL_COLLECTIVE);
      break;
    }
  }
}

void worker_loop(CUstream_st* s) {
  for (;;) {
    Op op;
    {
      std::unique_lock lock(s->m);
      s->cv_work.wait(lock, [&] { return !s->queue.empty() || s->destroying; });
      if (s->queue.empty()) break;  // destroying and drained
      op = s->queue.front();
      s->queue.pop_front();
    }
    execute(s, op);
    {
      std::lock_guard lock(s->m);
      ++s->completed;
    }
    s->cv_done.notify_all();
  }
  // cudaStreamDestroy returned long ago; the stream's resources go once its work is done.
  {
    std::lock_guard lock(rt().m);
    rt().streams.erase(s);
  }
  delete s;
}

CUstream_st* new_stream(int device, bool is_default) {
  auto* s = new CUstream_st;
  s->device = device;
  s->value = is_default ? 0 : reinterpret_cast<uint64_t>(s);
  rt().streams.insert(s);  // caller holds rt().m
  std::thread(worker_loop, s).detach();
  return s;
}

// Maps a cudaStream_t to its stream; the default-stream handles (0, legacy, per-thread) to the
// current device's default stream. Returns nullptr for an unknown handle.
CUstream_st* resolve(cudaStream_t handle) {
  std::lock_guard lock(rt().m);
  auto raw = reinterpret_cast<uintptr_t>(handle);
  if (raw <= 2) {
    CUstream_st*& d = rt().default_streams[t_device];
    if (d == nullptr) d = new_stream(t_device, true);
    return d;
  }
  auto* s = reinterpret_cast<CUstream_st*>(handle);
  return rt().streams.count(s) ? s : nullptr;
}

uint64_t submit(CUstream_st* s, Op op) {
  if (op.api_ns == 0) op.api_ns = monotonic_ns();
  std::lock_guard lock(s->m);
  op.stream_value = s->value;
  s->queue.push_back(op);
  s->cv_work.notify_one();
  return ++s->submitted;
}

void wait_stream(CUstream_st* s, uint64_t ticket) {
  std::unique_lock lock(s->m);
  s->cv_done.wait(lock, [&] { return s->completed >= ticket; });
}

Op api_op(OpKind kind) {
  Op op;
  op.kind = kind;
  op.api_ns = monotonic_ns();
  op.api_tid = current_tid();
  op.correlation = rt().correlation.fetch_add(1, std::memory_order_relaxed) + 1;
  return op;
}

bool valid_device(int device) { return device >= 0 && device < rt().device_count; }

// The work of the exported calls, shared by the runtime and the driver stand-in. Exported calls
// never call each other here: on a real runtime cudaMemcpy does not go through cudaMemcpyAsync,
// and a probe on one must not fire for the other.
cudaError_t memcpy_async(void* dst, const void* src, size_t count, cudaMemcpyKind kind, cudaStream_t stream) {
  if (count > 0 && (dst == nullptr || src == nullptr)) return set_error(cudaErrorInvalidValue);
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  Op op = api_op(OpKind::kMemcpy);
  op.dst = dst;
  op.src = src;
  op.bytes = count;
  op.copy_kind = kind;
  submit(s, op);
  return cudaSuccess;
}

cudaError_t stream_sync(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  uint64_t ticket;
  {
    std::lock_guard lock(s->m);
    ticket = s->submitted;
  }
  wait_stream(s, ticket);
  return cudaSuccess;
}

void device_sync() {
  std::vector<std::pair<CUstream_st*, uint64_t>> tickets;
  {
    std::lock_guard lock(rt().m);
    for (CUstream_st* s : rt().streams) {
      if (s->device != t_device) continue;
      std::lock_guard slock(s->m);
      tickets.emplace_back(s, s->submitted);
    }
  }
  // A stream destroyed meanwhile drains before it goes, so waiting on it stays safe only while it
  // is registered; re-resolve each one.
  for (auto& [s, ticket] : tickets) {
    {
      std::lock_guard lock(rt().m);
      if (!rt().streams.count(s)) continue;
    }
    wait_stream(s, ticket);
  }
}

// A launch's host side takes CPU time on the calling thread, as the runtime's and the driver's do
// (STRATA_COST_LAUNCH_HOST_NS, spinning: a profiler sees it on the CPU inside the launch call). Many
// tiny kernels then leave the device waiting for the host: a launch-bound step.
void launch_host_work() {
  const uint64_t until = monotonic_ns() + STRATA_COST_LAUNCH_HOST_NS;
  while (monotonic_ns() < until) {
  }
}

// Allocation and release take host time, as the driver's do (page tables, a device-wide sync on
// free): STRATA_COST_MALLOC_NS / STRATA_COST_FREE_NS on the calling thread, sleeping (CPU-cheap).
cudaError_t device_malloc(void** devPtr, size_t size) {
  if (devPtr == nullptr) return set_error(cudaErrorInvalidValue);
  if (size == 0) {
    *devPtr = nullptr;
    return cudaSuccess;
  }
  uint64_t until = monotonic_ns() + STRATA_COST_MALLOC_NS;
  size_t rounded = (size + 255) / 256 * 256;  // cudaMalloc alignment is 256 bytes
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return set_error(cudaErrorMemoryAllocation);
  {
    std::lock_guard lock(rt().m);
    rt().allocations[p] = rounded;
  }
  if (auto* ds = device_state(t_device)) {
    std::atomic_ref<uint64_t>(ds->mem_used).fetch_add(rounded, std::memory_order_relaxed);
  }
  *devPtr = p;
  sleep_until_ns(until);
  return cudaSuccess;
}

// cudaFree synchronizes the device first (its documented behavior), then releases.
cudaError_t device_free(void* devPtr) {
  if (devPtr == nullptr) return cudaSuccess;
  size_t size = 0;
  {
    std::lock_guard lock(rt().m);
    auto it = rt().allocations.find(devPtr);
    if (it == rt().allocations.end()) return set_error(cudaErrorInvalidDevicePointer);
  }
  device_sync();
  uint64_t until = monotonic_ns() + STRATA_COST_FREE_NS;
  {
    std::lock_guard lock(rt().m);
    auto it = rt().allocations.find(devPtr);
    if (it == rt().allocations.end()) return set_error(cudaErrorInvalidDevicePointer);  // freed meanwhile
    size = it->second;
    rt().allocations.erase(it);
  }
  if (auto* ds = device_state(t_device)) {
    std::atomic_ref<uint64_t>(ds->mem_used).fetch_sub(size, std::memory_order_relaxed);
  }
  std::free(devPtr);
  sleep_until_ns(until);
  return cudaSuccess;
}

}  // namespace
}  // namespace testbed::cuda

using namespace testbed::cuda;

// ---- exported CUDA runtime API -------------------------------------------------------------------
// Built with -fvisibility=hidden: the API, and only it, is exported (the version script names it).
#pragma GCC visibility push(default)
extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return set_error(cudaErrorInvalidValue);
  *count = rt().device_count;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (!valid_device(device)) return set_error(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return set_error(cudaErrorInvalidValue);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return set_error(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return set_error(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    default: return "unknown error";
  }
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int /*flags*/) {
  if (pStream == nullptr) return set_error(cudaErrorInvalidValue);
  std::lock_guard lock(rt().m);
  *pStream = new_stream(t_device, false);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) { return cudaStreamCreateWithFlags(pStream, 0); }

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* pStream, unsigned int flags, int /*priority*/) {
  return cudaStreamCreateWithFlags(pStream, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (reinterpret_cast<uintptr_t>(stream) <= 2) return set_error(cudaErrorInvalidResourceHandle);
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(s->m);
  s->destroying = true;
  s->cv_work.notify_one();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) { return stream_sync(stream); }

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(s->m);
  return s->completed >= s->submitted ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
  device_sync();
  return cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void* func, dim3 gridDim, dim3 blockDim, void** /*args*/,
                             size_t /*sharedMem*/, cudaStream_t stream) {
  if (func == nullptr) return set_error(cudaErrorInvalidValue);  // cudaErrorInvalidDeviceFunction on a GPU
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  launch_host_work();
  Op op = api_op(OpKind::kKernel);
  op.func = func;
  op.threads = uint64_t{gridDim.x} * gridDim.y * gridDim.z * blockDim.x * blockDim.y * blockDim.z;
  submit(s, op);
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  if (fn == nullptr) return set_error(cudaErrorInvalidValue);
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  Op op = api_op(OpKind::kHostFn);
  op.host_fn = fn;
  op.user = userData;
  submit(s, op);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return memcpy_async(dst, src, count, kind, stream);
}

// Synchronous: returns when the copy is done, after count / bandwidth of modeled device time.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  cudaError_t e = memcpy_async(dst, src, count, kind, nullptr);
  if (e != cudaSuccess) return e;
  return stream_sync(nullptr);
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  if (count > 0 && devPtr == nullptr) return set_error(cudaErrorInvalidValue);
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  Op op = api_op(OpKind::kMemset);
  op.dst = devPtr;
  op.value = value;
  op.bytes = count;
  submit(s, op);
  return cudaSuccess;
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  cudaError_t e = cudaMemsetAsync(devPtr, value, count, nullptr);
  if (e != cudaSuccess) return e;
  return stream_sync(nullptr);
}

cudaError_t cudaMalloc(void** devPtr, size_t size) { return device_malloc(devPtr, size); }

cudaError_t cudaFree(void* devPtr) { return device_free(devPtr); }

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (ptr == nullptr) return set_error(cudaErrorInvalidValue);
  *ptr = std::malloc(size == 0 ? 1 : size);
  return *ptr ? cudaSuccess : set_error(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void* ptr) {
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return set_error(cudaErrorInvalidValue);
  auto* e = new CUevent_st;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  // Work already enqueued may still reference the event; like the driver, defer the release. The
  // testbed keeps destroyed events (a few bytes each) rather than track references.
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  Op op;
  op.kind = OpKind::kRecord;
  op.event = event;
  {
    std::lock_guard lock(event->m);
    op.gen = ++event->recorded;
  }
  submit(s, op);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int /*flags*/) {
  if (event == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  Op op;
  op.kind = OpKind::kWait;
  op.event = event;
  {
    std::lock_guard lock(event->m);
    op.gen = event->recorded;
  }
  if (op.gen == 0) return cudaSuccess;  // never recorded: nothing to wait for
  submit(s, op);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  std::lock_guard lock(event->m);
  return event->done >= event->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  std::unique_lock lock(event->m);
  uint64_t target = event->recorded;
  event->cv.wait(lock, [&] { return event->done >= target; });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || start == nullptr || end == nullptr) return set_error(cudaErrorInvalidValue);
  if (!start->timing || !end->timing) return set_error(cudaErrorInvalidResourceHandle);
  uint64_t t0, t1;
  {
    std::lock_guard lock(start->m);
    if (start->recorded == 0) return set_error(cudaErrorInvalidResourceHandle);
    if (start->done < start->recorded) return cudaErrorNotReady;
    t0 = start->time_ns;
  }
  {
    std::lock_guard lock(end->m);
    if (end->recorded == 0) return set_error(cudaErrorInvalidResourceHandle);
    if (end->done < end->recorded) return cudaErrorNotReady;
    t1 = end->time_ns;
  }
  *ms = static_cast<float>((static_cast<double>(t1) - static_cast<double>(t0)) / 1e6);
  return cudaSuccess;
}

// ---- testbed-private (cudart_internal.h) --------------------------------------------------------
cudaError_t strataTestbedLaunchDeviceFn(cudaStream_t stream, const void* stub, uint64_t bytes,
                                        strataTestbedDeviceFn fn, void* user) {
  if (fn == nullptr) return set_error(cudaErrorInvalidValue);
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  Op op = api_op(OpKind::kDeviceFn);
  op.func = stub;
  op.bytes = bytes;
  op.device_fn = fn;
  op.user = user;
  submit(s, op);
  return cudaSuccess;
}

int strataTestbedStreamDevice(cudaStream_t stream) {
  CUstream_st* s = resolve(stream);
  return s ? s->device : t_device;
}

cudaError_t strataTestbedLaunchNamed(cudaStream_t stream, const void* func, const char* name, uint64_t threads) {
  if (func == nullptr || name == nullptr) return set_error(cudaErrorInvalidValue);
  CUstream_st* s = resolve(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  launch_host_work();
  Op op = api_op(OpKind::kKernel);
  op.func = func;
  op.name = name;
  op.threads = threads;
  submit(s, op);
  return cudaSuccess;
}

cudaError_t strataTestbedMalloc(void** devPtr, size_t size) { return device_malloc(devPtr, size); }

cudaError_t strataTestbedFree(void* devPtr) { return device_free(devPtr); }

int strataTestbedDeviceCount(void) { return rt().device_count; }

}  // extern "C"
#pragma GCC visibility pop
