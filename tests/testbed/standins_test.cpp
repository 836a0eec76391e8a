// The stand-ins against the CUDA toolkit's own headers: this file includes cuda.h, cuda_runtime_api.h
// and nccl.h, links libcuda.so.1 / libcudart.so.13 / libnccl.so.2 / libnvidia-ml.so.1 from
// build/testbed/lib, and
// checks behaviour (ABI compatibility is the compiler's and linker's part of the check).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "testbed/cost_model.h"
#include "testbed/gpu_state.h"
#include "testbed/nvml_abi.h"
#include "testbed/timeline.h"

extern "C" const void* strata_testbed_kernel(const char* role);

namespace {

// A private testbed dir, set before any stand-in reads it (they read it once).
std::string g_dir = [] {
  char tmpl[] = "/tmp/strata-standins-test-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  ::setenv("STRATA_TESTBED_DIR", dir.c_str(), 1);
  ::setenv("STRATA_TIMELINE_DIR", dir.c_str(), 1);  // the device timelines too (abi/gpu_timeline.h)
  return dir;
}();

// Removes the private dir when the test program ends (forked ranks leave with _exit, not here).
struct DirCleanup {
  ~DirCleanup() { std::filesystem::remove_all(g_dir); }
} g_cleanup;

strata_gpu_state* map_state() {
  int fd = ::open((g_dir + "/gpu-state").c_str(), O_RDWR);
  if (fd < 0) return nullptr;
  void* p = ::mmap(nullptr, sizeof(strata_gpu_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<strata_gpu_state*>(p);
}

TEST(Cudart, DevicesStreamsAndEventTiming) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  EXPECT_EQ(n, 8);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  EXPECT_EQ(cudaSetDevice(99), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);

  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaEvent_t a, b;
  ASSERT_EQ(cudaEventCreate(&a), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&b), cudaSuccess);
  const void* gemm = strata_testbed_kernel("gemm_fwd");
  ASSERT_NE(gemm, nullptr);
  ASSERT_EQ(cudaEventRecord(a, s), cudaSuccess);
  // Four 5 ms kernels: the events measure at least their modeled 20 ms.
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(cudaLaunchKernel(gemm, dim3(strata_cost_grid_for_us(5000, 256)), dim3(256), nullptr, 0, s),
              cudaSuccess);
  }
  ASSERT_EQ(cudaEventRecord(b, s), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(b), cudaSuccess);
  float ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
  EXPECT_GE(ms, 20.0f);

