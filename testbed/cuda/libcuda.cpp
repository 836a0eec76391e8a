// libcuda.so.1 stand-in: the part of the CUDA driver API that Triton and torch.compile use to load
// and launch their kernels, on the testbed's modeled GPU.
//
// Compiled against the toolkit's own cuda.h, so every exported function has the real CUDA 13
// signature (the compiler rejects a mismatch; the _ptsz twins are declared here with the same one).
// Kernels and allocations run on the libcudart.so.13 stand-in's modeled GPU (testbed-private entry
// points, cudart_internal.h): a driver launch takes the time the cost model gives its grid and
// appears on the device timeline under the kernel's name, as a runtime launch does.
//
// Modules: cuModuleLoadData takes PTX text (what Triton hands the driver before it caches cubins);
// each `.entry NAME(` is a kernel. Libraries (CUDA 12, cuLibraryLoadData) take the same text; their
// CUkernel handles launch as they are (cast to CUfunction) or through cuKernelGetFunction. Simplifications (documented, not hidden): no contexts (every
// call acts on the calling thread's device, as after cuDevicePrimaryCtxRetain + cuCtxSetCurrent);
// cuModuleUnload forgets the module but keeps its functions' memory, because work already enqueued
// names its kernel by them.
#include <cuda.h>

#include <cctype>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "testbed/cuda/cudart_internal.h"

struct CUfunc_st {
  CUmod_st* module = nullptr;
  std::string name;
};

struct CUmod_st {
  std::map<std::string, CUfunc_st*> functions;  // by name; a lookup returns the same handle
};

struct CUkern_st {
  CUlib_st* library = nullptr;  // first: the kernel and its function are distinct handles
  CUfunc_st function;           // what cuKernelGetFunction returns (one context: one function)
};

struct CUlib_st {
  std::map<std::string, CUkern_st*> kernels;
};

namespace testbed::cuda_driver {
namespace {

std::mutex g_mutex;
bool g_initialized = false;
std::set<const void*> g_kernels;  // every CUkernel handed out: a launch may pass one as its CUfunction

CUresult from_runtime(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return CUDA_SUCCESS;
    case cudaErrorInvalidValue: return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorMemoryAllocation: return CUDA_ERROR_OUT_OF_MEMORY;
    case cudaErrorInvalidResourceHandle: return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorInvalidDevicePointer: return CUDA_ERROR_INVALID_VALUE;
    default: return CUDA_ERROR_UNKNOWN;
  }
}

bool initialized() {
  std::lock_guard lock(g_mutex);
  return g_initialized;
}

// The kernel names a PTX module defines: the identifier after each `.entry`.
std::vector<std::string> ptx_entries(const char* ptx) {
  std::vector<std::string> names;
  const char* p = ptx;
  while ((p = std::strstr(p, ".entry")) != nullptr) {
    p += 6;
    if (!std::isspace(static_cast<unsigned char>(*p))) continue;  // e.g. ".entryx": not the directive
    while (std::isspace(static_cast<unsigned char>(*p))) ++p;
    const char* start = p;
    while (std::isalnum(static_cast<unsigned char>(*p)) || *p == '_' || *p == '$' || *p == '.') ++p;
    if (p > start) names.emplace_back(start, p);
  }
  return names;
}

// A launch's function: a CUfunction, or a CUkernel passed in its place.
CUfunction function_of(CUfunction f) {
  std::lock_guard lock(g_mutex);
  if (g_kernels.count(f)) return &reinterpret_cast<CUkern_st*>(f)->function;
  return f;
}

CUresult launch(CUfunction handle, uint64_t grid, uint64_t block, CUstream stream) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (handle == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUfunction f = function_of(handle);
  if (grid == 0 || block == 0) return CUDA_ERROR_INVALID_VALUE;
  return from_runtime(strataTestbedLaunchNamed(stream, handle, f->name.c_str(), grid * block));
}

CUresult launch_ex(const CUlaunchConfig* config, CUfunction f) {
  if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (config->numAttrs > 0 && config->attrs == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return launch(f, uint64_t{config->gridDimX} * config->gridDimY * config->gridDimZ,
                uint64_t{config->blockDimX} * config->blockDimY * config->blockDimZ, config->hStream);
}

}  // namespace
}  // namespace testbed::cuda_driver

using namespace testbed::cuda_driver;

#pragma GCC visibility push(default)
extern "C" {

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void** kernelParams, void** extra);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** kernelParams, void** extra);

