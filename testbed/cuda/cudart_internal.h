// Testbed-private entry points of the libcudart.so.13 stand-in, used by the libnccl.so.2 stand-in
// to run its collectives on a stream the way NCCL's kernels run on the GPU, and by the libcuda.so.1
// stand-in to run driver-API work on the same modeled GPU. Not CUDA API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

extern "C" {

// Work the stream worker runs in order with the stream's other work; returns nonzero on failure
// (recorded, the stream goes on).
typedef int (*strataTestbedDeviceFn)(void* user);

// Enqueues `fn(user)` on `stream` as device work of kind STRATA_TL_COLLECTIVE: it appears on the
// device timeline as a kernel whose host stub is `stub` (an ncclDevKernel_* symbol), with `bytes`.
// `fn` runs on the stream's worker thread, after the device's slowdown/hang checks.
cudaError_t strataTestbedLaunchDeviceFn(cudaStream_t stream, const void* stub, uint64_t bytes,
                                        strataTestbedDeviceFn fn, void* user);

// The device the stream belongs to (for per-device state like a paced network link).
int strataTestbedStreamDevice(cudaStream_t stream);

// For the libcuda.so.1 stand-in (driver API), which runs on this library's modeled GPU:
// a kernel of `threads` threads whose timeline name is `name` (`func` identifies it: the CUfunction;
// `name` must live as long as it);
cudaError_t strataTestbedLaunchNamed(cudaStream_t stream, const void* func, const char* name, uint64_t threads);
// device memory as cudaMalloc / cudaFree give it, without going through them (no runtime probe
// fires for a driver call);
cudaError_t strataTestbedMalloc(void** devPtr, size_t size);
cudaError_t strataTestbedFree(void* devPtr);
// the number of modeled devices.
int strataTestbedDeviceCount(void);
}