  // Memory round trip through "device" memory.
  void* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 1024), cudaSuccess);
  std::vector<char> in(1024, 'x'), out(1024, 0);
  ASSERT_EQ(cudaMemcpyAsync(d, in.data(), 1024, cudaMemcpyHostToDevice, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out.data(), d, 1024, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(in, out);
  EXPECT_EQ(cudaFree(d), cudaSuccess);
  EXPECT_EQ(cudaFree(out.data()), cudaErrorInvalidDevicePointer);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  cudaSetDevice(0);
}

TEST(Cudart, TimelineNamesKernelsByTheirStub) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  const void* add = strata_testbed_kernel("add");
  ASSERT_EQ(cudaLaunchKernel(add, dim3(100), dim3(128), nullptr, 0, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);

  std::string path = g_dir + "/" + std::to_string(::getpid()) + ".timeline";
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << path;
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(p, MAP_FAILED);
  auto* h = static_cast<const strata_timeline_header*>(p);
  EXPECT_EQ(h->magic, STRATA_TIMELINE_MAGIC);
  EXPECT_EQ(h->version, STRATA_TIMELINE_VERSION);
  EXPECT_EQ(h->record_size, sizeof(strata_timeline_record));
  auto* recs = reinterpret_cast<const strata_timeline_record*>(static_cast<const char*>(p) + h->header_size);
  bool found = false;
  for (uint64_t i = 0; i < h->write_index; ++i) {
    const auto& r = recs[i % h->capacity];
    EXPECT_EQ(r.seq, i + 1);
    EXPECT_LE(r.start_ns, r.end_ns);
    EXPECT_LE(r.api_ns, r.start_ns);
    if (r.func == reinterpret_cast<uint64_t>(add)) {
      found = true;
      EXPECT_EQ(r.kind, STRATA_TL_KERNEL);
      EXPECT_EQ(r.grid_threads, 12800u);
      EXPECT_EQ(r.stream, reinterpret_cast<uint64_t>(s));
      EXPECT_NE(std::string(r.name).find("at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>"),
                std::string::npos)
          << r.name;
      // The exported symbol of the stub is the kernel's mangled name, as nvcc's host stubs are.
      Dl_info info{};
      ASSERT_NE(::dladdr(add, &info), 0);
      EXPECT_STREQ(info.dli_sname,
                   "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_15CUDAFunctor_addIfEENS_6detail5ArrayIPcLi3EEEEEviT0_T1_");
    }
  }
  EXPECT_TRUE(found);
  ::munmap(p, static_cast<size_t>(st.st_size));
}

// This process's device timeline records, in order.
std::vector<strata_timeline_record> timeline_records() {
  std::vector<strata_timeline_record> out;
  std::string path = g_dir + "/" + std::to_string(::getpid()) + ".timeline";
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return out;
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return out;
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return out;
  auto* h = static_cast<const strata_timeline_header*>(p);
  auto* recs = reinterpret_cast<const strata_timeline_record*>(static_cast<const char*>(p) + h->header_size);
  for (uint64_t i = h->write_index > h->capacity ? h->write_index - h->capacity : 0; i < h->write_index; ++i)
    out.push_back(recs[i % h->capacity]);
  ::munmap(p, static_cast<size_t>(st.st_size));
  return out;
}

// The driver API (libcuda.so.1): a PTX module's entries are its kernels; launches run on the same
// modeled GPU as runtime launches and appear on the timeline under the kernel's name, with their
// CUfunction as the function.
TEST(CudaDriver, ModulesLaunchesAndMemory) {
  CUmodule mod = nullptr;
  EXPECT_EQ(cuModuleLoadData(&mod, ".entry k()"), CUDA_ERROR_NOT_INITIALIZED) << "cuInit comes first";
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  int version = 0;
  ASSERT_EQ(cuDriverGetVersion(&version), CUDA_SUCCESS);
  EXPECT_EQ(version, CUDA_VERSION);
  EXPECT_EQ(cuModuleLoadData(&mod, "no kernels here"), CUDA_ERROR_INVALID_IMAGE);
  const char* ptx = ".version 8.0\n.target sm_90\n"
                    ".visible .entry triton_poi_fused_add_0(.param .u64 p)\n{\n ret;\n}\n"
                    ".visible .entry triton_per_fused_sum_1(.param .u64 p)\n{\n ret;\n}\n";
  ASSERT_EQ(cuModuleLoadData(&mod, ptx), CUDA_SUCCESS);
  CUfunction add = nullptr, sum = nullptr, again = nullptr, missing = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&add, mod, "triton_poi_fused_add_0"), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&sum, mod, "triton_per_fused_sum_1"), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&again, mod, "triton_poi_fused_add_0"), CUDA_SUCCESS);
  EXPECT_EQ(add, again) << "one handle per function";
  EXPECT_NE(add, sum);
  EXPECT_EQ(cuModuleGetFunction(&missing, mod, "nope"), CUDA_ERROR_NOT_FOUND);
  const char* name = nullptr;
  ASSERT_EQ(cuFuncGetName(&name, sum), CUDA_SUCCESS);
  EXPECT_STREQ(name, "triton_per_fused_sum_1");

  cudaStream_t s;  // a runtime stream is a driver stream
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cuLaunchKernel(add, 100, 1, 1, 128, 1, 1, 0, s, nullptr, nullptr), CUDA_SUCCESS);
  CUlaunchConfig config{};
  config.gridDimX = strata_cost_grid_for_us(2000, 256);
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 256;
  config.blockDimY = config.blockDimZ = 1;
  config.hStream = s;
  ASSERT_EQ(cuLaunchKernelEx(&config, sum, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuLaunchKernel(nullptr, 1, 1, 1, 1, 1, 1, 0, s, nullptr, nullptr), CUDA_ERROR_INVALID_HANDLE);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);

  int seen_add = 0, seen_sum = 0;
  for (const auto& r : timeline_records()) {
    if (r.func == reinterpret_cast<uint64_t>(add)) {
      ++seen_add;
      EXPECT_STREQ(r.name, "triton_poi_fused_add_0");
      EXPECT_EQ(r.kind, STRATA_TL_KERNEL);
      EXPECT_EQ(r.grid_threads, 12800u);
      EXPECT_EQ(r.stream, reinterpret_cast<uint64_t>(s));
    } else if (r.func == reinterpret_cast<uint64_t>(sum)) {
      ++seen_sum;
      EXPECT_STREQ(r.name, "triton_per_fused_sum_1");
      // The modeled time of its grid (device time on the timeline, not a host measurement).
      uint64_t threads = uint64_t{config.gridDimX} * 256;
      EXPECT_EQ(r.end_ns - r.start_ns, STRATA_COST_LAUNCH_NS + threads * STRATA_COST_PS_PER_THREAD / 1000);
    }
  }
  EXPECT_EQ(seen_add, 1);
  EXPECT_EQ(seen_sum, 1);

  // Device memory through the driver: the same allocations the runtime keeps.
  CUdeviceptr dp = 0;
  EXPECT_EQ(cuMemAlloc(&dp, 0), CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemAlloc(&dp, 4096), CUDA_SUCCESS);
  EXPECT_NE(dp, 0u);
  std::vector<char> in(4096, 'y'), out(4096, 0);
  ASSERT_EQ(cudaMemcpy(reinterpret_cast<void*>(dp), in.data(), in.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(out.data(), reinterpret_cast<void*>(dp), out.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(in, out) << "a synchronous copy is done when it returns";
  EXPECT_EQ(cuMemFree(dp), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFree(dp), CUDA_ERROR_INVALID_VALUE) << "freed twice";
  EXPECT_EQ(cuModuleUnload(mod), CUDA_SUCCESS);

  // CUDA 12's library API: a CUkernel by name launches as is, or through its function.
  CUlibrary lib = nullptr;
  ASSERT_EQ(cuLibraryLoadData(&lib, ptx, nullptr, nullptr, 0, nullptr, nullptr, 0), CUDA_SUCCESS);
  CUkernel kernel = nullptr;
  EXPECT_EQ(cuLibraryGetKernel(&kernel, lib, "nope"), CUDA_ERROR_NOT_FOUND);
  ASSERT_EQ(cuLibraryGetKernel(&kernel, lib, "triton_per_fused_sum_1"), CUDA_SUCCESS);
  ASSERT_EQ(cuKernelGetName(&name, kernel), CUDA_SUCCESS);
  EXPECT_STREQ(name, "triton_per_fused_sum_1");
  CUfunction from_kernel = nullptr;
  ASSERT_EQ(cuKernelGetFunction(&from_kernel, kernel), CUDA_SUCCESS);
  ASSERT_EQ(cuFuncGetName(&name, from_kernel), CUDA_SUCCESS);
  EXPECT_STREQ(name, "triton_per_fused_sum_1");
  ASSERT_EQ(cuLaunchKernel(reinterpret_cast<CUfunction>(kernel), 10, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(from_kernel, 20, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  int by_kernel = 0, by_function = 0;
  for (const auto& r : timeline_records()) {
    if (r.func == reinterpret_cast<uint64_t>(kernel)) {
      ++by_kernel;
      EXPECT_STREQ(r.name, "triton_per_fused_sum_1");
      EXPECT_EQ(r.grid_threads, 320u);
    } else if (r.func == reinterpret_cast<uint64_t>(from_kernel)) {
      ++by_function;
      EXPECT_STREQ(r.name, "triton_per_fused_sum_1");
      EXPECT_EQ(r.grid_threads, 640u);
    }
  }
  EXPECT_EQ(by_kernel, 1);
  EXPECT_EQ(by_function, 1);
  EXPECT_EQ(cuLibraryUnload(lib), CUDA_SUCCESS);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(Cudart, InjectedSlowdownAndHangComeFromTheGpuState) {
  int one = 0;
  ASSERT_EQ(cudaGetDeviceCount(&one), cudaSuccess);  // makes sure the state file exists
  strata_gpu_state* gs = map_state();
  ASSERT_NE(gs, nullptr);
  ASSERT_EQ(cudaSetDevice(3), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  const void* k = strata_testbed_kernel("gemm_fwd");
  auto timed = [&] {
    cudaEventRecord(a, s);
    cudaLaunchKernel(k, dim3(strata_cost_grid_for_us(10000, 256)), dim3(256), nullptr, 0, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return ms;
  };
  float base = timed();
  gs->dev[3].slowdown = 3.0f;
  float slow = timed();
  gs->dev[3].slowdown = 1.0f;
  EXPECT_GE(slow, 30.0f);
  EXPECT_GT(slow, 2.0f * base);

  // A hung device runs nothing until the hang clears.
  gs->dev[3].hang = 1;
  cudaLaunchKernel(k, dim3(1), dim3(1), nullptr, 0, s);
  usleep(100000);
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  gs->dev[3].hang = 0;
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaSetDevice(0);
}

TEST(Nvml, ReportsInjectedThrottling) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  ASSERT_EQ(nvmlInit_v2(), NVML_SUCCESS);
  unsigned count = 0;
  ASSERT_EQ(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
  EXPECT_EQ(count, 8u);
  nvmlDevice_t dev;
  ASSERT_EQ(nvmlDeviceGetHandleByIndex_v2(2, &dev), NVML_SUCCESS);
  char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
  ASSERT_EQ(nvmlDeviceGetName(dev, name, sizeof(name)), NVML_SUCCESS);
  ASSERT_EQ(nvmlDeviceGetUUID(dev, uuid, sizeof(uuid)), NVML_SUCCESS);
  EXPECT_EQ(std::string(uuid).rfind("GPU-", 0), 0u);
  unsigned sm = 0, max_sm = 0, temp = 0, mw = 0;
  ASSERT_EQ(nvmlDeviceGetMaxClockInfo(dev, NVML_CLOCK_SM, &max_sm), NVML_SUCCESS);
  ASSERT_EQ(nvmlDeviceGetClockInfo(dev, NVML_CLOCK_SM, &sm), NVML_SUCCESS);
  EXPECT_EQ(sm, max_sm);
  unsigned long long reasons = 0;
  ASSERT_EQ(nvmlDeviceGetCurrentClocksEventReasons(dev, &reasons), NVML_SUCCESS);
  EXPECT_EQ(reasons & nvmlClocksThrottleReasonHwSlowdown, 0u);

  strata_gpu_state* gs = map_state();
  ASSERT_NE(gs, nullptr);
  gs->dev[2].slowdown = 2.0f;
  gs->dev[2].throttle_reasons = nvmlClocksThrottleReasonHwSlowdown | nvmlClocksThrottleReasonHwThermalSlowdown;
  ASSERT_EQ(nvmlDeviceGetClockInfo(dev, NVML_CLOCK_SM, &sm), NVML_SUCCESS);
  EXPECT_EQ(sm, max_sm / 2);
  ASSERT_EQ(nvmlDeviceGetCurrentClocksThrottleReasons(dev, &reasons), NVML_SUCCESS);
  EXPECT_EQ(reasons, 0x48u);
  ASSERT_EQ(nvmlDeviceGetTemperature(dev, NVML_TEMPERATURE_GPU, &temp), NVML_SUCCESS);
  EXPECT_GE(temp, 85u);
  EXPECT_EQ(nvmlDeviceGetPowerUsage(dev, &mw), NVML_SUCCESS);
  nvmlUtilization_t u{};
  EXPECT_EQ(nvmlDeviceGetUtilizationRates(dev, &u), NVML_SUCCESS);
  nvmlMemory_t mem{};
  EXPECT_EQ(nvmlDeviceGetMemoryInfo(dev, &mem), NVML_SUCCESS);
  EXPECT_EQ(mem.total, mem.used + mem.free);
  gs->dev[2].slowdown = 1.0f;
  gs->dev[2].throttle_reasons = 0;
  EXPECT_STREQ(nvmlErrorString(NVML_ERROR_UNINITIALIZED), "Uninitialized");
  EXPECT_EQ(nvmlShutdown(), NVML_SUCCESS);
}

// Hardware faults as strata-sim injects them (gpu_state.h hw_faults): each counter climbs only on
// its fault, a degraded link reports x4 of x16, a lost GPU answers GPU_IS_LOST; a healthy device
// counts nothing and runs its link at full width.
TEST(Nvml, ReportsInjectedHardwareFaults) {
  ASSERT_EQ(nvmlInit_v2(), NVML_SUCCESS);
  nvmlDevice_t dev;
  ASSERT_EQ(nvmlDeviceGetHandleByIndex_v2(3, &dev), NVML_SUCCESS);
  strata_gpu_state* gs = map_state();
  ASSERT_NE(gs, nullptr);
  auto& d = gs->dev[3];
  auto counters = [&] {
    unsigned long long unc = 0, link0 = 0, link1 = 0;
    unsigned replays = 0;
    EXPECT_EQ(nvmlDeviceGetTotalEccErrors(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &unc), NVML_SUCCESS);
    EXPECT_EQ(nvmlDeviceGetPcieReplayCounter(dev, &replays), NVML_SUCCESS);
    EXPECT_EQ(nvmlDeviceGetNvLinkErrorCounter(dev, 0, NVML_NVLINK_ERROR_DL_REPLAY, &link0), NVML_SUCCESS);
    EXPECT_EQ(nvmlDeviceGetNvLinkErrorCounter(dev, 1, NVML_NVLINK_ERROR_DL_REPLAY, &link1), NVML_SUCCESS);
    return std::array<unsigned long long, 4>{unc, replays, link0, link1};
  };
  unsigned width = 0, max_width = 0, gen = 0;
  ASSERT_EQ(nvmlDeviceGetCurrPcieLinkWidth(dev, &width), NVML_SUCCESS);
  ASSERT_EQ(nvmlDeviceGetMaxPcieLinkWidth(dev, &max_width), NVML_SUCCESS);
  ASSERT_EQ(nvmlDeviceGetCurrPcieLinkGeneration(dev, &gen), NVML_SUCCESS);
  EXPECT_EQ(width, max_width);
  EXPECT_GT(gen, 0u);
  nvmlEnableState_t st{};
  ASSERT_EQ(nvmlDeviceGetNvLinkState(dev, 0, &st), NVML_SUCCESS);
  EXPECT_EQ(st, NVML_FEATURE_ENABLED);
  EXPECT_EQ(nvmlDeviceGetNvLinkState(dev, NVML_NVLINK_MAX_LINKS, &st), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(counters(), (std::array<unsigned long long, 4>{0, 0, 0, 0}));

  // Each fault began 10 s ago: its own counter has climbed, the others have not.
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);  // the stand-in's clock
  d.hw_since_ns = static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(now.tv_nsec) - 10'000'000'000ull;
  d.hw_faults = STRATA_HW_ECC;
  auto c = counters();
  EXPECT_GE(c[0], 1u);
  EXPECT_EQ(c[1] + c[2] + c[3], 0u);
  d.hw_faults = STRATA_HW_PCIE;
  c = counters();
  EXPECT_GE(c[1], 10u);
  EXPECT_EQ(c[0] + c[2] + c[3], 0u);
  ASSERT_EQ(nvmlDeviceGetCurrPcieLinkWidth(dev, &width), NVML_SUCCESS);
  EXPECT_LT(width, max_width);
  unsigned sm = 0, max_sm = 0;
  d.slowdown = 1.5f;  // the device is slower; its SMs' clock is not (the link is the fault)
  ASSERT_EQ(nvmlDeviceGetClockInfo(dev, NVML_CLOCK_SM, &sm), NVML_SUCCESS);
  ASSERT_EQ(nvmlDeviceGetMaxClockInfo(dev, NVML_CLOCK_SM, &max_sm), NVML_SUCCESS);
  EXPECT_EQ(sm, max_sm);
  d.hw_faults = STRATA_HW_NVLINK;
  c = counters();
  EXPECT_GE(c[2], 10u);
  EXPECT_EQ(c[3], 0u);  // one failing link
  EXPECT_EQ(c[0] + c[1], 0u);
  d.hw_faults = STRATA_HW_LOST;
  unsigned long long unc = 0;
  EXPECT_EQ(nvmlDeviceGetTotalEccErrors(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &unc), NVML_ERROR_GPU_IS_LOST);
  EXPECT_EQ(nvmlDeviceGetClockInfo(dev, NVML_CLOCK_SM, &sm), NVML_ERROR_GPU_IS_LOST);
  d.hw_faults = 0;
  d.slowdown = 1.0f;
  EXPECT_EQ(nvmlDeviceGetClockInfo(dev, NVML_CLOCK_SM, &sm), NVML_SUCCESS);
  EXPECT_EQ(nvmlShutdown(), NVML_SUCCESS);
}

// The event API with the real ABI: an Xid the injector raises (gpu-xid) is one event of the device
// it was raised on, delivered once to a set that registered before; a wait with nothing to deliver
// times out. PCI addresses tell the devices apart (the kernel log names a GPU by its address).
TEST(Nvml, DeliversInjectedXidsAsEvents) {
  ASSERT_EQ(nvmlInit_v2(), NVML_SUCCESS);
  nvmlDevice_t dev1, dev2;
  ASSERT_EQ(nvmlDeviceGetHandleByIndex_v2(1, &dev1), NVML_SUCCESS);
  ASSERT_EQ(nvmlDeviceGetHandleByIndex_v2(2, &dev2), NVML_SUCCESS);
  nvmlPciInfo_t p1{}, p2{};
  ASSERT_EQ(nvmlDeviceGetPciInfo_v3(dev1, &p1), NVML_SUCCESS);
  ASSERT_EQ(nvmlDeviceGetPciInfo_v3(dev2, &p2), NVML_SUCCESS);
  EXPECT_NE(p1.bus, p2.bus);
  char want[32];
  std::snprintf(want, sizeof want, "%08X:%02X:00.0", p1.domain, p1.bus);
  EXPECT_STREQ(p1.busId, want);
  unsigned long long types = 0;
  ASSERT_EQ(nvmlDeviceGetSupportedEventTypes(dev1, &types), NVML_SUCCESS);
  EXPECT_TRUE(types & nvmlEventTypeXidCriticalError);

  nvmlEventSet_t set = nullptr;
  ASSERT_EQ(nvmlEventSetCreate(&set), NVML_SUCCESS);
  ASSERT_EQ(nvmlDeviceRegisterEvents(dev1, nvmlEventTypeXidCriticalError, set), NVML_SUCCESS);
  ASSERT_EQ(nvmlDeviceRegisterEvents(dev2, nvmlEventTypeXidCriticalError, set), NVML_SUCCESS);
  EXPECT_EQ(nvmlDeviceRegisterEvents(dev1, nvmlEventTypePState, set), NVML_ERROR_NOT_SUPPORTED);
  nvmlEventData_t e{};
  EXPECT_EQ(nvmlEventSetWait_v2(set, &e, 30), NVML_ERROR_TIMEOUT);

  strata_gpu_state* gs = map_state();
  ASSERT_NE(gs, nullptr);
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  gs->dev[2].hw_since_ns = static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(now.tv_nsec);
  gs->dev[2].xid = 79;
  __atomic_store_n(&gs->dev[2].hw_faults, STRATA_HW_LOST, __ATOMIC_RELEASE);
  ASSERT_EQ(nvmlEventSetWait_v2(set, &e, 1000), NVML_SUCCESS);
  EXPECT_EQ(e.device, dev2);
  EXPECT_EQ(e.eventType, nvmlEventTypeXidCriticalError);
  EXPECT_EQ(e.eventData, 79u);
  EXPECT_EQ(e.gpuInstanceId, 0xFFFFFFFFu);
  EXPECT_EQ(nvmlEventSetWait_v2(set, &e, 30), NVML_ERROR_TIMEOUT) << "delivered once";
  gs->dev[2].hw_faults = 0;
  gs->dev[2].xid = 0;
  EXPECT_EQ(nvmlEventSetFree(set), NVML_SUCCESS);
  EXPECT_EQ(nvmlShutdown(), NVML_SUCCESS);
}

TEST(Nccl, VersionAndSingleRank) {
  int v = 0;
  ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION(2, 28, 9));
  EXPECT_GE(v, 22800);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ASSERT_EQ(ncclCommInitRankConfig(&comm, 1, id, 0, &config), ncclSuccess);
  int count = 0, rank = -1;
  EXPECT_EQ(ncclCommCount(comm, &count), ncclSuccess);
  EXPECT_EQ(ncclCommUserRank(comm, &rank), ncclSuccess);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(rank, 0);
  float x[4] = {1, 2, 3, 4}, y[4] = {};
  ASSERT_EQ(ncclAllReduce(x, y, 4, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(y[3], 4.0f);
  EXPECT_EQ(ncclAllReduce(x, y, 4, ncclFloat, static_cast<ncclRedOp_t>(77), comm, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// One rank of the multi-process test; returns the number of failed checks.
int nccl_rank(int rank, int nranks, ncclUniqueId id1, ncclUniqueId id2) {
  int bad = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "rank %d: check failed: %s\n", rank, what);
      ++bad;
    }
  };
  cudaSetDevice(rank);
  ncclComm_t c1, c2;
  if (ncclCommInitRank(&c1, nranks, id1, rank) != ncclSuccess) return 100;
  // Second communicator with the ranks reversed, as a second process group would be.
  if (ncclCommInitRank(&c2, nranks, id2, nranks - 1 - rank) != ncclSuccess) return 100;
  cudaStream_t s1, s2;
  cudaStreamCreate(&s1);
  cudaStreamCreate(&s2);
  const size_t n = 1000;  // not a multiple of nranks: uneven chunks
  std::vector<float> x(n), sum(n), gather(n * nranks), rs(n / 10);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(rank + 1) * static_cast<float>(i % 7);
  ncclAllReduce(x.data(), sum.data(), n, ncclFloat, ncclSum, c1, s1);
  ncclAllGather(x.data(), gather.data(), n, ncclFloat, c2, s2);
  std::vector<float> rs_in(n / 10 * nranks, 1.0f);
  ncclReduceScatter(rs_in.data(), rs.data(), n / 10, ncclFloat, ncclSum, c1, s1);
  std::vector<int64_t> b(16, rank == 1 ? 42 : 0);
  ncclBroadcast(b.data(), b.data(), 16, ncclInt64, 1, c1, s1);
  ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, c1, s1);  // 0-byte collective
  // Ring exchange with send/recv in a group.
  int32_t out = rank * 10, in = -1;
  ncclGroupStart();
  ncclSend(&out, 1, ncclInt32, (rank + 1) % nranks, c1, s1);
  ncclRecv(&in, 1, ncclInt32, (rank + nranks - 1) % nranks, c1, s1);
  ncclGroupEnd();
  cudaStreamSynchronize(s1);
  cudaStreamSynchronize(s2);
  float tri = static_cast<float>(nranks * (nranks + 1) / 2);
  for (size_t i = 0; i < n; ++i) check(sum[i] == tri * static_cast<float>(i % 7), "allreduce sum");
  for (int r = 0; r < nranks; ++r) {
    int owner = nranks - 1 - r;  // c2 rank r is process rank nranks-1-r
    check(gather[static_cast<size_t>(r) * n + 5] == static_cast<float>(owner + 1) * 5.0f, "allgather");
  }
  for (float v : rs) check(v == static_cast<float>(nranks), "reducescatter");
  for (int64_t v : b) check(v == 42, "broadcast");
  check(in == ((rank + nranks - 1) % nranks) * 10, "send/recv");
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(c1, &async);
  check(async == ncclSuccess, "no async error");
  ncclCommDestroy(c1);
  ncclCommDestroy(c2);
  return bad;
}

TEST(Nccl, RingAcrossProcessesWithTwoCommunicators) {
  const int nranks = 3;
  ncclUniqueId id1, id2;
  // The root listeners run in this process (rank 0), as with NCCL's ncclGetUniqueId.
  ASSERT_EQ(ncclGetUniqueId(&id1), ncclSuccess);
  ASSERT_EQ(ncclGetUniqueId(&id2), ncclSuccess);
  std::vector<pid_t> children;
  for (int r = 1; r < nranks; ++r) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(nccl_rank(r, nranks, id1, id2));
    children.push_back(pid);
  }
  EXPECT_EQ(nccl_rank(0, nranks, id1, id2), 0);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
}

// One rank of the split test: 4 ranks split by parity (keys reversed, so positions follow the
// key, not the parent rank); rank 3 asks for no communicator. Returns the failed checks.
int split_rank(int rank, int nranks, ncclUniqueId id) {
  int bad = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "rank %d: check failed: %s\n", rank, what);
      ++bad;
    }
  };
  cudaSetDevice(rank);
  ncclComm_t world, half = nullptr;
  if (ncclCommInitRank(&world, nranks, id, rank) != ncclSuccess) return 100;
  int color = rank == 3 ? NCCL_SPLIT_NOCOLOR : rank % 2;
  if (ncclCommSplit(world, color, -rank, &half, nullptr) != ncclSuccess) return 100;
  if (rank == 3) {
    check(half == nullptr, "NCCL_SPLIT_NOCOLOR: no communicator");
  } else {
    int count = 0, pos = -1;
    ncclCommCount(half, &count);
    ncclCommUserRank(half, &pos);
    // Color 0: ranks 0, 2 (keys 0, -2: rank 2 first); color 1: rank 1 alone.
    check(count == (rank % 2 == 0 ? 2 : 1), "split size");
    check(pos == (rank == 2 || rank == 1 ? 0 : 1), "position by key");
    int32_t x = rank + 1, y = 0;
    ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, half, nullptr);
    cudaStreamSynchronize(nullptr);
    check(y == (rank % 2 == 0 ? 1 + 3 : 2), "all-reduce within the split");
    ncclCommDestroy(half);
  }
  ncclCommDestroy(world);
  return bad;
}

TEST(Nccl, SplitByColorAndKey) {
  const int nranks = 4;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<pid_t> children;
  for (int r = 1; r < nranks; ++r) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(split_rank(r, nranks, id));
    children.push_back(pid);
  }
  EXPECT_EQ(split_rank(0, nranks, id), 0);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  ncclComm_t bad = nullptr;
  EXPECT_EQ(ncclCommSplit(nullptr, 0, 0, &bad, nullptr), ncclInvalidArgument);
}

TEST(Nccl, InitAllMakesOneCommunicatorOfNdevRanks) {
  ncclComm_t comms[3] = {};
  int devs[3] = {0, 1, 2};
  ASSERT_EQ(ncclCommInitAll(comms, 3, devs), ncclSuccess);
  for (int i = 0; i < 3; ++i) {
    int count = 0, pos = -1;
    ASSERT_NE(comms[i], nullptr);
    ncclCommCount(comms[i], &count);
    ncclCommUserRank(comms[i], &pos);
    EXPECT_EQ(count, 3);
    EXPECT_EQ(pos, i);
  }
  // One collective across the three, each from its own thread (one process drives every rank).
  int32_t in[3] = {1, 2, 3}, out[3] = {};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      cudaSetDevice(i);
      cudaStream_t s;
      cudaStreamCreate(&s);
      ncclAllReduce(&in[i], &out[i], 1, ncclInt32, ncclSum, comms[i], s);
      cudaStreamSynchronize(s);
    });
  }
  for (auto& t : threads) t.join();
  for (int32_t v : out) EXPECT_EQ(v, 6);
  for (auto* c : comms) ncclCommDestroy(c);
  EXPECT_EQ(ncclCommInitAll(nullptr, 3, devs), ncclInvalidArgument);
}

TEST(Nccl, PeerExitIsAnAsyncErrorNotAHang) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ncclComm_t c;
    if (ncclCommInitRank(&c, 2, id, 1) != ncclSuccess) ::_exit(1);
    ::_exit(0);  // leaves before the collective
  }
  ncclComm_t c;
  ASSERT_EQ(ncclCommInitRank(&c, 2, id, 0), ncclSuccess);
  float x[64] = {};
  ASSERT_EQ(ncclAllReduce(x, x, 64, ncclFloat, ncclSum, c, nullptr), ncclSuccess);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  ncclResult_t async = ncclSuccess;
  ASSERT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
  EXPECT_EQ(async, ncclRemoteError);
  EXPECT_NE(std::string(ncclGetLastError(c)).find("peer"), std::string::npos);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ncclCommDestroy(c);
}

}  // namespace
