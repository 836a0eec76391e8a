#include "diagnose/model.h"

#include <algorithm>

namespace strata::diagnose {

double value_of(const Values& v, NameId name) {
  auto it = std::lower_bound(v.begin(), v.end(), name, [](const Value& a, NameId n) { return a.name < n; });
  return it != v.end() && it->name == name ? it->ms_per_step : 0;
}

void normalize(Values& v) {
  std::sort(v.begin(), v.end(), [](const Value& a, const Value& b) { return a.name < b.name; });
  Values out;
  out.reserve(v.size());
  for (const auto& e : v) {
    if (!out.empty() && out.back().name == e.name) {
      out.back().ms_per_step += e.ms_per_step;
    } else {
      out.push_back(e);
    }
  }
  v = std::move(out);
}

const char* os_name(Os m) {
  switch (m) {
    case Os::kCpu: return "on-CPU time";
    case Os::kRunqWait: return "run-queue wait";
    case Os::kThrottled: return "cgroup CPU throttling";
    case Os::kReclaim: return "direct reclaim + compaction";
    case Os::kBlockedIo: return "blocked in I/O";
    case Os::kIrq: return "IRQ + softirq time";
    case Os::kMajorFaults: return "major faults";
    case Os::kBioLatency: return "block I/O latency";
    case Os::kLaunchApi: return "kernel-launch API time";
    case Os::kAllocApi: return "device-memory allocation API time";
    case Os::kAllocCalls: return "device-memory allocation calls";
    case Os::kSyncCopyApi: return "synchronous-copy API time";
    case Os::kSyncCopyCalls: return "synchronous copies";
    case Os::kSyncCopyMb: return "synchronously copied MB";
    case Os::kKernels: return "kernels run";
    case Os::kCount: break;
  }
  return "?";
}

bool os_is_time(Os m) {
  switch (m) {
    case Os::kMajorFaults:
    case Os::kBioLatency:
    case Os::kAllocCalls:
    case Os::kSyncCopyCalls:
    case Os::kSyncCopyMb:
    case Os::kKernels:
    case Os::kCount: return false;
    default: return true;
  }
}

}  // namespace strata::diagnose
