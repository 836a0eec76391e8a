/* The testbed GPU's cost model, shared by the libcudart stand-in and the programs that want a
 * kernel of a given duration (the C++ and Python rank programs compute grid sizes from it).
 *
 * A kernel of T threads (gridDim * blockDim) runs for
 *     STRATA_COST_LAUNCH_NS + T * STRATA_COST_PS_PER_THREAD / 1000   nanoseconds,
 * times the device's slowdown factor. The worker thread sleeps for that long: CPU-cheap.
 * A copy of B bytes runs for STRATA_COST_LAUNCH_NS + B / bandwidth.
 */
#ifndef STRATA_TESTBED_COST_MODEL_H
#define STRATA_TESTBED_COST_MODEL_H

#include <stdint.h>

#define STRATA_COST_LAUNCH_NS 3000ull          /* fixed cost of any device work */
#define STRATA_COST_PS_PER_THREAD 10ull        /* 100 M threads = 1 ms */
#define STRATA_COST_PCIE_BYTES_PER_US 25000ull /* host<->device: 25 GB/s */
#define STRATA_COST_HBM_BYTES_PER_US 1000000ull /* device<->device: 1 TB/s */
/* Host time of cudaMalloc / cuMemAlloc and of cudaFree / cuMemFree (after its device sync): the
 * driver maps pages; tens of microseconds on a real GPU for small allocations. */
#define STRATA_COST_MALLOC_NS 50000ull
#define STRATA_COST_FREE_NS 20000ull
/* Host time of a kernel launch (cudaLaunchKernel, cuLaunchKernel): the runtime and the driver check
 * the arguments and write the launch into the device's queue, on the calling thread's CPU. A few
 * microseconds on a real system (the launch overhead NVIDIA quotes, 2-5 us); the framework's own
 * work per operation (PyTorch's dispatcher, Python) comes on top, in the caller. */
#define STRATA_COST_LAUNCH_HOST_NS 4000ull

/* gridDim.x for a kernel of `duration_us` with `block_threads` threads per block. */
static inline uint32_t strata_cost_grid_for_us(uint64_t duration_us, uint32_t block_threads) {
  uint64_t threads = duration_us * 1000000ull / STRATA_COST_PS_PER_THREAD;
  uint64_t grid = threads / (block_threads ? block_threads : 1);
  if (grid < 1) grid = 1;
  if (grid > 0x7fffffffull) grid = 0x7fffffffull;
  return (uint32_t)grid;
}

#endif /* STRATA_TESTBED_COST_MODEL_H */
