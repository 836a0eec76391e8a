#include "diagnose/cause.h"

namespace strata::diagnose {

namespace {

struct CauseName {
  Cause cause;
  const char* name;
  const char* layer;
};
constexpr CauseName kCauses[] = {
    {Cause::kCpuContention, "cpu-contention", "os"},
    {Cause::kCpuThrottling, "cpu-throttling", "os"},
    {Cause::kIrqSoftirq, "irq-softirq", "os"},
    {Cause::kMemoryReclaim, "memory-reclaim", "os"},
    {Cause::kPageFaults, "page-faults", "os"},
    {Cause::kIoStall, "io-stall", "os"},
    {Cause::kHostHotspot, "host-hotspot", "cpu"},
    {Cause::kGpuSlow, "gpu-slow", "gpu"},
    {Cause::kLaunchBound, "launch-bound", "cpu"},
    {Cause::kNetworkSlow, "network-slow", "comm"},
    {Cause::kHang, "hang", "gpu"},
    {Cause::kWorkloadImbalance, "workload-imbalance", "cpu"},
    {Cause::kKernelRegression, "kernel-regression", "gpu"},
    {Cause::kGpuMemoryErrors, "gpu-memory-errors", "gpu"},
    {Cause::kGpuLost, "gpu-lost", "gpu"},
    {Cause::kPcieDegraded, "pcie-degraded", "gpu"},
    {Cause::kNvlinkDegraded, "nvlink-degraded", "gpu"},
    // The host's layer, as launch-bound: the time goes to the host thread's calls while the GPU
    // waits for it, and the fix is in the program (its allocator, its copies).
    {Cause::kMemoryAllocChurn, "memory-alloc-churn", "cpu"},
    {Cause::kSyncMemcpy, "sync-memcpy", "cpu"},
    {Cause::kSlowCpu, "slow-cpu", "os"},
};
static_assert(sizeof kCauses / sizeof kCauses[0] == kCauseCount, "one name per cause");

constexpr bool in_order() {
  for (size_t i = 0; i < kCauseCount; ++i) {
    if (static_cast<size_t>(kCauses[i].cause) != i) return false;
  }
  return true;
}
static_assert(in_order(), "kCauses is indexed by Cause");

}  // namespace

const char* cause_name(Cause c) {
  auto i = static_cast<size_t>(c);
  return i < kCauseCount ? kCauses[i].name : "?";
}

const char* layer_of(Cause c) {
  auto i = static_cast<size_t>(c);
  return i < kCauseCount ? kCauses[i].layer : "?";
}

std::optional<Cause> parse_cause(std::string_view name) {
  for (const auto& c : kCauses) {
    if (name == c.name) return c.cause;
  }
  return std::nullopt;
}

const char* scope_name(Scope s) { return s == Scope::kJob ? "job" : "rank"; }

}  // namespace strata::diagnose
