// The GPU and communication layers of a watched process (DESIGN §3): probes on the CUDA runtime,
// NCCL and gloo APIs it maps (attached when a library appears, detached when the last user goes),
// the GPU timing source for device-side times, step detection from the collective pattern, and a
// bounded flight recorder of raw records.
#pragma once

#include <memory>

#include "agent/source.h"
#include "agent/sources.h"
#include "common/result.h"

namespace strata::agent {

struct GpuCommOptions {
  bool gpu = true;   // CUDA probes + GPU timing source
  bool comm = true;  // NCCL / gloo probes
  // Launch probes (hot: a uprobe costs µs) are attached in bursts sized so that
  // hits x cost stays under this share of one CPU.
  double launch_budget_cpu = 0.0005;
  double uprobe_cost_us = 15;          // this VM: 6-25 µs per hit; bare metal 1-2 µs
  double burst_s = 0.2;
  double min_burst_period_s = 1;
  double max_burst_period_s = 60;
  // Memory calls (cudaMalloc/cudaFree/cudaMemcpy, cuMemAlloc/cuMemFree) are probed on every call:
  // each blocks its caller far longer than a probe costs, and a training loop makes few. Should
  // their hits x cost pass this share of one CPU, they join the launch bursts (sampled) instead.
  double memory_budget_cpu = 0.002;
  double memory_rate_period_s = 2;  // the rate is judged over this long
  // Past the budget, memory probes run in bursts this long (whole steps: see drive_memory_bursts),
  // as often as the budget allows at the rate they saw. Half a second: a storm ten times the
  // budget (1.3k calls/s: 256 reads a step) still gets two bursts per 10 s window, so a window is
  // seldom left unprobed (with 1 s bursts, 2 of 4 sync-copy runs of the accuracy bench, 10 s
  // windows, had no memory-call evidence in the window diagnosed).
  double memory_burst_s = 0.5;
  size_t max_device_records_per_window = 20000;  // per process; beyond: summarized, counted
};

Result<std::unique_ptr<Source>> start_gpu_comm_source(const GpuCommOptions& opts, const SourceEnv& env);
// The same source fed by a replayed capture (env.tape): no BPF, no probes, no target's files.
std::unique_ptr<Source> replay_gpu_comm_source(const GpuCommOptions& opts, const SourceEnv& env);

}  // namespace strata::agent
