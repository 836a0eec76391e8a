// Runtime recognition against the real CUDA 13 runtime and NCCL 2.28 of the machine image: the
// probe points must resolve there, so that on a GPU node the agent simply works.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "agent/runtimes/library_closure.h"
#include "agent/runtimes/runtimes.h"
#include "tests/support/run.h"

namespace strata::agent {
namespace {

const std::string kCudaLib = test::env_or("STRATA_CUDA_LIB", "/usr/local/cuda/lib64");

std::map<std::string, uint64_t> probes_of(const std::string& path, RuntimeKind kind) {
  auto rts = recognize_runtimes(path);
  EXPECT_TRUE(rts) << (rts ? "" : rts.error().message);
  std::map<std::string, uint64_t> out;
  if (!rts) return out;
  for (const auto& rt : *rts) {
    if (rt.kind != kind) continue;
    for (const auto& p : rt.probes) out[p.symbol] = p.file_offset;
  }
  return out;
}

TEST(Runtimes, RealNcclProbePointsResolve) {
  auto probes = probes_of(kCudaLib + "/libnccl.so.2", RuntimeKind::kNccl);
  for (const char* sym : {"ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
                          "ncclSend", "ncclRecv", "ncclGroupStart", "ncclGroupEnd", "ncclCommInitRank",
                          "ncclCommInitRankConfig", "ncclCommDestroy", "ncclGetVersion"}) {
    ASSERT_TRUE(probes.count(sym)) << sym << " not found in the real libnccl.so.2";
    EXPECT_GT(probes[sym], 0u) << sym;
  }
  // The offsets are where the code is: ncclAllReduce and pncclAllReduce share it in NCCL 2.28.
  auto p = test::run("nm -D --defined-only " + kCudaLib + "/libnccl.so.2 | grep ' pncclAllReduce$'");
  ASSERT_EQ(p.exit_code, 0);
  EXPECT_EQ(std::stoull(p.out.substr(0, 16), nullptr, 16), probes["ncclAllReduce"])
      << "file offset of a .text symbol equals its address in this library";
}

TEST(Runtimes, RealCudaRuntimeProbePointsResolve) {
  auto probes = probes_of(kCudaLib + "/libcudart.so.13", RuntimeKind::kCudaRuntime);
  for (const char* sym : {"cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                          "cudaEventSynchronize", "cudaSetDevice", "cudaGetDeviceCount"}) {
    EXPECT_TRUE(probes.count(sym)) << sym << " not found in the real libcudart.so.13";
  }
}

TEST(Runtimes, RealCudaRuntimeMemoryCallsResolve) {
  auto probes = probes_of(kCudaLib + "/libcudart.so.13", RuntimeKind::kCudaRuntime);
  for (const char* sym : {"cudaMalloc", "cudaFree", "cudaMemcpy"}) {
    EXPECT_TRUE(probes.count(sym)) << sym << " not found in the real libcudart.so.13";
  }
}

// The toolkit's libcuda.so stub carries the driver's real export table (the driver itself comes
// with the GPU driver, not on this machine): the driver API's probe points resolve there.
TEST(Runtimes, RealCudaDriverProbePointsResolve) {
  auto probes = probes_of(kCudaLib + "/stubs/libcuda.so", RuntimeKind::kCudaDriver);
  for (const char* sym : {"cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
                          "cuModuleGetFunction", "cuFuncGetName", "cuMemAlloc_v2", "cuMemFree_v2",
                          "cuLibraryGetKernel", "cuKernelGetFunction", "cuKernelGetName"}) {
    EXPECT_TRUE(probes.count(sym)) << sym << " not found in the real libcuda.so stub";
  }
  // Launches are hot (bursts only); the name lookups are not.
  auto rts = recognize_runtimes(kCudaLib + "/stubs/libcuda.so");
  ASSERT_TRUE(rts);
  for (const auto& rt : *rts) {
    for (const auto& p : rt.probes) {
      bool launch = p.api == STRATA_API_CU_LAUNCH_KERNEL || p.api == STRATA_API_CU_LAUNCH_KERNEL_EX;
      EXPECT_EQ(p.hot, launch) << p.symbol;
      EXPECT_EQ(api_is_memory(p.api), p.api == STRATA_API_CU_MEM_ALLOC || p.api == STRATA_API_CU_MEM_FREE) << p.symbol;
    }
  }
}

TEST(Runtimes, OrdinaryLibrariesAreNoRuntime) {
  auto rts = recognize_runtimes("/lib/x86_64-linux-gnu/libc.so.6");
  ASSERT_TRUE(rts);
  EXPECT_TRUE(rts->empty());
  EXPECT_FALSE(recognize_runtimes("/etc/passwd")) << "not ELF: an error, not a crash";
}

TEST(Runtimes, GlooInDebiansLibtorchIsRecognized) {
  auto probes = probes_of("/lib/libgloo.so.0", RuntimeKind::kGloo);
  EXPECT_TRUE(probes.count("_ZN4gloo9allreduceERKNS_16AllreduceOptionsE"));
}

TEST(Runtimes, LibraryClosureFollowsRunpathAndSystemDirs) {
  // Debian's libtorch_cpu needs libgloo (system dir) and libc10.
  auto libs = library_closure("/usr/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13", "");
  std::set<std::string> names;
  for (const auto& l : libs) names.insert(l.substr(l.rfind('/') + 1));
  EXPECT_TRUE(names.count("libgloo.so.0"));
  EXPECT_TRUE(names.count("libc10.so.1.13"));
  EXPECT_TRUE(names.count("libc.so.6"));
}

}  // namespace
}  // namespace strata::agent
