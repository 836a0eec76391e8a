// The NVML part of the GPU layer (DESIGN §3): the node's GPUs as the driver reports them, polled at
// 1 Hz — clocks and why they are low, temperature, power, utilization, memory, ECC, PCIe and NVLink.
// A slow GPU (thermal or power throttling, a degraded PCIe link, a failing NVLink) shows here, not in
// the job's own calls.
//
// NVML is dlopened (never linked): $STRATA_NVML_LIBRARY, else libnvidia-ml.so.1 — the driver's,
// or the testbed's stand-in in tests. Without it (no driver, no GPU) the source is not started and the
// caller reports the reason once. Calls a device does not support (NOT_SUPPORTED, NO_PERMISSION,
// missing in an older driver) are dropped for that device after the first try, quietly.
//
// Sampling runs on its own thread by default: NVML calls can block for tens of ms (the PCIe
// throughput counters sample for 20 ms each), which the record loop must not wait for.
//
// Metrics, written at every window flush with pid 0 (the node) and label "gpu<index>" (NVML's
// index). Means and fractions are over the polls of the window; series a device does not support are
// not written.
//   gpu.polls                 samples taken in the window
//   gpu.sm_clock_mhz          SM clock, mean          gpu.sm_clock_min_mhz   SM clock, lowest poll
//   gpu.max_sm_clock_mhz      the SM clock the board can boost to
//   gpu.mem_clock_mhz         memory clock, mean      gpu.max_mem_clock_mhz  its maximum
//   gpu.throttle_reasons      OR of the clocks-event reason bits seen (NVML's nvmlClocksEventReason*)
//   gpu.throttle.<reason>     fraction of polls with that reason, written for reasons seen:
//                             gpu_idle, applications_clocks, sw_power_cap, hw_slowdown, sync_boost,
//                             sw_thermal, hw_thermal, hw_power_brake, display_clocks
//   gpu.throttled             fraction of polls with a reason that slows a busy GPU (power cap,
//                             thermal, hardware slowdown, power brake); idle / app clocks excluded
//   gpu.temp_c                temperature, mean       gpu.temp_max_c         highest poll
//   gpu.power_w               power draw, mean        gpu.power_limit_w      enforced power limit
//   gpu.util_pct              kernel-running time %, mean   gpu.mem_util_pct  memory busy %, mean
//   gpu.mem_used_mb           device memory used, highest poll (MiB)   gpu.mem_total_mb  (MiB)
//   gpu.ecc_corrected         corrected ECC errors new in the window (volatile counter)
//   gpu.ecc_uncorrected       uncorrected ECC errors new in the window
//   gpu.pcie_tx_mb_s          PCIe transmit, MB/s (10^6 B), mean      gpu.pcie_rx_mb_s  receive
//   gpu.pcie_replays          PCIe replays new in the window (link errors)
//   gpu.pcie_link_gen         current PCIe generation   gpu.pcie_link_width  current lanes
//   gpu.pcie_link_max_width   lanes the link can have (width < max: a degraded link)
//   gpu.nvlink_links_active   NVLinks up
//   gpu.nvlink_tx_mb_s        NVLink data transmitted, MB/s over the window   gpu.nvlink_rx_mb_s
//   gpu.nvlink_errors         NVLink replay + recovery + CRC errors new in the window
//   gpu.lost                  1 when NVML said the GPU fell off the bus (GPU_IS_LOST)
//   gpu.xid                   an Xid the driver reported in the window (value: the Xid, e.g. 79 fell
//                             off the bus, 48 double-bit ECC, 74 NVLink); one row per distinct Xid
//
// Xids are events, not counters: they are waited for on a thread of their own (never the record
// loop), through NVML's event API (nvmlDeviceRegisterEvents for nvmlEventTypeXidCriticalError,
// nvmlEventSetWait_v2 with a bounded timeout). For devices where that is missing or refused
// (NOT_SUPPORTED, NO_PERMISSION: some boards, containers, older drivers) the kernel log is read
// instead: /dev/kmsg lines "NVRM: Xid (PCI:0000:3b:00): 79, ..." name the GPU by its PCI address,
// which nvmlDeviceGetPciInfo maps to the device. Only Xids raised after the source started count.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "agent/source.h"
#include "common/result.h"

namespace strata::agent {

struct NvmlOptions {
  std::string library;    // empty: $STRATA_NVML_LIBRARY, else "libnvidia-ml.so.1"
  double period_s = 1.0;  // between samples
  bool thread = true;     // sample on an own thread (from start_threads()); false: poll() samples when a period has passed
  // The kernel log read for Xids of devices without NVML events: /dev/kmsg's records, or any file
  // of log lines (tests). Empty: not read.
  std::string kernel_log = "/dev/kmsg";
};

// An Xid as the kernel log says it: the GPU's PCI address and the Xid.
struct KernelXid {
  unsigned domain = 0, bus = 0, device = 0;
  unsigned code = 0;
};
// Parses one kernel log line: a /dev/kmsg record ("6,1234,5678,-;NVRM: Xid (PCI:0000:3b:00): 79,
// pid=1234, GPU has fallen off the bus.") or a dmesg line ("[ 12.5] NVRM: Xid (0000:3b:00): 48, ...").
// Anything else (another message, a truncated or garbled Xid line): nullopt.
std::optional<KernelXid> parse_kernel_xid(std::string_view line);

// Loads NVML and finds the devices. Error (with the reason, for a one-line warning) when the library
// cannot be loaded, lacks its core calls, or nvmlInit fails: then there is nothing to poll.
Result<std::unique_ptr<Source>> start_nvml_source(const NvmlOptions& opts);

}  // namespace strata::agent
