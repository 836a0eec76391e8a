// strata-sim-rank: one rank of the testbed's training-like job (C++), started by strata-sim like
// torchrun starts a rank (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the env).
//
// A step: load_batch (read the data file) and preprocess on the CPU; copy the batch to the device;
// forward and backward kernels; gradient all-reduce per bucket on a comm stream as backward
// proceeds (DDP), or all-gather before each layer and reduce-scatter after it (FSDP); optimizer
// step; wait for the device. With STRATA_SIM_PP / STRATA_SIM_TP (strata-sim run --pp P --tp T) the
// job is pipeline and tensor parallel instead (see Layout): GPipe micro-batches pass between stages
// with ncclSend/ncclRecv, a TP all-reduce follows each layer, DP replicas all-reduce gradients. It reports each step's times to strata-sim on a pipe:
//   step <rank> <step> <step_ms> <load_ms> <compute_ms> <comm_ms> <collectives> <cpu_ms> <runq_ms>
// compute_ms: forward+backward kernel time on the device (CUDA events on the compute stream);
// comm_ms: time in collectives on the device, waiting for peers included (events on the comm stream);
// cpu_ms: CPU time of all the rank's threads in the step; runq_ms: time they waited runnable.
//
// CPU work is a fixed amount of work, never a fixed time: contention and throttling stretch it.
//
// STRATA_SIM_DRIVER_API=1: the relu and layer-norm kernels are launched through the driver API
// (PTX loaded with cuModuleLoadData and cuLibraryLoadData, cuLaunchKernel and cuLaunchKernelEx by
// turns), as Triton-compiled kernels are. STRATA_SIM_MEMORY_CALLS=1: each step allocates, copies synchronously
// and frees. At the end the rank reports what it did, one line per kind, for the ground truth:
//   calls <rank> <name> <count>     (an API name, or kernel:<name> for a driver-launched kernel)
#include <arpa/inet.h>
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <fcntl.h>
#include <nccl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "testbed/cost_model.h"

extern "C" const void* strata_testbed_kernel(const char* role);

namespace {

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "strata-sim-rank %s: %s\n", std::getenv("RANK") ? std::getenv("RANK") : "?", what.c_str());
  std::exit(1);
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::atoi(v) : fallback;
}

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::atof(v) : fallback;
}

