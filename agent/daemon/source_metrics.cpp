#include "agent/daemon/source_metrics.h"

#include <cctype>

#include "server/prometheus.h"

namespace strata::agent::daemon {

const std::vector<SourceMetric>& source_metrics() {
  static const std::vector<SourceMetric> m = {
      // GPU and communication layer (agent/gpu_comm_source.cpp).
      {"gpu_comm.probe_entries", "strata_agent_gpu_comm_probe_entries_total", "counter", 1,
       "Entry uprobe hits on CUDA/NCCL/gloo calls in watched processes."},
      {"gpu_comm.probe_returns", "strata_agent_gpu_comm_probe_returns_total", "counter", 1,
       "Return uprobe hits matched to their entry."},
      {"gpu_comm.ringbuf_drops", "strata_agent_gpu_comm_ringbuf_drops_total", "counter", 1,
       "GPU/communication events lost in the kernel (ring buffer full)."},
      {"gpu_comm.unmatched_returns", "strata_agent_gpu_comm_unmatched_returns_total", "counter", 1,
       "Returns without their entry (attached mid-call, or the entry was evicted)."},
      {"gpu_comm.launch_bursts", "strata_agent_gpu_comm_launch_bursts_total", "counter", 1,
       "Kernel-launch sampling bursts (launch probes on for a short while)."},
      {"gpu_comm.launch_hits", "strata_agent_gpu_comm_launch_hits_total", "counter", 1,
       "Kernel-launch probe hits during bursts."},
      {"gpu_comm.launch_probe_cost_s", "strata_agent_gpu_comm_launch_probe_cost_seconds_total", "counter", 1,
       "Estimated CPU time the launch probes cost the watched processes (hits x the assumed cost per hit)."},
      {"gpu_comm.driver_launch_hits", "strata_agent_gpu_comm_driver_launch_hits_total", "counter", 1,
       "Driver-API launch probe hits (cuLaunchKernel, cuLaunchKernelEx) during bursts; part of the launch hits."},
      {"gpu_comm.driver_functions_named", "strata_agent_gpu_comm_driver_functions_named_total", "counter", 1,
       "CUfunction handles named from cuModuleGetFunction / cuFuncGetName returns."},
      {"gpu_comm.memory_hits", "strata_agent_gpu_comm_memory_hits_total", "counter", 1,
       "Memory-call probe hits (cudaMalloc, cudaFree, cudaMemcpy, cuMemAlloc_v2, cuMemFree_v2)."},
      {"gpu_comm.memory_probe_cost_s", "strata_agent_gpu_comm_memory_probe_cost_seconds_total", "counter", 1,
       "Estimated CPU time the memory-call probes cost the watched processes (hits x the assumed cost per hit)."},
      {"gpu_comm.memory_stacks", "strata_agent_gpu_comm_memory_stacks_total", "counter", 1,
       "Memory calls recorded with their CPU stack (during launch bursts only)."},
      {"gpu_comm.memory_probes_sampled", "strata_agent_gpu_comm_memory_probes_sampled", "gauge", 1,
       "1 when the memory calls' rate passed their budget and they are probed in bursts only (counts are samples)."},
      {"gpu_comm.timeline_lost", "strata_agent_gpu_comm_timeline_records_lost_total", "counter", 1,
       "Device-timeline records overwritten before they were read, or that failed the checks."},
      {"gpu_comm.timelines_refused", "strata_agent_gpu_comm_timelines_refused_total", "counter", 1,
       "Processes whose device-timeline file was refused (wrong owner, size or format)."},
      {"gpu_comm.timelines_removed", "strata_agent_gpu_comm_timelines_removed_total", "counter", 1,
       "Device-timeline files of exited processes removed from the rendezvous after their last read."},
      {"gpu_comm.gpu_processes", "", "gauge", 1, ""},                    // strata_agent_gpu_processes
      {"gpu_comm.gpu_processes_without_timeline", "", "gauge", 1, ""},  // ..._without_timeline
      {"gpu_comm.device_records_summarized", "strata_agent_gpu_comm_device_records_summarized_total", "counter", 1,
       "Device-timeline records folded into per-window summaries."},
      {"gpu_comm.attached_files", "strata_agent_gpu_comm_attached_files", "gauge", 1,
       "Libraries (CUDA, NCCL, gloo) the probes are attached to now."},
      {"gpu_comm.rejected_files_forgotten", "strata_agent_gpu_comm_rejected_files_forgotten_total", "counter", 1,
       "Times the set of files known to carry no CUDA/NCCL/gloo runtime was forgotten at its cap (each is examined again when seen)."},
      {"gpu_comm.attach_errors", "strata_agent_gpu_comm_attach_errors_total", "counter", 1,
       "Probe attachments that failed."},
      {"gpu_comm.uprobe_multi", "strata_agent_gpu_comm_uprobe_multi", "gauge", 1,
       "1 when the probes are attached with uprobe_multi links, 0 when one by one."},
      {"gpu_comm.probe_trap_cost_s", "strata_agent_gpu_comm_probe_trap_cost_seconds_total", "counter", 1,
       "Modeled cost of every uprobe hit's trap (API entries and returns, launch hits), which no BPF counter sees."},
      {"gpu_comm.bpf_run_s", "strata_agent_gpu_comm_bpf_run_seconds_total", "counter", 1,
       "Run time of the GPU/communication layer's BPF programs."},
      // Off-CPU and OS layer (agent/os/os_source.cpp; abi/offcpu.h says what each counts).
      {"offcpu_blocks", "strata_agent_offcpu_blocks_total", "counter", 1,
       "Switch-ins of watched threads with a known switch-out."},
      {"offcpu_long_blocks", "strata_agent_offcpu_long_blocks_total", "counter", 1,
       "Blocks at least as long as the off-CPU threshold."},
      {"offcpu_events", "strata_agent_offcpu_events_total", "counter", 1,
       "Long blocks written to the ring buffer."},
      {"offcpu_ringbuf_drops", "strata_agent_offcpu_ringbuf_drops_total", "counter", 1,
       "Long blocks lost in the kernel (ring buffer full)."},
      {"offcpu_rate_limited", "strata_agent_offcpu_rate_limited_total", "counter", 1,
       "Long blocks not sent: the per-CPU event cap was reached."},
      {"offcpu_captures", "strata_agent_offcpu_captures_total", "counter", 1,
       "Stacks captured at switch-out."},
      {"offcpu_capture_skipped", "strata_agent_offcpu_capture_skipped_total", "counter", 1,
       "Stack captures wanted but skipped: the per-CPU capture cap was reached."},
      {"offcpu_sampled_out", "strata_agent_offcpu_sampled_out_total", "counter", 1,
       "Stack captures wanted but sampled out (over the per-CPU target); the sampled blocks are weighted to stand for them."},
      {"offcpu_bare_sampled_out", "strata_agent_offcpu_bare_sampled_out_total", "counter", 1,
       "Long blocks without a captured stack, sampled out (over the per-CPU target); the sent ones are weighted to stand for them."},
      {"offcpu_no_user_stack", "strata_agent_offcpu_no_user_stack_total", "counter", 1,
       "Long blocks sent with the kernel stack only."},
      {"offcpu_snapshots", "strata_agent_offcpu_snapshots_total", "counter", 1,
       "User stack copies taken at switch-out (for CFI unwinding)."},
      {"offcpu_snapshot_skipped", "strata_agent_offcpu_snapshot_skipped_total", "counter", 1,
       "User stack copies wanted but skipped: the per-CPU copy cap was reached."},
      {"offcpu_snapshot_lost", "strata_agent_offcpu_snapshot_lost_total", "counter", 1,
       "User stack copies reused by another thread before their owner woke."},
      {"offcpu_snapshot_sent", "strata_agent_offcpu_snapshot_sent_total", "counter", 1,
       "Long blocks sent with their user stack copy."},
      {"offcpu_snapshot_dropped", "strata_agent_offcpu_snapshot_dropped_total", "counter", 1,
       "Long blocks sent without their stack copy (no room in the ring buffer)."},
      {"offcpu_stored_us", "strata_agent_offcpu_stored_seconds_total", "counter", 1e-6,
       "Off-CPU time written to the store."},
      {"offcpu_storage_failures", "strata_agent_offcpu_storage_failures_total", "counter", 1,
       "Threads whose BPF task storage could not be created (their blocks are not seen)."},
      {"os_neighbours_full", "strata_agent_os_neighbours_full_total", "counter", 1,
       "Neighbours' CPU time not counted: the neighbour map was full."},
      {"os_map_full", "strata_agent_os_map_full_total", "counter", 1,
       "OS events (IRQ, stats, block I/O, TCP retransmits) not counted: their map was full."},
      {"os_missing_tracepoints", "strata_agent_os_missing_tracepoints", "gauge", 1,
       "OS-layer tracepoints this kernel lacks (those views are empty)."},
      {"os_bpf_run_s", "strata_agent_os_bpf_run_seconds_total", "counter", 1,
       "Run time of the off-CPU and OS layers' BPF programs."},
      {"os_bpf_runs", "strata_agent_os_bpf_runs_total", "counter", 1,
       "Runs of the off-CPU and OS layers' BPF programs."},
      // NVML poller (agent/gpu/nvml_source.cpp).
      {"nvml.devices", "strata_agent_nvml_devices", "gauge", 1, "GPUs NVML reports."},
      {"nvml.polls", "strata_agent_nvml_polls_total", "counter", 1, "NVML polls of all devices."},
      {"nvml.errors", "strata_agent_nvml_errors_total", "counter", 1, "NVML calls that failed."},
      {"nvml.poll_ms_mean", "strata_agent_nvml_poll_mean_seconds", "gauge", 1e-3,
       "Mean time of one NVML poll of all devices."},
      {"nvml.xid_event_devices", "strata_agent_nvml_xid_event_devices", "gauge", 1,
       "GPUs whose Xids arrive through NVML's event API."},
      {"nvml.xid_kernel_log", "strata_agent_nvml_xid_kernel_log", "gauge", 1,
       "1 when the kernel log is read for the Xids of GPUs without NVML events."},
      {"nvml.xids", "strata_agent_nvml_xids_total", "counter", 1, "Xids the driver reported."},
  };
  return m;
}

namespace {

// "gpu_comm.new-stat" -> "strata_agent_gpu_comm_new_stat": a valid metric name for an undescribed key.
std::string fallback_name(const std::string& key) {
  std::string n = "strata_agent_";
  for (char ch : key) n += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return n;
}

}  // namespace

void write_source_metrics(std::ostream& o, const std::vector<std::pair<std::string, double>>& stats) {
  const auto& table = source_metrics();
  for (const auto& [key, value] : stats) {
    const SourceMetric* m = nullptr;
    for (const auto& e : table)
      if (key == e.key) m = &e;
    if (m && *m->name == '\0') continue;  // on the page under its own name
    if (m) {
      server::prom::family(o, m->name, m->type, m->help);
      o << m->name << " " << value * m->scale << "\n";
    } else {
      std::string name = fallback_name(key);
      server::prom::family(o, name, "gauge", "Layer stat " + key + " " + kUndescribedHelp);
      o << name << " " << value << "\n";
    }
  }
}

}  // namespace strata::agent::daemon
