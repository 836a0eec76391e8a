// strata-sim's command line and fault specs: parsed and validated before anything starts, so a bad
// spec fails with one line and exit 1.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>
#include <vector>

#include "common/result.h"

namespace testbed::sim {

enum class FaultKind {
  kNone,
  kCpuContention,
  kCpuThrottling,
  kMemoryReclaim,
  kIoStall,
  kHostHotspot,
  kGpuSlow,
  kNetworkSlow,
  kHang,
  kWorkloadImbalance,
  kKernelRegression,
  // Hardware faults the NVML stand-in reports (testbed/nvml/nvml.cpp), on the rank's stand-in GPU.
  kGpuEcc,
  kGpuXid,
  kPcieDegraded,
  kNvlinkErrors,
  // The rank's host thread in device-memory calls (through the libcudart stand-in, real ABI).
  kAllocChurn,
  kSyncCopy,
  // The rank's CPU is slower than its peers' (a core's clock held down, a busy SMT sibling, a
  // hypervisor's steal), which no VM here can make: the rank's CPU work runs longer in process.
  kSlowCpu,
  // The rank's memory-mapped data is out of memory when it reads it (a dataset in np.memmap or an
  // Arrow file whose page cache the node's other work evicted, or swapped-out memory): every page it
  // touches is a major fault that waits for the disk.
  kPageFaults,
  // The rank's optimizer steps tensor by tensor (foreach and fused off): thousands of tiny kernels,
  // each costing the host more than the device; the device waits for the host's launches.
  kLaunchBound,
  // Network receive work steered onto the rank's CPU (a NIC queue's interrupts and RPS aimed at
  // the cores the training process runs on): NET_RX softirq runs on that CPU, stealing from
  // whatever is current there, and overflows into its ksoftirqd thread when it runs long.
  kIrqSoftirq,
};

struct FaultSpec {
  FaultKind kind = FaultKind::kNone;
  std::string name = "none";  // as written: "gpu-slow"
  int rank = -1;              // culprit; -1 for none; with all_ranks, the rank whose steps time it
  bool all_ranks = false;     // rank=all: every rank alike (gpu-slow, io-stall, network-slow; kernel-regression always)
  std::string kernel;         // kernel-regression: the kernel (a substring of its name)
  bool in_worker = false;     // io-stall where=worker: every rank loads through a worker process
  int start_step = 0;
  std::map<std::string, double> params;  // kind-specific, defaults filled in

  double param(const std::string& key) const { return params.at(key); }
};

// DESIGN §6 vocabulary: the layer and cause class a fault kind belongs to.
const char* fault_layer(FaultKind kind);
const char* fault_cause(FaultKind kind);
// The cause class of a spec: gpu-xid's depends on its code (79 gpu-lost, 48 gpu-memory-errors,
// 74 nvlink-degraded); every other kind's is fault_cause(kind).
const char* fault_cause(const FaultSpec& f);
// Whether the fault stops the culprit's stand-in GPU (hang, gpu-xid:code=79): the run ends by its
// hang timeout, as intended.
bool stops_device(const FaultSpec& f);

struct Options {
  int ranks = 0;
  int steps = 0;
  FaultSpec fault;
  bool python = false;
  std::string python_exe;  // --python-exe, default: python3 on PATH
  unsigned seed = 1;
  std::string truth_path;
  std::string mode = "ddp";     // ddp | fsdp
  int pp = 1, tp = 1;           // pipeline stages, tensor-parallel width (ranks = pp x tp x replicas)
  double hang_timeout_s = 30;   // no progress for this long: stop the run
  double scale = 1.0;           // multiplies the modeled kernel durations
  bool quiet = false;
  bool driver_api = false;    // part of the kernels through cuLaunchKernel(Ex), as Triton launches them
  bool memory_calls = false;  // per step: cudaMalloc, a synchronous cudaMemcpy, cudaFree (+ cuMemAlloc/cuMemFree)
};

// Parses "KIND[:key=value,...]" for a job of `ranks` ranks and `steps` steps.
strata::Result<FaultSpec> parse_fault(const std::string& text, int ranks, int steps);

// `strata-sim run`'s options as given, before they are checked: CLI11 fills it (add_run_options),
// finish_run checks it, with messages that name the option and the range it wants.
struct RunArgs {
  std::string ranks, steps, seed, mode, hang_timeout, scale;
  std::string pp, tp;
  std::string fault = "none";
  std::string python_exe, truth;
  bool python = false;
  bool quiet = false;
  bool driver_api = false;
  bool memory_calls = false;
};
void add_run_options(CLI::App& app, RunArgs& args);
strata::Result<Options> finish_run(const RunArgs& args);

// Both, for argv after "run" (tests and fuzzing); --help is an error here.
strata::Result<Options> parse_run(const std::vector<std::string>& args);

}  // namespace testbed::sim