std::string env_str(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : fallback;
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#define CUDA_CHECK(x)                                                               \
  do {                                                                              \
    cudaError_t e_ = (x);                                                           \
    if (e_ != cudaSuccess) die(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#define CU_CHECK(x)                                                                 \
  do {                                                                              \
    CUresult r_ = (x);                                                              \
    if (r_ != CUDA_SUCCESS) die(std::string(#x) + ": CUresult " + std::to_string(static_cast<int>(r_))); \
  } while (0)
#define NCCL_CHECK(x)                                                               \
  do {                                                                              \
    ncclResult_t r_ = (x);                                                          \
    if (r_ != ncclSuccess) die(std::string(#x) + ": " + ncclGetErrorString(r_)); \
  } while (0)

// CPU time of the whole process (every thread), ms.
double process_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

// Time the process's threads have waited runnable on a run queue, ms (the second field of
// /proc/self/task/*/schedstat): what CPU contention and throttling add, read by the rank itself
// so the sim's numbers show the host side without a profiler. Threads that exited drop out; the
// rank's threads live as long as it does.
double runqueue_wait_ms() {
  double total = 0;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return 0;
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::string path = std::string("/proc/self/task/") + e->d_name + "/schedstat";
    FILE* f = std::fopen(path.c_str(), "re");
    if (f == nullptr) continue;
    unsigned long long run = 0, wait = 0;
    if (std::fscanf(f, "%llu %llu", &run, &wait) == 2) total += static_cast<double>(wait) / 1e6;
    std::fclose(f);
  }
  ::closedir(dir);
  return total;
}

// In-process faults (the others are set up from outside by strata-sim).
struct Fault {
  std::string kind;
  int start_step = 1 << 30;
  double ms = 0;      // host-hotspot
  double factor = 1;  // workload-imbalance, slow-cpu
  int tensors = 0;    // alloc-churn
  int copies = 0;     // sync-copy: copies per layer
  double kb = 0;      // sync-copy: KiB per copy
};

Fault parse_fault_env() {
  Fault f;
  std::string spec = env_str("STRATA_SIM_FAULT", "");
  if (spec.empty()) return f;
  f.kind = spec.substr(0, spec.find(':'));
  std::string rest = spec.find(':') == std::string::npos ? "" : spec.substr(spec.find(':') + 1);
  size_t pos = 0;
  while (pos < rest.size()) {
    size_t comma = rest.find(',', pos);
    std::string item = rest.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? rest.size() : comma + 1;
    size_t eq = item.find('=');
    if (eq == std::string::npos) continue;
    std::string key = item.substr(0, eq);
    double v = std::atof(item.c_str() + eq + 1);
    if (key == "start_step") f.start_step = static_cast<int>(v);
    if (key == "ms") f.ms = v;
    if (key == "factor") f.factor = v;
    if (key == "tensors") f.tensors = static_cast<int>(v);
    if (key == "copies") f.copies = static_cast<int>(v);
    if (key == "kb") f.kb = v;
  }
  return f;
}

// ---- the store: rank 0 hands the ncclUniqueIds to the others over MASTER_ADDR:MASTER_PORT -----
// One id per communicator the job creates (the world's first), as torch's c10d store hands each
// process group's id to its members: every rank gets them all, in one fixed order.
std::vector<ncclUniqueId> exchange_unique_ids(int rank, int world, size_t count) {
  std::vector<ncclUniqueId> ids(count);
  const size_t bytes = count * sizeof(ncclUniqueId);
  std::string addr = env_str("MASTER_ADDR", "127.0.0.1");
  if (addr == "localhost") addr = "127.0.0.1";
  int port = env_int("MASTER_PORT", 29500);
  if (rank == 0) {
    for (auto& id : ids) NCCL_CHECK(ncclGetUniqueId(&id));
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    sa.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(fd, 128) != 0) {
      die("store: cannot listen on port " + std::to_string(port) + ": " + std::strerror(errno));
    }
    for (int i = 1; i < world; ++i) {
      int c = ::accept(fd, nullptr, nullptr);
      if (c < 0) die(std::string("store: accept: ") + std::strerror(errno));
      if (::send(c, ids.data(), bytes, MSG_NOSIGNAL) != static_cast<ssize_t>(bytes)) die("store: send");
      ::close(c);
    }
    ::close(fd);
    return ids;
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) die("store: bad MASTER_ADDR " + addr);
  for (int attempt = 0; attempt < 1200; ++attempt) {  // rank 0 may start later: retry for 60 s
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
      size_t got = 0;
      while (got < bytes) {
        ssize_t n = ::recv(fd, reinterpret_cast<char*>(ids.data()) + got, bytes - got, 0);
        if (n <= 0) die("store: rank 0 closed the connection");
        got += static_cast<size_t>(n);
      }
      ::close(fd);
      return ids;
    }
    ::close(fd);
    ::usleep(50000);
  }
  die("store: cannot reach rank 0 at " + addr + ":" + std::to_string(port));
}

// ---- CPU side of a step ------------------------------------------------------------------------
struct DataSource {
  int fd = -1;
  bool direct = false;
  off_t size = 0;
  void* buf = nullptr;  // one sample, aligned for O_DIRECT
};

DataSource open_data() {
  DataSource d;
  std::string path = env_str("STRATA_SIM_DATA", "");
  if (path.empty()) return d;
  d.direct = env_int("STRATA_SIM_DATA_DIRECT", 0) != 0;
  d.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (d.direct ? O_DIRECT : 0));
  if (d.fd < 0) die("cannot open data " + path + ": " + std::strerror(errno));
  d.size = ::lseek(d.fd, 0, SEEK_END);
  ::posix_fadvise(d.fd, 0, 0, POSIX_FADV_RANDOM);  // samples, not a stream: no readahead
  return d;
}

// Fixed CPU work: `units` rounds of a small integer hash over `data`.
__attribute__((noinline)) uint64_t cpu_work(const unsigned char* data, size_t len, long units) {
  uint64_t h = 1469598103934665603ull;
  for (long u = 0; u < units; ++u) {
    for (size_t i = 0; i < len; i += 64) h = (h ^ data[i]) * 1099511628211ull;
  }
  return h;
}

// Reads this step's batch: 4 KiB samples at shuffled offsets of the data file, as a map-style
// dataset does (O_DIRECT on a block device for the io fault). From the page cache this is cheap;
// a rank whose cache is squeezed (memory-reclaim) or whose device is slow (io-stall) stalls here.
// `samples` reads per step (0: as many as fill the batch); more samples than the batch holds are
// folded into it (a loader that reads more records than it keeps, e.g. for shuffling buffers).
__attribute__((noinline)) std::vector<unsigned char> load_batch(DataSource& d, int step, int rank, size_t bytes,
                                                                size_t samples) {
  constexpr size_t kSample = 4096;
  std::vector<unsigned char> batch(bytes);
  if (d.fd < 0 || d.size < static_cast<off_t>(kSample) || bytes == 0) return batch;
  if (d.buf == nullptr) d.buf = std::aligned_alloc(kSample, kSample);
  const uint64_t samples_in_file = static_cast<uint64_t>(d.size) / kSample;
  if (samples == 0) samples = (bytes + kSample - 1) / kSample;
  uint64_t x = (static_cast<uint64_t>(step) << 20) ^ static_cast<uint64_t>(rank) ^ 0x9e3779b97f4a7c15ull;
  size_t at = 0;
  for (size_t i = 0; i < samples; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    auto off = static_cast<off_t>((x % samples_in_file) * kSample);
    if (::pread(d.fd, d.buf, kSample, off) != static_cast<ssize_t>(kSample)) {
      die(std::string("reading data: ") + std::strerror(errno));
    }
    if (at >= bytes) at = 0;
    std::memcpy(batch.data() + at, d.buf, std::min(kSample, bytes - at));
    at += kSample;
  }
  return batch;
}

// The rank's memory-mapped data (page-faults: STRATA_SIM_MAPPED, every rank its own file), as a
// dataset in np.memmap or an Arrow file: mapped once, read page by page.
struct MappedData {
  int fd = -1;
  unsigned char* base = nullptr;
  size_t size = 0;
};

MappedData map_data() {
  MappedData m;
  std::string path = env_str("STRATA_SIM_MAPPED", "");
  if (path.empty()) return m;
  m.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (m.fd < 0) die("cannot open mapped data " + path + ": " + std::strerror(errno));
  m.size = static_cast<size_t>(::lseek(m.fd, 0, SEEK_END));
  void* p = m.size ? ::mmap(nullptr, m.size, PROT_READ, MAP_SHARED, m.fd, 0) : MAP_FAILED;
  if (p == MAP_FAILED) die("cannot map " + path + ": " + std::strerror(errno));
  m.base = static_cast<unsigned char*>(p);
  ::madvise(m.base, m.size, MADV_RANDOM);  // one page a fault: no read-around
  return m;
}

// Reads `pages` pages of the mapped data, every step: from memory, cheap; once the node's memory
// pressure pages them out (page-faults: strata-sim's evictor), each read is a major fault that
// waits for the disk, in this function.
__attribute__((noinline)) uint64_t read_mapped(MappedData& m, int pages) {
  constexpr size_t kPage = 4096;
  if (m.base == nullptr) return 0;
  uint64_t h = 0;
  const size_t n = std::min(m.size / kPage, static_cast<size_t>(std::max(0, pages)));
  for (size_t i = 0; i < n; ++i) h += *static_cast<volatile unsigned char*>(m.base + i * kPage);
  return h;
}

// A data-loader worker (STRATA_SIM_LOAD_WORKER=1), as a PyTorch DataLoader with num_workers=1
// has: a child process of the rank (it inherits RANK) reads the batches the rank asks for and
// sends them back over a pipe, so the rank's reads, and their stalls, happen in its worker.
struct LoadWorker {
  pid_t pid = -1;
  int to = -1, from = -1;  // requests to the worker, batches from it
};

struct LoadRequest {
  int step;
  uint64_t bytes, samples;
};

bool read_all(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t got = ::read(fd, c, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    c += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool write_all(int fd, const void* p, size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t put = ::write(fd, c, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    c += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

// Forked before any CUDA or NCCL thread exists; the worker runs until the rank closes its pipe.
LoadWorker start_load_worker(int rank, int report_fd) {
  LoadWorker w;
  int req[2], rep[2];
  if (::pipe2(req, O_CLOEXEC) != 0 || ::pipe2(rep, O_CLOEXEC) != 0) die(std::string("pipe: ") + std::strerror(errno));
  w.pid = ::fork();
  if (w.pid < 0) die(std::string("fork: ") + std::strerror(errno));
  if (w.pid == 0) {
    ::close(req[1]);
    ::close(rep[0]);
    if (report_fd >= 0) ::close(report_fd);  // the rank reports its steps, not its worker
    ::prctl(PR_SET_NAME, "pt_data_worker");
    DataSource data = open_data();
    LoadRequest r{};
    while (read_all(req[0], &r, sizeof r)) {
      auto batch = load_batch(data, r.step, rank, r.bytes, r.samples);
      if (!write_all(rep[1], batch.data(), batch.size())) break;
    }
    ::_exit(0);
  }
  ::close(req[0]);
  ::close(rep[1]);
  w.to = req[1];
  w.from = rep[0];
  return w;
}

std::vector<unsigned char> load_via(LoadWorker& w, int step, size_t bytes, size_t samples) {
  LoadRequest r{step, bytes, samples};
  std::vector<unsigned char> batch(bytes);
  if (!write_all(w.to, &r, sizeof r) || !read_all(w.from, batch.data(), batch.size())) die("the data-loader worker is gone");
  return batch;
}

// Decodes and augments the batch: fixed CPU work, plus a fresh scratch buffer (anonymous memory
// that must be faulted in each step, as a decoder's output would be).
__attribute__((noinline)) uint64_t preprocess(const std::vector<unsigned char>& batch, long units, size_t scratch_mb) {
  uint64_t h = cpu_work(batch.data(), batch.size(), units);
  if (scratch_mb > 0) {
    size_t n = scratch_mb << 20;
    auto* scratch = static_cast<unsigned char*>(std::malloc(n));  // > mmap threshold: new pages
    for (size_t i = 0; i < n; i += 4096) scratch[i] = static_cast<unsigned char>(h + i);
    h ^= scratch[n / 2];
    std::free(scratch);
  }
  return h;
}

// The host-hotspot fault: an augmentation that costs `units` of CPU on the critical path.
__attribute__((noinline)) uint64_t slow_augment(const std::vector<unsigned char>& batch, long units) {
  uint64_t h = cpu_work(batch.data(), batch.size(), units);
  // Not a tail call: slow_augment keeps its frame, so stacks name it (as the ground truth does).
  asm volatile("" : "+r"(h));
  return h;
}

// ---- device side -------------------------------------------------------------------------------
struct Kernels {
  const void* gemm_fwd = strata_testbed_kernel("gemm_fwd");
  const void* gemm_bwd_data = strata_testbed_kernel("gemm_bwd_data");
  const void* gemm_bwd_weight = strata_testbed_kernel("gemm_bwd_weight");
  const void* relu = strata_testbed_kernel("relu");
  const void* add = strata_testbed_kernel("add");
  const void* layer_norm = strata_testbed_kernel("layer_norm");
  const void* softmax = strata_testbed_kernel("softmax");
  const void* nll_loss = strata_testbed_kernel("nll_loss");
  const void* adam = strata_testbed_kernel("adam");
};

void launch(const void* k, double us, cudaStream_t s) {
  dim3 grid(strata_cost_grid_for_us(static_cast<uint64_t>(us > 1 ? us : 1), 256));
  CUDA_CHECK(cudaLaunchKernel(k, grid, dim3(256), nullptr, 0, s));
}

// What the rank did that a profiler should see, by name: reported at the end (see the top).
std::map<std::string, long> g_calls;

// launch-bound: the optimizer steps its parameters tensor by tensor, as torch.optim does with
// foreach and fused off (or when it falls back for tensors of mixed dtypes or devices): per tensor,
// Adam's elementwise operations one by one, each a tiny kernel. Each costs the host the framework's
// work per operation (kOpHostUs: checks and dispatch, in PyTorch tens of us with Python) and the
// launch (the stand-in's STRATA_COST_LAUNCH_HOST_NS), more than the device needs to run it: the
// device waits for the host. Not inlined: a profiler sees the program's own function.
constexpr int kAdamOpsPerTensor = 5;  // lerp_ (exp_avg), mul_ + addcmul_ (exp_avg_sq), sqrt + addcdiv_
constexpr double kOpHostUs = 8;
__attribute__((noinline)) void optimizer_step_per_tensor(const void* elementwise, int tensors, cudaStream_t s) {
  for (int t = 0; t < tensors; ++t) {
    for (int i = 0; i < kAdamOpsPerTensor; ++i) {
      const double until = now_ms() + kOpHostUs / 1e3;
      while (now_ms() < until) {
      }
      launch(elementwise, 1, s);
    }
  }
  g_calls["cudaLaunchKernel"] += static_cast<long>(tensors) * kAdamOpsPerTensor;
}

// Device memory through the runtime, counted.
void dev_malloc(void** p, size_t bytes) {
  CUDA_CHECK(cudaMalloc(p, bytes));
  ++g_calls["cudaMalloc"];
  g_calls["bytes:cudaMalloc"] += static_cast<long>(bytes);
}

void dev_free(void* p) {
  CUDA_CHECK(cudaFree(p));
  ++g_calls["cudaFree"];
}

// ---- driver-API kernels (STRATA_SIM_DRIVER_API) --------------------------------------------------
// The module Triton would hand the driver: PTX text with two entries, named as Inductor names them.
constexpr const char* kDriverPtx =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry triton_poi_fused_relu_0(.param .u64 in_ptr0, .param .u32 xnumel)\n{\n\tret;\n}\n"
    ".visible .entry triton_red_fused_native_layer_norm_1(.param .u64 in_ptr0, .param .u32 rnumel)\n{\n\tret;\n}\n";

struct DriverKernels {
  CUfunction relu = nullptr, layer_norm = nullptr;
  bool ex_next = false;  // cuLaunchKernel and cuLaunchKernelEx by turns
};

DriverKernels load_driver_kernels() {
  DriverKernels d;
  CU_CHECK(cuInit(0));
  CUmodule mod;
  CU_CHECK(cuModuleLoadData(&mod, kDriverPtx));
  CU_CHECK(cuModuleGetFunction(&d.relu, mod, "triton_poi_fused_relu_0"));
  ++g_calls["cuModuleGetFunction"];
  // The other through CUDA 12's library API (context-independent loading): a CUkernel by name,
  // then its function.
  CUlibrary lib;
  CU_CHECK(cuLibraryLoadData(&lib, kDriverPtx, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel;
  CU_CHECK(cuLibraryGetKernel(&kernel, lib, "triton_red_fused_native_layer_norm_1"));
  ++g_calls["cuLibraryGetKernel"];
  CU_CHECK(cuKernelGetFunction(&d.layer_norm, kernel));
  ++g_calls["cuKernelGetFunction"];
  // Triton asks the driver for a loaded function's name when it reports it (CUDA 12.3+).
  const char* name = nullptr;
  CU_CHECK(cuFuncGetName(&name, d.relu));
  ++g_calls["cuFuncGetName"];
  return d;
}

// `name`: the entry's name in kDriverPtx, for the count.
void launch_driver(DriverKernels& d, CUfunction f, const char* name, double us, cudaStream_t s) {
  unsigned grid = strata_cost_grid_for_us(static_cast<uint64_t>(us > 1 ? us : 1), 256);
  if (d.ex_next) {
    CUlaunchConfig config{};
    config.gridDimX = grid;
    config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = 256;
    config.blockDimY = config.blockDimZ = 1;
    config.hStream = s;  // a runtime stream is a driver stream
    CU_CHECK(cuLaunchKernelEx(&config, f, nullptr, nullptr));
    ++g_calls["cuLaunchKernelEx"];
  } else {
    CU_CHECK(cuLaunchKernel(f, grid, 1, 1, 256, 1, 1, 0, s, nullptr, nullptr));
    ++g_calls["cuLaunchKernel"];
  }
  d.ex_next = !d.ex_next;
  ++g_calls[std::string("kernel:") + name];
}

// ---- pipeline and tensor parallel layout (--pp P --tp T) ----------------------------------------
// Megatron's order: the tensor-parallel position varies fastest, then the data-parallel replica,
// then the pipeline stage. Every group of a kind is a communicator of its own, created as torch's
// new_group creates one (an id from the store, ncclCommInitRankConfig); the world's communicator
// carries one small all-reduce per step across every stage (the gradient norm of clipping).
struct Layout {
  int pp = 1, tp = 1, dp = 1;
  int stage = 0, tp_pos = 0, dp_pos = 0;
  bool model_parallel() const { return pp > 1 || tp > 1; }
  int rank_of(int p, int d, int t) const { return (p * dp + d) * tp + t; }
  // Ids: the world's, then one per TP group (tp > 1), per PP group (pp > 1), per DP group (dp > 1).
  size_t tp_base() const { return 1; }
  size_t pp_base() const { return tp_base() + (tp > 1 ? static_cast<size_t>(pp * dp) : 0); }
  size_t dp_base() const { return pp_base() + (pp > 1 ? static_cast<size_t>(dp * tp) : 0); }
  size_t id_count() const { return dp_base() + (dp > 1 ? static_cast<size_t>(pp * tp) : 0); }
};

Layout make_layout(int rank, int world, int pp, int tp) {
  Layout l;
  l.pp = std::max(1, pp);
  l.tp = std::max(1, tp);
  if (world % (l.pp * l.tp) != 0) die("WORLD_SIZE is not a multiple of STRATA_SIM_PP x STRATA_SIM_TP");
  l.dp = world / (l.pp * l.tp);
  l.tp_pos = rank % l.tp;
  l.dp_pos = (rank / l.tp) % l.dp;
  l.stage = rank / (l.tp * l.dp);
  return l;
}

// Stages differ by design: each stage computes this much of stage 0's work more than the one
// before it (later stages hold more layers and the output head): stage s computes (1 + s) times
// stage 0's work, so a healthy pipeline has stages of unequal speed. Large enough that comparing
// every rank with every other blames the last stage of a healthy 2-stage job (main's engine did).
constexpr double kStageWeightStep = 1.0;
// GPipe: the batch is split into this many micro-batches that flow through the stages.
constexpr int kMicroBatches = 4;
constexpr int kStageLayers = 3;
constexpr size_t kActivationElems = 64 * 1024;  // 256 KiB of fp32 activations per micro-batch
constexpr size_t kTpElems = 16 * 1024;          // 64 KiB partial sums per tensor-parallel all-reduce

struct ModelParallelComms {
  ncclComm_t tp = nullptr, pp = nullptr, dp = nullptr;
};

// Creates this rank's TP, PP and DP communicators. Every rank creates them kind by kind in the same
// order, and the groups of one kind are disjoint, so no init waits on a rank busy with another.
ModelParallelComms init_model_parallel(const Layout& l, int rank, const std::vector<ncclUniqueId>& ids) {
  ModelParallelComms c;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (l.tp > 1) {
    size_t group = static_cast<size_t>(l.stage * l.dp + l.dp_pos);
    NCCL_CHECK(ncclCommInitRankConfig(&c.tp, l.tp, ids[l.tp_base() + group], l.tp_pos, &config));
  }
  if (l.pp > 1) {
    size_t group = static_cast<size_t>(l.dp_pos * l.tp + l.tp_pos);
    NCCL_CHECK(ncclCommInitRankConfig(&c.pp, l.pp, ids[l.pp_base() + group], l.stage, &config));
  }
  if (l.dp > 1) {
    size_t group = static_cast<size_t>(l.stage * l.tp + l.tp_pos);
    NCCL_CHECK(ncclCommInitRankConfig(&c.dp, l.dp, ids[l.dp_base() + group], l.dp_pos, &config));
  }
  (void)rank;
  return c;
}

}  // namespace

int main() {
  const int rank = env_int("RANK", 0);
  const int world = env_int("WORLD_SIZE", 1);
  const int local_rank = env_int("LOCAL_RANK", rank);
  const int steps = env_int("STRATA_SIM_STEPS", 10);
  const double scale = env_double("STRATA_SIM_SCALE", 1.0);
  const bool fsdp = env_str("STRATA_SIM_MODE", "ddp") == "fsdp";
  const int report_fd = env_int("STRATA_SIM_REPORT_FD", -1);
  const size_t scratch_mb = static_cast<size_t>(env_int("STRATA_SIM_SCRATCH_MB", 8));
  const size_t samples = static_cast<size_t>(std::max(0, env_int("STRATA_SIM_SAMPLES", 0)));  // 0: one batch
  const Fault fault = parse_fault_env();
  const bool driver_api = env_int("STRATA_SIM_DRIVER_API", 0) != 0;
  const bool memory_calls = env_int("STRATA_SIM_MEMORY_CALLS", 0) != 0;
  // Before any thread: the data-loader worker, when the rank loads through one.
  LoadWorker worker;
  if (env_int("STRATA_SIM_LOAD_WORKER", 0) != 0) worker = start_load_worker(rank, report_fd);

  constexpr int kLayers = 6;
  constexpr int kBuckets = 3;
  constexpr size_t kBucketElems = 64 * 1024;  // 256 KiB of fp32 gradients per bucket
  constexpr size_t kBatchBytes = 512 * 1024;
  constexpr long kLoadUnits = 1200;  // ~10 ms of CPU per step on this machine
  const double fwd_us = 5000 * scale, bwd_us = 10000 * scale, opt_us = 3000 * scale;

  // Framework start-up before the first CUDA/NCCL call (imports, model construction), as real
  // training processes have: PyTorch takes seconds here. Default 300 ms; STRATA_SIM_STARTUP_MS.
  const int startup_ms = env_int("STRATA_SIM_STARTUP_MS", 300);
  if (startup_ms > 0) ::usleep(static_cast<useconds_t>(startup_ms) * 1000u);

  CUDA_CHECK(cudaSetDevice(local_rank));
  cudaStream_t compute, comm_stream;
  CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking));
  const Layout lay = make_layout(rank, world, env_int("STRATA_SIM_PP", 1), env_int("STRATA_SIM_TP", 1));
  const bool mp = lay.model_parallel();
  auto ids = exchange_unique_ids(rank, world, lay.id_count());
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, world, ids[0], rank));
  const ModelParallelComms mpc = mp ? init_model_parallel(lay, rank, ids) : ModelParallelComms{};
  std::vector<float*> act(2, nullptr);  // model parallel: activations out and in, TP partial sums
  float* tp_buf = nullptr;
  if (mp) {
    for (auto& a : act) dev_malloc(reinterpret_cast<void**>(&a), kActivationElems * sizeof(float));
    dev_malloc(reinterpret_cast<void**>(&tp_buf), kTpElems * sizeof(float));
  }

  Kernels k;
  if (k.gemm_fwd == nullptr) die("libtestbed_kernels.so has no kernels");
  // relu and layer-norm: runtime launches of the stubs, or driver launches of a loaded module.
  DriverKernels drv;
  if (driver_api) drv = load_driver_kernels();
  auto relu = [&](double us, cudaStream_t s) {
    if (driver_api) launch_driver(drv, drv.relu, "triton_poi_fused_relu_0", us, s);
    else launch(k.relu, us, s);
  };
  auto layer_norm = [&](double us, cudaStream_t s) {
    if (driver_api) launch_driver(drv, drv.layer_norm, "triton_red_fused_native_layer_norm_1", us, s);
    else launch(k.layer_norm, us, s);
  };
  std::vector<float*> grads(kBuckets);
  for (auto& g : grads) {
    dev_malloc(reinterpret_cast<void**>(&g), kBucketElems * sizeof(float));
    CUDA_CHECK(cudaMemsetAsync(g, 0, kBucketElems * sizeof(float), compute));
  }
  float* shard = nullptr;  // FSDP: this rank's parameter shard and the gathered layer
  float* gathered = nullptr;
  const size_t shard_elems = kBucketElems / static_cast<size_t>(world);
  dev_malloc(reinterpret_cast<void**>(&shard), shard_elems * sizeof(float) + 4);
  dev_malloc(reinterpret_cast<void**>(&gathered), shard_elems * static_cast<size_t>(world) * sizeof(float) + 4);
  void* d_batch = nullptr;
  dev_malloc(&d_batch, kBatchBytes * 4);
  constexpr size_t kTempBytes = 1 << 20;       // --memory-calls: a step's temporary buffer
  constexpr size_t kChurnBytes = 256 << 10;    // alloc-churn: one temporary (an activation's size here)
  constexpr size_t kReadbackBytes = 1 << 20;   // and the bytes it copies back (~40 us at 25 GB/s)
  std::vector<unsigned char> readback(kReadbackBytes);
  void* copy_src = nullptr;  // sync-copy: the device buffer read back, and where to
  size_t copy_bytes = 0;
  std::vector<unsigned char> copy_dst;

  // Model parallel: per micro-batch and direction a receive, a send and a TP all-reduce per layer.
  const int kMaxComm = mp ? 2 * kMicroBatches * (kStageLayers + 2) + 2 : 2 * kLayers + kBuckets;
  cudaEvent_t c0, c1, grad_ready, comm_done;
  CUDA_CHECK(cudaEventCreate(&c0));
  CUDA_CHECK(cudaEventCreate(&c1));
  CUDA_CHECK(cudaEventCreate(&grad_ready));
  CUDA_CHECK(cudaEventCreate(&comm_done));
  std::vector<cudaEvent_t> cs(kMaxComm), ce(kMaxComm);
  for (int i = 0; i < kMaxComm; ++i) {
    CUDA_CHECK(cudaEventCreate(&cs[i]));
    CUDA_CHECK(cudaEventCreate(&ce[i]));
  }

  // slow_augment's work per ms, measured once before any fault: the fastest of kProbes probes. One
  // probe that the scheduler preempted (seen in CI, with other tests running) measured the work
  // many times too slow, and the fault then added almost no CPU: rank 1's load 24.8 ms against its
  // peers' 24.7 ms under a 50 ms host-hotspot. The Python rank does the same (rank.py PROBES).
  constexpr int kProbes = 5;
  std::vector<unsigned char> probe(kBatchBytes, 1);
  volatile uint64_t sink = 0;
  double best_ms = 1e9;
  for (int i = 0; i < kProbes; ++i) {
    double t_probe = now_ms();
    sink = sink + cpu_work(probe.data(), probe.size(), 8);
    best_ms = std::min(best_ms, now_ms() - t_probe);
  }
  double units_per_ms = 8.0 / std::max(0.05, best_ms);

  DataSource data = worker.pid > 0 ? DataSource{} : open_data();
  MappedData mapped = map_data();
  const int mapped_pages = env_int("STRATA_SIM_MAPPED_PAGES", 0);
  const bool inf_check = env_int("STRATA_SIM_INF_CHECK", 0) != 0;
  for (int step = 0; step < steps; ++step) {
    const bool faulty = step >= fault.start_step;
    const double batch_scale = (faulty && fault.kind == "workload-imbalance") ? fault.factor : 1.0;
    double t0 = now_ms(), cpu0 = process_cpu_ms(), wait0 = runqueue_wait_ms();
    const auto batch_bytes = static_cast<size_t>(kBatchBytes * batch_scale);
    const auto batch_samples = static_cast<size_t>(static_cast<double>(samples) * batch_scale);
    auto batch = worker.pid > 0 ? load_via(worker, step, batch_bytes, batch_samples)
                                : load_batch(data, step, rank, batch_bytes, batch_samples);
    // slow-cpu: the same work, longer (a slower core).
    const double cpu_scale = (faulty && fault.kind == "slow-cpu") ? fault.factor : 1.0;
    sink = sink + preprocess(batch, static_cast<long>(kLoadUnits * batch_scale * cpu_scale), scratch_mb);
    sink = sink + read_mapped(mapped, mapped_pages);  // page-faults: every rank, every step
    if (faulty && fault.kind == "host-hotspot") {
      sink = sink + slow_augment(batch, static_cast<long>(fault.ms * units_per_ms));
    }
    double load_ms = now_ms() - t0;
    // sync-copy: after the step, activations and statistics read back to the host one by one,
    // synchronously (cudaMemcpy), as a loop that logs them with .cpu(): the host waits for every
    // copy before the next step can start.
    const bool copying = faulty && fault.kind == "sync-copy" && fault.copies > 0 && fault.kb > 0;
    if (copying && copy_src == nullptr) {
      copy_bytes = static_cast<size_t>(fault.kb * 1024);
      dev_malloc(&copy_src, copy_bytes);
      copy_dst.resize(copy_bytes);
    }
    auto sync_copies = [&] {
      for (int i = 0; copying && i < fault.copies; ++i) {
        CUDA_CHECK(cudaMemcpy(copy_dst.data(), copy_src, copy_bytes, cudaMemcpyDeviceToHost));
        ++g_calls["cudaMemcpy"];
        g_calls["bytes:cudaMemcpy"] += static_cast<long>(copy_bytes);
      }
    };
    // alloc-churn: a layer's temporaries allocated before its kernels and freed after them, through
    // the runtime, as PyTorch without its caching allocator does. Each cudaFree synchronizes the
    // device first (its documented behaviour): the host waits for the layer's kernels, then the GPU
    // waits for the host's next allocations.
    std::vector<void*> temporaries;
    const size_t churn_tensors = faulty && fault.kind == "alloc-churn" ? static_cast<size_t>(std::max(0, fault.tensors)) : 0;
    auto churn_alloc = [&] {
      temporaries.resize(churn_tensors);
      for (auto& p : temporaries) dev_malloc(&p, kChurnBytes);
    };
    auto churn_free = [&] {
      for (void* p : temporaries) dev_free(p);
      temporaries.clear();
    };

    CUDA_CHECK(cudaMemcpyAsync(d_batch, batch.data(), batch.size(), cudaMemcpyHostToDevice, compute));
    CUDA_CHECK(cudaEventRecord(c0, compute));
    int ncomm = 0;
    // One operation on the comm stream after the compute stream's work so far; compute waits for it.
    auto on_comm = [&](auto&& op) {
      CUDA_CHECK(cudaEventRecord(grad_ready, compute));
      CUDA_CHECK(cudaStreamWaitEvent(comm_stream, grad_ready, 0));
      CUDA_CHECK(cudaEventRecord(cs[ncomm], comm_stream));
      op();
      CUDA_CHECK(cudaEventRecord(ce[ncomm], comm_stream));
      CUDA_CHECK(cudaStreamWaitEvent(compute, ce[ncomm], 0));
      ++ncomm;
    };
    if (mp) {
      // GPipe: every micro-batch forward through the stages, then every one backward. A stage
      // receives from the one before it, computes its layers (a TP all-reduce after each), sends on.
      const double w = (1 + kStageWeightStep * lay.stage) * scale * batch_scale / kMicroBatches;
      const int ne = static_cast<int>(kActivationElems), nt = static_cast<int>(kTpElems);
      for (int dir = 0; dir < 2; ++dir) {
        const bool fwd = dir == 0;
        const int from = fwd ? lay.stage - 1 : lay.stage + 1, to = fwd ? lay.stage + 1 : lay.stage - 1;
        for (int mb = 0; mb < kMicroBatches; ++mb) {
          if (from >= 0 && from < lay.pp)
            on_comm([&] { NCCL_CHECK(ncclRecv(act[1], ne, ncclFloat, from, mpc.pp, comm_stream)); });
          for (int l = 0; l < kStageLayers; ++l) {
            churn_alloc();
            if (fwd) {
              layer_norm(300 * w, compute);
              launch(k.gemm_fwd, 5000 * w, compute);
              relu(200 * w, compute);
            } else {
              launch(k.gemm_bwd_data, 5000 * w, compute);
              launch(k.gemm_bwd_weight, 5000 * w, compute);
              launch(k.add, 200 * w, compute);
            }
            churn_free();
            if (lay.tp > 1)
              on_comm([&] { NCCL_CHECK(ncclAllReduce(tp_buf, tp_buf, nt, ncclFloat, ncclSum, mpc.tp, comm_stream)); });
          }
          if (fwd && lay.stage == lay.pp - 1) {
            launch(k.softmax, 300 * w, compute);
            launch(k.nll_loss, 200 * w, compute);
          }
          if (to >= 0 && to < lay.pp)
            on_comm([&] { NCCL_CHECK(ncclSend(act[0], ne, ncclFloat, to, mpc.pp, comm_stream)); });
        }
      }
      CUDA_CHECK(cudaEventRecord(c1, compute));
      if (lay.dp > 1)
        on_comm([&] { NCCL_CHECK(ncclAllReduce(grads[0], grads[0], kBucketElems, ncclFloat, ncclSum, mpc.dp, comm_stream)); });
      on_comm([&] { NCCL_CHECK(ncclAllReduce(tp_buf, tp_buf, 1, ncclFloat, ncclSum, comm, comm_stream)); });
    }
    // forward (data parallel)
    for (int l = 0; l < kLayers && !mp; ++l) {
      if (fsdp) {  // gather the layer's parameters first
        CUDA_CHECK(cudaEventRecord(cs[ncomm], comm_stream));
        NCCL_CHECK(ncclAllGather(shard, gathered, shard_elems, ncclFloat, comm, comm_stream));
        CUDA_CHECK(cudaEventRecord(ce[ncomm], comm_stream));
        CUDA_CHECK(cudaStreamWaitEvent(compute, ce[ncomm], 0));
        ++ncomm;
      }
      churn_alloc();
      layer_norm(300 * scale * batch_scale, compute);
      launch(k.gemm_fwd, fwd_us * batch_scale, compute);
      relu(200 * scale * batch_scale, compute);
      churn_free();
    }
    if (!mp) {
      launch(k.softmax, 300 * scale * batch_scale, compute);
      launch(k.nll_loss, 200 * scale * batch_scale, compute);
    }
    // backward: gradients leave in buckets as their layers finish (DDP), or per layer (FSDP)
    for (int l = kLayers - 1; l >= 0 && !mp; --l) {
      churn_alloc();
      launch(k.gemm_bwd_data, bwd_us / 2 * batch_scale, compute);
      launch(k.gemm_bwd_weight, bwd_us / 2 * batch_scale, compute);
      launch(k.add, 200 * scale * batch_scale, compute);
      churn_free();
      bool bucket_full = !fsdp && (l % (kLayers / kBuckets) == 0);
      if (fsdp || bucket_full) {
        CUDA_CHECK(cudaEventRecord(grad_ready, compute));
        CUDA_CHECK(cudaStreamWaitEvent(comm_stream, grad_ready, 0));
        CUDA_CHECK(cudaEventRecord(cs[ncomm], comm_stream));
        if (fsdp) {
          NCCL_CHECK(ncclReduceScatter(grads[0], shard, shard_elems, ncclFloat, ncclSum, comm, comm_stream));
        } else {
          float* g = grads[static_cast<size_t>(l / (kLayers / kBuckets))];
          NCCL_CHECK(ncclAllReduce(g, g, kBucketElems, ncclFloat, ncclSum, comm, comm_stream));
        }
        CUDA_CHECK(cudaEventRecord(ce[ncomm], comm_stream));
        ++ncomm;
      }
    }
    if (!mp) CUDA_CHECK(cudaEventRecord(c1, compute));
    // optimizer: needs every reduced gradient
    CUDA_CHECK(cudaEventRecord(comm_done, comm_stream));
    CUDA_CHECK(cudaStreamWaitEvent(compute, comm_done, 0));
    // The host waits for the gradients before the optimizer step, as AMP's GradScaler does to read
    // found_inf (STRATA_SIM_INF_CHECK, every rank of a launch-bound run): the device then idles
    // until the host launches the step's kernels.
    if (inf_check) CUDA_CHECK(cudaStreamSynchronize(compute));
    if (faulty && fault.kind == "launch-bound") {
      optimizer_step_per_tensor(k.add, fault.tensors, compute);
    } else {
      launch(k.adam, opt_us, compute);
    }
    CUDA_CHECK(cudaStreamSynchronize(compute));
    sync_copies();
    if (memory_calls) {
      // A temporary buffer and the loss read back, as `.item()` does: synchronous, blocking for
      // kReadbackBytes / PCIe bandwidth of modeled device time.
      void* tmp = nullptr;
      dev_malloc(&tmp, kTempBytes);
      CUDA_CHECK(cudaMemcpy(readback.data(), d_batch, kReadbackBytes, cudaMemcpyDeviceToHost));
      ++g_calls["cudaMemcpy"];
      g_calls["bytes:cudaMemcpy"] += static_cast<long>(kReadbackBytes);
      dev_free(tmp);
      if (driver_api) {
        CUdeviceptr dp = 0;
        CU_CHECK(cuMemAlloc(&dp, kTempBytes));
        ++g_calls["cuMemAlloc_v2"];
        g_calls["bytes:cuMemAlloc_v2"] += static_cast<long>(kTempBytes);
        CU_CHECK(cuMemFree(dp));
        ++g_calls["cuMemFree_v2"];
      }
    }
    for (ncclComm_t c : {comm, mpc.tp, mpc.pp, mpc.dp}) {
      if (c == nullptr) continue;
      ncclResult_t async = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(c, &async));
      if (async != ncclSuccess) die(std::string("NCCL communicator failed: ") + ncclGetLastError(c));
    }

    float compute_ms = 0, comm_ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&compute_ms, c0, c1));
    for (int i = 0; i < ncomm; ++i) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, cs[i], ce[i]));
      comm_ms += ms;
    }
    // In DDP the comm stream overlaps the backward pass; time it waited for peers is what the
    // events measure, as a profiler on a real GPU would.
    double step_ms = now_ms() - t0;
    double cpu_ms = process_cpu_ms() - cpu0, runq_ms = runqueue_wait_ms() - wait0;
    if (report_fd >= 0) {
      char line[200];
      int n = std::snprintf(line, sizeof(line), "step %d %d %.3f %.3f %.3f %.3f %d %.3f %.3f\n", rank, step, step_ms,
                            load_ms, static_cast<double>(compute_ms), static_cast<double>(comm_ms), ncomm, cpu_ms,
                            runq_ms);
      if (::write(report_fd, line, static_cast<size_t>(n)) != n) die("lost strata-sim (report pipe)");
    }
  }
  for (ncclComm_t c : {mpc.tp, mpc.pp, mpc.dp}) {
    if (c != nullptr) NCCL_CHECK(ncclCommDestroy(c));
  }
  NCCL_CHECK(ncclCommDestroy(comm));
  if (report_fd >= 0) {
    for (const auto& [name, count] : g_calls) {
      std::string line = "calls " + std::to_string(rank) + " " + name + " " + std::to_string(count) + "\n";
      if (::write(report_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) die("lost strata-sim (report pipe)");
    }
  }
  if (worker.pid > 0) {  // its pipe closed, it exits
    ::close(worker.to);
    ::waitpid(worker.pid, nullptr, 0);
  }
  (void)sink;
  return 0;
}
