/* The testbed's "hardware": the state of the node's simulated GPUs, shared by every process.
 *
 * One file, $STRATA_TESTBED_DIR/gpu-state (default dir /tmp/strata-testbed), mmapped shared.
 * strata-sim writes the injected faults (slowdown, hang, throttle reasons); the libcudart stand-in
 * reads them before each piece of device work and adds its busy time and allocations; the
 * libnvidia-ml stand-in reports from it. Plain C structs so any process can map it.
 * Fields are naturally aligned; C++ code accesses them with std::atomic_ref.
 */
#ifndef STRATA_TESTBED_GPU_STATE_H
#define STRATA_TESTBED_GPU_STATE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STRATA_GPU_STATE_MAGIC 0x4554415453555047ull /* "GPUSTATE" */
#define STRATA_GPU_STATE_VERSION 1u
#define STRATA_GPU_STATE_MAX_DEVICES 16u

struct strata_gpu_device_state {
  /* set by the fault injector */
  float slowdown;            /* multiplies every duration on the device; <= 1.0 means healthy */
  uint32_t hang;             /* nonzero: the device executes nothing more until cleared */
  uint64_t throttle_reasons; /* NVML clocks-event reasons the NVML stand-in reports (bitmask) */
  uint64_t net_rate_bps;     /* 0 = unlimited; else the NCCL stand-in paces its sends (used only
                                when network namespaces are unavailable) */
  /* maintained by the libcudart stand-in */
  uint64_t busy_ns;          /* cumulative device busy time */
  uint64_t mem_used;         /* bytes currently allocated with cudaMalloc */
  /* set by the fault injector (kernel-regression): kernels whose name contains slow_kernel take
     kernel_slowdown times longer; written name first, then the factor (release) */
  float kernel_slowdown;     /* <= 1.0: none */
  uint32_t kernel_pad;
  char slow_kernel[64];
  /* set by the fault injector (hardware faults, reported by the NVML stand-in): STRATA_HW_* bits,
     the Xid the fault raised (gpu-xid; 0: none) and when it began (CLOCK_MONOTONIC ns), from which
     its error counters climb. Written since_ns and xid first, then the bits (release). */
  uint32_t hw_faults;
  uint32_t xid;
  uint64_t hw_since_ns;
};

/* Hardware faults (strata_gpu_device_state::hw_faults). */
#define STRATA_HW_ECC 0x1u    /* uncorrectable ECC errors climbing (Xid 48) */
#define STRATA_HW_LOST 0x2u   /* fell off the bus: NVML answers GPU_IS_LOST (Xid 79) */
#define STRATA_HW_PCIE 0x4u   /* PCIe link trained at x4 of x16, replays climbing */
#define STRATA_HW_NVLINK 0x8u /* NVLink replay/CRC errors climbing (Xid 74) */

struct strata_gpu_state {
  uint64_t magic;       /* STRATA_GPU_STATE_MAGIC */
  uint32_t version;     /* STRATA_GPU_STATE_VERSION */
  uint32_t num_devices; /* devices the node has (cudaGetDeviceCount, nvmlDeviceGetCount) */
  uint64_t reserved[6];
  struct strata_gpu_device_state dev[STRATA_GPU_STATE_MAX_DEVICES];
};

#ifdef __cplusplus
static_assert(sizeof(struct strata_gpu_device_state) == 128, "device state layout");
}
#endif

#endif /* STRATA_TESTBED_GPU_STATE_H */
