// DESIGN §6's cause classes: one enum and one table of names. The report, `diagnose --json`, the
// web UI and the testbed's truth (testbed/sim/spec.cpp writes the same strings) all use these names.
#pragma once

#include <optional>
#include <string_view>

namespace strata::diagnose {

enum class Cause : int {
  kCpuContention = 0,
  kCpuThrottling,
  kIrqSoftirq,
  kMemoryReclaim,
  kPageFaults,
  kIoStall,
  kHostHotspot,
  kGpuSlow,
  kLaunchBound,
  kNetworkSlow,
  kHang,
  kWorkloadImbalance,
  kKernelRegression,
  // Hardware, from NVML's counters (DESIGN §3): a fault of the GPU, its memory or its links.
  kGpuMemoryErrors,
  kGpuLost,
  kPcieDegraded,
  kNvlinkDegraded,
  // The host thread waits in device-memory calls (issue 18): allocation and release every step
  // (the caching allocator off, or fragmented so that it frees and retries), or synchronous copies.
  kMemoryAllocChurn,
  kSyncMemcpy,
  // The rank's usual work runs slower on the one CPU it is confined to than its node's peers' on
  // theirs: a slower core (its clock, its SMT sibling, a hypervisor's steal).
  kSlowCpu,
  kCount,
};
inline constexpr size_t kCauseCount = static_cast<size_t>(Cause::kCount);

// "cpu-contention", ...; the one place these strings are spelled.
const char* cause_name(Cause c);
std::optional<Cause> parse_cause(std::string_view name);
// The layer a cause belongs to: "os" | "cpu" | "gpu" | "comm".
const char* layer_of(Cause c);

// Whom a finding is about: one rank, or the whole job (every rank slowed alike; rank -1).
enum class Scope : int { kRank = 0, kJob };
const char* scope_name(Scope s);

}  // namespace strata::diagnose
