#include "agent/runtimes/runtimes.h"

#include "symbolize/exports.h"

namespace strata::agent {

const char* runtime_name(RuntimeKind k) {
  switch (k) {
    case RuntimeKind::kCudaRuntime: return "cuda-runtime";
    case RuntimeKind::kCudaDriver: return "cuda-driver";
    case RuntimeKind::kNccl: return "nccl";
    case RuntimeKind::kGloo: return "gloo";
    case RuntimeKind::kDynamicLoader: return "ld.so";
  }
  return "?";
}

const std::vector<RuntimeSpec>& runtime_specs() {
  static const std::vector<RuntimeSpec> specs = {
      {RuntimeKind::kNccl,
       {"ncclAllReduce", "ncclCommInitRank"},
       {
           {{"ncclAllReduce", "pncclAllReduce"}, STRATA_API_NCCL_ALLREDUCE, false},
           {{"ncclAllGather", "pncclAllGather"}, STRATA_API_NCCL_ALLGATHER, false},
           {{"ncclReduceScatter", "pncclReduceScatter"}, STRATA_API_NCCL_REDUCESCATTER, false},
           {{"ncclBroadcast", "pncclBroadcast"}, STRATA_API_NCCL_BROADCAST, false},
           {{"ncclReduce", "pncclReduce"}, STRATA_API_NCCL_REDUCE, false},
           {{"ncclSend", "pncclSend"}, STRATA_API_NCCL_SEND, false},
           {{"ncclRecv", "pncclRecv"}, STRATA_API_NCCL_RECV, false},
           {{"ncclGroupStart", "pncclGroupStart"}, STRATA_API_NCCL_GROUP_START, false},
           {{"ncclGroupEnd", "pncclGroupEnd"}, STRATA_API_NCCL_GROUP_END, false},
           {{"ncclCommInitRank", "pncclCommInitRank"}, STRATA_API_NCCL_COMM_INIT_RANK, false},
           {{"ncclCommInitRankConfig", "pncclCommInitRankConfig"}, STRATA_API_NCCL_COMM_INIT_RANK_CONFIG, false},
           {{"ncclCommDestroy", "pncclCommDestroy"}, STRATA_API_NCCL_COMM_DESTROY, false},
           {{"ncclGetVersion", "pncclGetVersion"}, STRATA_API_NCCL_GET_VERSION, false},
           {{"ncclCommInitAll", "pncclCommInitAll"}, STRATA_API_NCCL_COMM_INIT_ALL, false},
           {{"ncclCommSplit", "pncclCommSplit"}, STRATA_API_NCCL_COMM_SPLIT, false},
       }},
      {RuntimeKind::kCudaRuntime,
       {"cudaLaunchKernel", "cudaStreamSynchronize"},
       {
           {{"cudaLaunchKernel"}, STRATA_API_CUDA_LAUNCH_KERNEL, true},
           {{"cudaLaunchKernel_ptsz"}, STRATA_API_CUDA_LAUNCH_KERNEL, true},
           {{"cudaMemcpyAsync"}, STRATA_API_CUDA_MEMCPY_ASYNC, true},
           {{"cudaStreamSynchronize"}, STRATA_API_CUDA_STREAM_SYNCHRONIZE, false},
           {{"cudaDeviceSynchronize"}, STRATA_API_CUDA_DEVICE_SYNCHRONIZE, false},
           {{"cudaEventSynchronize"}, STRATA_API_CUDA_EVENT_SYNCHRONIZE, false},
           {{"cudaSetDevice"}, STRATA_API_CUDA_SET_DEVICE, false},
           {{"cudaGetDeviceCount"}, STRATA_API_CUDA_GET_DEVICE_COUNT, false},
           // Memory calls: not hot by this flag; the agent keeps them on while their rate fits
           // the budget (api_is_memory).
           {{"cudaMalloc"}, STRATA_API_CUDA_MALLOC, false},
           {{"cudaFree"}, STRATA_API_CUDA_FREE, false},
           {{"cudaMemcpy"}, STRATA_API_CUDA_MEMCPY, false},
       }},
      // The driver API: Triton and torch.compile launch their kernels with cuLaunchKernel(Ex), by
      // CUfunction handles that cuModuleGetFunction (or cuFuncGetName) names.
      {RuntimeKind::kCudaDriver,
       {"cuLaunchKernel", "cuModuleGetFunction"},
       {
           {{"cuLaunchKernel"}, STRATA_API_CU_LAUNCH_KERNEL, true},
           {{"cuLaunchKernel_ptsz"}, STRATA_API_CU_LAUNCH_KERNEL, true},
           {{"cuLaunchKernelEx"}, STRATA_API_CU_LAUNCH_KERNEL_EX, true},
           {{"cuLaunchKernelEx_ptsz"}, STRATA_API_CU_LAUNCH_KERNEL_EX, true},
           {{"cuModuleGetFunction"}, STRATA_API_CU_MODULE_GET_FUNCTION, false},
           {{"cuFuncGetName"}, STRATA_API_CU_FUNC_GET_NAME, false},
           // CUDA 12's library API: a kernel looked up by name, launched as is or through the
           // function of the current context.
           {{"cuLibraryGetKernel"}, STRATA_API_CU_LIBRARY_GET_KERNEL, false},
           {{"cuKernelGetFunction"}, STRATA_API_CU_KERNEL_GET_FUNCTION, false},
           {{"cuKernelGetName"}, STRATA_API_CU_KERNEL_GET_NAME, false},
           {{"cuMemAlloc_v2"}, STRATA_API_CU_MEM_ALLOC, false},
           {{"cuMemFree_v2"}, STRATA_API_CU_MEM_FREE, false},
       }},
      {RuntimeKind::kGloo,
       {"_ZN4gloo9allreduceERKNS_16AllreduceOptionsE"},
       {
           {{"_ZN4gloo9allreduceERKNS_16AllreduceOptionsE"}, STRATA_API_GLOO_ALLREDUCE, false},
           {{"_ZN4gloo9allgatherERNS_16AllgatherOptionsE"}, STRATA_API_GLOO_ALLGATHER, false},
           {{"_ZN4gloo9broadcastERNS_16BroadcastOptionsE"}, STRATA_API_GLOO_BROADCAST, false},
           {{"_ZN4gloo7barrierERNS_14BarrierOptionsE"}, STRATA_API_GLOO_BARRIER, false},
       }},
      // Not a runtime: the loader tells us when a process loads a library (dlopen), so the
      // agent looks at its mappings then instead of rereading them all the time.
      {RuntimeKind::kDynamicLoader, {"_dl_debug_state"}, {{{"_dl_debug_state"}, STRATA_API_DL_STATE, false}}},
  };
  return specs;
}

Result<std::vector<RuntimeFile>> recognize_runtimes(const std::string& path) {
  auto exports = symbolize::read_exported_functions(path);
  if (!exports) return exports.error();
  std::vector<RuntimeFile> found;
  for (const auto& spec : runtime_specs()) {
    bool match = true;
    for (const char* sym : spec.signature) match = match && exports->file_offset.count(sym);
    if (!match) continue;
    RuntimeFile rf{spec.kind, path, exports->build_id, {}};
    for (const auto& probe : spec.probes) {
      for (const char* sym : probe.symbols) {
        auto it = exports->file_offset.find(sym);
        if (it == exports->file_offset.end()) continue;
        rf.probes.push_back({probe.api, sym, it->second, probe.hot});
        break;
      }
    }
    found.push_back(std::move(rf));
  }
  return found;
}

const char* api_name(uint32_t api) {
  switch (api) {
    case STRATA_API_NCCL_ALLREDUCE: return "ncclAllReduce";
    case STRATA_API_NCCL_ALLGATHER: return "ncclAllGather";
    case STRATA_API_NCCL_REDUCESCATTER: return "ncclReduceScatter";
    case STRATA_API_NCCL_BROADCAST: return "ncclBroadcast";
    case STRATA_API_NCCL_REDUCE: return "ncclReduce";
    case STRATA_API_NCCL_SEND: return "ncclSend";
    case STRATA_API_NCCL_RECV: return "ncclRecv";
    case STRATA_API_NCCL_GROUP_START: return "ncclGroupStart";
    case STRATA_API_NCCL_GROUP_END: return "ncclGroupEnd";
    case STRATA_API_NCCL_COMM_INIT_RANK: return "ncclCommInitRank";
    case STRATA_API_NCCL_COMM_INIT_RANK_CONFIG: return "ncclCommInitRankConfig";
    case STRATA_API_NCCL_COMM_DESTROY: return "ncclCommDestroy";
    case STRATA_API_NCCL_GET_VERSION: return "ncclGetVersion";
    case STRATA_API_NCCL_COMM_INIT_ALL: return "ncclCommInitAll";
    case STRATA_API_NCCL_COMM_SPLIT: return "ncclCommSplit";
    case STRATA_API_CUDA_LAUNCH_KERNEL: return "cudaLaunchKernel";
    case STRATA_API_CUDA_MEMCPY_ASYNC: return "cudaMemcpyAsync";
    case STRATA_API_CUDA_STREAM_SYNCHRONIZE: return "cudaStreamSynchronize";
    case STRATA_API_CUDA_DEVICE_SYNCHRONIZE: return "cudaDeviceSynchronize";
    case STRATA_API_CUDA_EVENT_SYNCHRONIZE: return "cudaEventSynchronize";
    case STRATA_API_CUDA_SET_DEVICE: return "cudaSetDevice";
    case STRATA_API_CUDA_GET_DEVICE_COUNT: return "cudaGetDeviceCount";
    case STRATA_API_CUDA_MALLOC: return "cudaMalloc";
    case STRATA_API_CUDA_FREE: return "cudaFree";
    case STRATA_API_CUDA_MEMCPY: return "cudaMemcpy";
    case STRATA_API_CU_LAUNCH_KERNEL: return "cuLaunchKernel";
    case STRATA_API_CU_LAUNCH_KERNEL_EX: return "cuLaunchKernelEx";
    case STRATA_API_CU_MODULE_GET_FUNCTION: return "cuModuleGetFunction";
    case STRATA_API_CU_FUNC_GET_NAME: return "cuFuncGetName";
    case STRATA_API_CU_MEM_ALLOC: return "cuMemAlloc_v2";
    case STRATA_API_CU_MEM_FREE: return "cuMemFree_v2";
    case STRATA_API_CU_LIBRARY_GET_KERNEL: return "cuLibraryGetKernel";
    case STRATA_API_CU_KERNEL_GET_FUNCTION: return "cuKernelGetFunction";
    case STRATA_API_CU_KERNEL_GET_NAME: return "cuKernelGetName";
    case STRATA_API_GLOO_ALLREDUCE: return "gloo::allreduce";
    case STRATA_API_GLOO_ALLGATHER: return "gloo::allgather";
    case STRATA_API_GLOO_BROADCAST: return "gloo::broadcast";
    case STRATA_API_GLOO_REDUCE_SCATTER: return "gloo::reduce_scatter";
    case STRATA_API_GLOO_BARRIER: return "gloo::barrier";
    case STRATA_API_DL_STATE: return "_dl_debug_state";
    default: return "unknown";
  }
}

const char* api_collective_op(uint32_t api) {
  switch (api) {
    case STRATA_API_NCCL_ALLREDUCE: case STRATA_API_GLOO_ALLREDUCE: return "allreduce";
    case STRATA_API_NCCL_ALLGATHER: case STRATA_API_GLOO_ALLGATHER: return "allgather";
    case STRATA_API_NCCL_REDUCESCATTER: case STRATA_API_GLOO_REDUCE_SCATTER: return "reducescatter";
    case STRATA_API_NCCL_BROADCAST: case STRATA_API_GLOO_BROADCAST: return "broadcast";
    case STRATA_API_NCCL_REDUCE: return "reduce";
    case STRATA_API_NCCL_SEND: return "send";
    case STRATA_API_NCCL_RECV: return "recv";
    case STRATA_API_GLOO_BARRIER: return "barrier";
    default: return "";
  }
}

bool api_is_collective(uint32_t api) { return *api_collective_op(api) != '\0'; }

bool api_is_memory(uint32_t api) {
  switch (api) {
    case STRATA_API_CUDA_MALLOC: case STRATA_API_CUDA_FREE: case STRATA_API_CUDA_MEMCPY:
    case STRATA_API_CU_MEM_ALLOC: case STRATA_API_CU_MEM_FREE: return true;
    default: return false;
  }
}

}  // namespace strata::agent
