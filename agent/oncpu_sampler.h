// Live on-CPU sampler: perf_event cpu-clock on every CPU + bpf/oncpu.bpf.c, process-tree filter.
// Lifecycle (libbpf-bootstrap's): open -> set rodata and map sizes -> load -> attach -> poll -> destroy.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "agent/events.h"
#include "common/result.h"

struct strata_py_offsets;
struct strata_unwind_row;
struct strata_proc_mappings;

namespace strata::agent {

struct SamplerOptions {
  unsigned frequency_hz = 99;
  bool sample_cpu = true;  // false: only track the process tree (the cpu layer is off)
  bool follow_children = true;
  uint32_t max_targets = 16384;
  uint32_t ringbuf_bytes_per_cpu = 1024 * 1024;  // a sample with a stack copy is up to ~28 KiB
  // User stacks: 0 kernel frame-pointer walk only, 1 stack copy unwound on the node, 2 adaptive (the
  // kernel's walk, plus a copy where it enters a module without frame pointers), 3 kernel CFI walk.
  // See abi/oncpu.h.
  uint32_t user_stack_mode = 2;
  uint32_t snapshot_pages = 6;  // stack copy: rest of rsp's page + up to this many pages in all
                                // (STRATA_ONCPU_SNAPSHOT_MAX)
  // Mode 3 (kernel CFI walk): the kernel's tables, preallocated at these sizes (12 bytes a row,
  // 4 KiB a process). Loading stops, counted, when the rows are spent.
  uint32_t kcfi_max_rows = 1u << 20;
  uint32_t kcfi_max_pages = 1u << 18;  // page index entries (4 bytes per 4 KiB of code): 1 GiB of code
  uint32_t kcfi_max_modules = 4096;
  // Preallocated (perf_event programs may only use preallocated hash maps), 32 KiB each: 8 MiB.
  // Processes past it are walked with frame pointers, checked on the node.
  uint32_t kcfi_max_procs = 256;
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
  uint64_t snapshot_errors = 0;   // user stack could not be copied
  uint64_t py_samples = 0;        // samples of processes running CPython
  uint64_t py_no_thread = 0;      // ... whose thread had no Python thread state
  uint64_t py_read_errors = 0;
  uint64_t py_truncated = 0;
  uint64_t copies_skipped = 0;  // adaptive mode: frame-pointer walks trusted alone (no stack copy)
  uint64_t kcfi_walks = 0;     // kernel CFI walks (mode 3) ...
  uint64_t kcfi_stops[7] = {};  // ... by why they stopped (enum strata_kcfi_stop - 1)
  uint64_t kcfi_frames = 0;     // frames stepped with CFI rows in the kernel
  uint64_t kcfi_fp_frames = 0;  // ... with frame pointers
  uint64_t kcfi_rows = 0;       // rows loaded into the kernel's table
  uint64_t kcfi_pages = 0;      // page index entries loaded
  uint64_t kcfi_row_capacity = 0;
  uint64_t kcfi_modules = 0;
  uint64_t kcfi_full = 0;       // modules refused: the row budget was spent
  uint64_t bpf_sample_run_ns = 0;  // ... of the sampling program alone (fork/exec/exit of every
                                   // process on the node run the others)
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
  // Also ends poll's wait when `fd` is readable: another source's ring buffer asking to be drained
  // before it fills (the caller then polls that source). Not owned.
  virtual Status add_wake_fd(int fd) = 0;
  virtual SamplerCounters counters() const = 0;
  // Changes the sampling rate of the running perf events (the cost budget lowers it).
  virtual Status set_frequency(unsigned hz) = 0;
  // The map of watched tgids (children added at fork), for other BPF sources to share.
  virtual int targets_map_fd() const = 0;
  // ... and as a bitmap by tgid (bpf/strata_targets.bpf.h), kept in step by the kernel side.
  virtual int target_bits_fd() const = 0;
  // Tells the kernel side where process `pid`'s CPython keeps its frames (nullptr: forget it).
  virtual Status set_python_process(uint32_t pid, const struct strata_py_offsets* offsets) = 0;
  // The user-stack mode the program runs with (options, or STRATA_USER_STACK_MODE): abi/oncpu.h.
  virtual uint32_t user_stack_mode() const { return 2; }
  // Mode 3: copies a module's rows (struct strata_unwind_row, sorted) into the kernel's table and
  // returns its module id; fails when the row budget is spent (counted).
  virtual Result<uint32_t> load_unwind_module(const struct strata_unwind_row* rows, size_t n) {
    (void)rows;
    (void)n;
    return Error{"no kernel unwind tables"};
  }
  // Mode 3: the process's executable mappings for the kernel's walk (nullptr: forget it).
  virtual Status set_process_mappings(uint32_t pid, const struct strata_proc_mappings* maps) {
    (void)pid;
    (void)maps;
    return {};
  }
};

// Whether this process may load BPF and open perf events; an Error names what is missing.
Status check_bpf_permissions();

}  // namespace strata::agent