CUresult cuInit(unsigned int Flags) {
  if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(g_mutex);
  g_initialized = true;
  return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int* driverVersion) {
  if (driverVersion == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *driverVersion = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int* count) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *count = strataTestbedDeviceCount();
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= strataTestbedDeviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS: *pStr = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *pStr = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *pStr = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *pStr = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_INVALID_DEVICE: *pStr = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_IMAGE: *pStr = "CUDA_ERROR_INVALID_IMAGE"; break;
    case CUDA_ERROR_INVALID_HANDLE: *pStr = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_FOUND: *pStr = "CUDA_ERROR_NOT_FOUND"; break;
    default: *pStr = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char** pStr) {
  if (pStr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS: *pStr = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *pStr = "invalid argument"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *pStr = "out of memory"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *pStr = "initialization error"; break;
    case CUDA_ERROR_INVALID_DEVICE: *pStr = "invalid device ordinal"; break;
    case CUDA_ERROR_INVALID_IMAGE: *pStr = "device kernel image is invalid"; break;
    case CUDA_ERROR_INVALID_HANDLE: *pStr = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_FOUND: *pStr = "named symbol not found"; break;
    default: *pStr = nullptr; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto names = ptx_entries(static_cast<const char*>(image));
  if (names.empty()) return CUDA_ERROR_INVALID_IMAGE;
  auto* m = new CUmod_st;
  for (const auto& n : names) {
    auto* f = new CUfunc_st;
    f->module = m;
    f->name = n;
    m->functions.emplace(n, f);
  }
  *module = m;
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (hmod == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  delete hmod;  // its CUfunc_st stay: enqueued work names its kernel by them
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (hmod == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  auto it = hmod->functions.find(name);
  if (it == hmod->functions.end()) return CUDA_ERROR_NOT_FOUND;
  *hfunc = it->second;
  return CUDA_SUCCESS;
}

CUresult cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* /*jitOptions*/,
                           void** /*jitOptionsValues*/, unsigned int numJitOptions, CUlibraryOption* /*libraryOptions*/,
                           void** /*libraryOptionValues*/, unsigned int numLibraryOptions) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (library == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
  (void)numJitOptions;  // options are accepted and ignored: no JIT here
  (void)numLibraryOptions;
  auto names = ptx_entries(static_cast<const char*>(code));
  if (names.empty()) return CUDA_ERROR_INVALID_IMAGE;
  auto* lib = new CUlib_st;
  std::lock_guard lock(g_mutex);
  for (const auto& n : names) {
    auto* k = new CUkern_st;
    k->library = lib;
    k->function.name = n;
    lib->kernels.emplace(n, k);
    g_kernels.insert(k);
  }
  *library = lib;
  return CUDA_SUCCESS;
}

CUresult cuLibraryUnload(CUlibrary library) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  delete library;  // its CUkern_st stay (see the top)
  return CUDA_SUCCESS;
}

CUresult cuLibraryGetKernel(CUkernel* pKernel, CUlibrary library, const char* name) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pKernel == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  auto it = library->kernels.find(name);
  if (it == library->kernels.end()) return CUDA_ERROR_NOT_FOUND;
  *pKernel = it->second;
  return CUDA_SUCCESS;
}

CUresult cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (pFunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (kernel == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *pFunc = &kernel->function;
  return CUDA_SUCCESS;
}

CUresult cuKernelGetName(const char** name, CUkernel hfunc) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (hfunc == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = hfunc->function.name.c_str();
  return CUDA_SUCCESS;
}

CUresult cuFuncGetName(const char** name, CUfunction hfunc) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (hfunc == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  *name = hfunc->name.c_str();
  return CUDA_SUCCESS;
}

// The _ptsz twins (per-thread default stream) share the work, not the entry: a probe on one must
// not fire for the other, as in the real driver.
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int /*sharedMemBytes*/, CUstream hStream, void** /*kernelParams*/,
                        void** /*extra*/) {
  return launch(f, uint64_t{gridDimX} * gridDimY * gridDimZ, uint64_t{blockDimX} * blockDimY * blockDimZ, hStream);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int /*sharedMemBytes*/, CUstream hStream, void** /*kernelParams*/,
                             void** /*extra*/) {
  return launch(f, uint64_t{gridDimX} * gridDimY * gridDimZ, uint64_t{blockDimX} * blockDimY * blockDimZ, hStream);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** /*kernelParams*/, void** /*extra*/) {
  return launch_ex(config, f);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** /*kernelParams*/, void** /*extra*/) {
  return launch_ex(config, f);
}

CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  if (dptr == nullptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;  // the driver refuses 0 bytes
  void* p = nullptr;
  CUresult r = from_runtime(strataTestbedMalloc(&p, bytesize));
  if (r == CUDA_SUCCESS) *dptr = reinterpret_cast<CUdeviceptr>(p);
  return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
  return from_runtime(strataTestbedFree(reinterpret_cast<void*>(dptr)));
}

}  // extern "C"
#pragma GCC visibility pop
