// The live source of the "offcpu" and "os" layers: bpf/offcpu.bpf.c (sched_switch: off-CPU stacks and
// scheduler counters) and bpf/os.bpf.c (IRQ/softirq, reclaim, compaction, block I/O, TCP
// retransmits), plus /proc and cgroup files, read every window into the store (off-CPU stack counts
// and the metrics listed in agent/os/os_metrics.h). One source serves both layers so a context switch
// runs one BPF program whichever layers are on.
//
// Settings (environment, for tests and benchmarks; the defaults suit production):
//   STRATA_OFFCPU_MIN_BLOCK_US  a block shorter than this is counted, not sent with its stack (1000)
//   STRATA_OFFCPU_MAX_EVENTS    long blocks sent per CPU per second (1000)
//   STRATA_OFFCPU_MAX_CAPTURES  stack captures at switch-out per CPU per second, a hard cap (1000)
//   STRATA_OFFCPU_CAPTURE_TARGET captures wanted per CPU per second above which they are sampled, at
//                               full budget (100; the cost budget halves it per level)
//   STRATA_OFFCPU_MAX_SNAPSHOTS user stack copies (for CFI unwinding) per CPU per second (500)
//   STRATA_OFFCPU_SNAPSHOT_SLOTS copies kept at once, node-wide, 16 KB each (256: 4 MB)
//   STRATA_USER_STACK_MODE=0    frame pointers only, no copies (as for on-CPU samples)
#pragma once

#include <memory>

#include "agent/source.h"
#include "agent/sources.h"
#include "common/result.h"

namespace strata::agent::os {

struct OsLayerOptions {
  bool offcpu = true;  // off-CPU stacks
  bool os = true;      // OS metrics
  uint64_t min_block_us = 1000;
  uint32_t max_events_per_sec = 1000;
  uint32_t max_captures_per_sec = 1000;
  // Above this many wanted captures per CPU per second in a class (sleeps; D state; long blocks
  // sent without a capture: abi/offcpu.h), one in 2^k of the class is taken and weighted 2^k
  // (bpf/offcpu.bpf.c). A capture costs ~6-8 us here (a user stack walk, a 16 KB copy, the event and
  // its unwinding). 25: at 100, once preempted threads were no longer captured (their cheap
  // frame-pointer-only captures had taken half the target), every capture carried a copy and the
  // sched_switch program cost 1.3-1.9 us a switch on the 4-rank sim job, more than before; at 25 it
  // cost 0.74x what the old program did at 100 (bench/switch_cost.sh, side by side; 0.55x of the new
  // one at 100), and without the off-CPU layer it is ~0.55 us. A 10 s window still gets ~250
  // captured sleeps per busy CPU (a stack holding 5% of the blocked time placed within about +-2.8%,
  // two binomial s.d.), and D-state blocks, the ones the diagnosis weighs, get 250 of their own
  // instead of sharing the target with a node's many futex waits. The weights keep every stack's
  // blocked time unbiased whatever the rate.
  uint32_t capture_target_per_sec = 25;
  uint32_t explore_per_sec = 50;
  uint32_t snapshot_pages = 4;           // user stack copy at switch-out; 0: frame pointers only
  uint32_t max_snapshots_per_sec = 500;  // per CPU
  uint32_t snapshot_slots = 256;         // the pool of copies waiting for their thread to wake
  uint32_t ringbuf_bytes_per_cpu = 512 * 1024;
  uint32_t max_processes = 4096;
};

// Defaults, overridden by the STRATA_OFFCPU_* environment variables above.
OsLayerOptions options_from_env(bool offcpu, bool os);

// Loads and attaches the programs; fails with what is missing (kernel feature, permission).
// With a capturing env.tape, every drain of the ring buffer and every read is also taped.
Result<std::unique_ptr<Source>> start_os_layer(const OsLayerOptions& opts, const SourceEnv& env);
// The same source fed by a replaying env.tape (agent/capture.h): no BPF, no /proc.
Result<std::unique_ptr<Source>> replay_os_layer(const OsLayerOptions& opts, const SourceEnv& env);

}  // namespace strata::agent::os
