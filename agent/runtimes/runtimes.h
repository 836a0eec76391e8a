// Runtimes strata attaches to: the CUDA runtime and driver, NCCL, and gloo. Each is recognized by
// the functions an ELF file exports — wherever the file lives (system lib dir, a Python wheel, linked
// into libtorch) — and brings the probe points it needs (STYLE: loader -> per-file data).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "abi/gpu_comm.h"
#include "common/result.h"

namespace strata::agent {

enum class RuntimeKind { kCudaRuntime, kCudaDriver, kNccl, kGloo, kDynamicLoader };
const char* runtime_name(RuntimeKind k);

struct ProbeSpec {
  std::vector<const char*> symbols;  // first one exported wins (e.g. ncclAllReduce, then pncclAllReduce)
  strata_api api;
  bool hot;  // fires per kernel: attached only in sampled bursts
};

struct RuntimeSpec {
  RuntimeKind kind;
  std::vector<const char*> signature;  // all exported: the file is this runtime
  std::vector<ProbeSpec> probes;
};

const std::vector<RuntimeSpec>& runtime_specs();

struct ResolvedProbe {
  strata_api api;
  std::string symbol;
  uint64_t file_offset = 0;
  bool hot = false;
};

// One runtime found in one file: what to attach, where.
struct RuntimeFile {
  RuntimeKind kind;
  std::string path;
  std::string build_id;
  std::vector<ResolvedProbe> probes;
};

// The runtimes a file carries (none for most files; several when e.g. NCCL is linked into a larger
// library). Errors only for unreadable files.
Result<std::vector<RuntimeFile>> recognize_runtimes(const std::string& path);

// Display name of an API ("ncclAllReduce") and its collective op ("allreduce"; "" if not one).
const char* api_name(uint32_t api);
const char* api_collective_op(uint32_t api);
bool api_is_collective(uint32_t api);
// Device memory calls (cudaMalloc, cudaFree, synchronous cudaMemcpy, cuMemAlloc_v2, cuMemFree_v2):
// counted and timed on every call while their rate fits the budget, sampled in bursts beyond it.
bool api_is_memory(uint32_t api);

}  // namespace strata::agent
