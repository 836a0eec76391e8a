// Per-process, per-window OS metrics from cumulative snapshots (kernel maps, /proc, cgroup files):
// pure functions, so the naming and the arithmetic are tested without a kernel.
//
// Metrics written to the store (store::Metric; value per window; pid = the process). For any name,
// the process's total is the sum over its labels.
//   os.cpu_time_us                     run time of the process's threads (sched_switch)
//   os.cpu_time_by_cpu_us              label = a CPU's number, or "other": the same run time by the
//                                      CPUs that held 5% of it or more (4 at most), the rest "other"
//   os.runq_wait_us                    total time its threads waited runnable on a run queue
//   os.runq_latency_us.count/.mean     run slices measured and their mean run-queue wait
//   os.runq_latency_us.p50/.p90/.p99/.max  percentiles of that wait (bucket upper bounds, <25% error)
//   os.runq_latency_us.hist            label "le=N": waits below N us (non-empty buckets only)
//   os.voluntary_switches              switches out while blocking
//   os.involuntary_switches            switches out while still runnable (preempted, yield)
//   os.migrations                      a thread ran on another CPU than the last time
//   os.blocked_us                      label sleep|io|uninterruptible|preempted|other: off-CPU time of
//                                      its threads by the scheduler's reason (all blocks, any length)
//   os.irq_time_us                     label "IRQ:name": hard IRQ time while its threads were current
//   os.softirq_time_us                 label "NET_RX", "TIMER", ...: softirq time, likewise
//   os.direct_reclaim_count / _us      label global|memcg: direct reclaim in its context
//   os.compaction_stall_count / _us    direct compaction in its context
//   os.minor_faults / os.major_faults  /proc/PID/stat deltas (the whole thread group)
//   os.bio_count                       block requests started in its context and completed
//   os.bio_latency_us.mean/.p50/.p99/.max, .hist  their latency, start to completion
//   os.tcp_retransmits                 retransmitted segments on sockets it holds (socket inode)
//   os.cgroup_nr_periods / os.cgroup_nr_throttled / os.cgroup_throttled_us
//                                      label = cgroup path: CPU quota enforcement of its cgroup
//                                      (v1 cpu.stat or v2 cpu.stat), shared by the cgroup's processes
//   os.neighbour_run_us                label "comm:pid": run time of other processes (watched or not)
//                                      on the CPUs it used, weighted by its share of run time per CPU
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "abi/offcpu.h"
#include "abi/os.h"
#include "agent/os/cgroup.h"
#include "agent/os/proc_readers.h"
#include "store/store.h"

namespace strata::agent::os {

// Cumulative values of one process at one moment.
struct ProcSnapshot {
  std::optional<strata_sched_stats> sched;
  std::optional<strata_os_stats> os;
  std::map<std::pair<uint16_t, uint16_t>, uint64_t> irq_ns;  // (strata_irq_kind, vector) -> ns
  std::optional<Faults> faults;
  std::optional<CpuStat> cpu_stat;
  std::string cgroup;  // label of the cgroup metrics
  std::vector<TcpLink> tcp;  // established TCP connections
};

// A neighbour's run time on one CPU during the window (read and cleared from the kernel map).
struct Neighbour {
  uint32_t cpu = 0;
  uint32_t tgid = 0;
  std::string comm;
  uint64_t run_ns = 0;
};

struct MetricInputs {
  std::vector<Neighbour> neighbours;            // the whole node's, this window
  uint64_t tcp_retransmits = 0;                 // this process's, this window
  const std::map<unsigned, std::string>* irq_names = nullptr;
  size_t max_neighbours = 10;                   // per process, largest first
  size_t max_tcp_links = 32;                    // per process, most bytes first
  double min_neighbour_us = 100;                // smaller ones are left out
};

// The metrics of `pid` between two snapshots (`before` may be empty: counters start at zero).
std::vector<store::Metric> process_metrics(uint32_t pid, const ProcSnapshot& before, const ProcSnapshot& now,
                                           const MetricInputs& in);

// Off-CPU reason names as labels and synthetic frames use them.
const char* reason_name(unsigned reason);

}  // namespace strata::agent::os
