// Live on-CPU sampler: perf_event cpu-clock on every CPU + bpf/oncpu.bpf.c, process-tree filter.
// Lifecycle (libbpf-bootstrap's): open -> set rodata and map sizes -> load -> attach -> poll -> destroy.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "agent/events.h"
#include "common/result.h"

namespace strata::agent {

struct SamplerOptions {
  unsigned frequency_hz = 99;
  bool sample_cpu = true;  // false: only track the process tree (the cpu layer is off)
  bool follow_children = true;
  uint32_t max_targets = 16384;
  uint32_t ringbuf_bytes_per_cpu = 256 * 1024;
};

struct SamplerCounters {
  uint64_t samples = 0;        // perf_event hits on watched threads
  uint64_t emitted = 0;        // delivered to the agent
  uint64_t ringbuf_drops = 0;  // lost in the kernel: ring buffer full
  uint64_t kstack_errors = 0;
  uint64_t ustack_errors = 0;
  uint64_t proc_events = 0;
  uint64_t proc_drops = 0;
  uint64_t targets_full = 0;
  uint64_t bpf_run_ns = 0;     // run time of the sampler's BPF programs (kernel BPF stats)
  uint64_t bpf_run_cnt = 0;
  bool bpf_stats = false;      // whether bpf_run_* are measured
};

class OnCpuSampler {
 public:
  // Fails with exit-code-2 class errors (permissions, kernel features) explained in one line.
  static Result<std::unique_ptr<OnCpuSampler>> start(const SamplerOptions& opts);
  virtual ~OnCpuSampler() = default;
  virtual Status add_target(uint32_t pid) = 0;
  // Waits up to timeout_ms for events, delivers them to sink; returns the number delivered.
  virtual Result<int> poll(int timeout_ms, EventSink& sink) = 0;
  virtual SamplerCounters counters() const = 0;
  // The map of watched tgids (children added at fork), for other BPF sources to share.
  virtual int targets_map_fd() const = 0;
};

// Whether this process may load BPF and open perf events; an Error names what is missing.
Status check_bpf_permissions();

}  // namespace strata::agent
