/* Kernel <-> user layout of the GPU and communication API probes (bpf/gpu_comm.bpf.c).
 * One entry and one return program serve every probed function; the attach cookie says which API
 * it is, and the agent reads the raw arguments according to the API's real signature.
 * Bump STRATA_GPU_COMM_ABI_VERSION on any change. */
#ifndef STRATA_ABI_GPU_COMM_H
#define STRATA_ABI_GPU_COMM_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define STRATA_GPU_COMM_ABI_VERSION 4
#define STRATA_API_ARGS 8          /* rdi rsi rdx rcx r8 r9, then the first two stack words */
#define STRATA_NCCL_ID_BYTES 128   /* sizeof(ncclUniqueId) */
#define STRATA_API_STACK_DEPTH 64  /* user frames kept with a sampled launch */

enum strata_api {
  STRATA_API_NONE = 0,
  /* NCCL */
  STRATA_API_NCCL_ALLREDUCE = 1,
  STRATA_API_NCCL_ALLGATHER,
  STRATA_API_NCCL_REDUCESCATTER,
  STRATA_API_NCCL_BROADCAST,
  STRATA_API_NCCL_REDUCE,
  STRATA_API_NCCL_SEND,
  STRATA_API_NCCL_RECV,
  STRATA_API_NCCL_GROUP_START,
  STRATA_API_NCCL_GROUP_END,
  STRATA_API_NCCL_COMM_INIT_RANK,
  STRATA_API_NCCL_COMM_INIT_RANK_CONFIG,
  STRATA_API_NCCL_COMM_DESTROY,
  STRATA_API_NCCL_GET_VERSION,
  STRATA_API_NCCL_COMM_INIT_ALL,  /* one process, ndev ranks */
  STRATA_API_NCCL_COMM_SPLIT,     /* out: the new ncclComm_t (4th argument); NULL for NCCL_SPLIT_NOCOLOR */
  /* CUDA runtime */
  STRATA_API_CUDA_LAUNCH_KERNEL = 32,
  STRATA_API_CUDA_MEMCPY_ASYNC,
  STRATA_API_CUDA_STREAM_SYNCHRONIZE,
  STRATA_API_CUDA_DEVICE_SYNCHRONIZE,
  STRATA_API_CUDA_EVENT_SYNCHRONIZE,
  STRATA_API_CUDA_SET_DEVICE,
  STRATA_API_CUDA_GET_DEVICE_COUNT,
  /* CUDA runtime memory calls: always on (each blocks for far longer than its probe), stacks
   * only during launch bursts */
  STRATA_API_CUDA_MALLOC = 40,  /* (void** devPtr, size_t size) */
  STRATA_API_CUDA_FREE,         /* (void* devPtr) */
  STRATA_API_CUDA_MEMCPY,       /* (dst, src, count, kind): synchronous */
  /* CUDA driver (libcuda.so.1): what Triton and torch.compile launch through */
  STRATA_API_CU_LAUNCH_KERNEL = 48,  /* (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) */
  STRATA_API_CU_LAUNCH_KERNEL_EX,    /* (const CUlaunchConfig*, f, params, extra) */
  STRATA_API_CU_MODULE_GET_FUNCTION, /* (CUfunction* out, CUmodule, const char* name): name in nccl_id */
  STRATA_API_CU_FUNC_GET_NAME,       /* (const char** name, CUfunction): name in nccl_id */
  STRATA_API_CU_MEM_ALLOC,           /* cuMemAlloc_v2 (CUdeviceptr* out, size_t size) */
  STRATA_API_CU_MEM_FREE,            /* cuMemFree_v2 (CUdeviceptr) */
  STRATA_API_CU_LIBRARY_GET_KERNEL,  /* (CUkernel* out, CUlibrary, const char* name): name in nccl_id */
  STRATA_API_CU_KERNEL_GET_FUNCTION, /* (CUfunction* out, CUkernel) */
  STRATA_API_CU_KERNEL_GET_NAME,     /* (const char** name, CUkernel): name in nccl_id */
  /* gloo (PyTorch's CPU process group): timing only */
  STRATA_API_GLOO_ALLREDUCE = 64,
  STRATA_API_GLOO_ALLGATHER,
  STRATA_API_GLOO_BROADCAST,
  STRATA_API_GLOO_REDUCE_SCATTER,
  STRATA_API_GLOO_BARRIER,
  /* the dynamic loader: called around every dlopen/dlclose (what debuggers watch) */
  STRATA_API_DL_STATE = 80,
  STRATA_API__MAX = 96,
};

enum strata_gpu_comm_counter {
  STRATA_GC_ENTRIES = 0,      /* entry probe hits on watched processes */
  STRATA_GC_RETURNS,          /* return probe hits matched to an entry */
  STRATA_GC_EMITTED,
  STRATA_GC_RINGBUF_DROP,
  STRATA_GC_UNMATCHED_RETURN, /* a return without its entry (attached mid-call, or evicted) */
  STRATA_GC__COUNT,
};

/* Flags on an API event. */
#define STRATA_API_F_HAS_ID 1u     /* nccl_id holds the ncclUniqueId of a CommInitRank call */
#define STRATA_API_F_HAS_OUT 2u    /* out holds the value the call wrote through its out pointer */
#define STRATA_API_F_HAS_HANDLES 4u /* nccl_id holds the first 16 ncclComm_t written by ncclCommInitAll */
#define STRATA_API_F_HAS_NAME 8u    /* nccl_id holds a kernel's name, NUL-terminated (truncated to 127 bytes) */

struct strata_api_event {
  __u32 type; /* STRATA_EV_API (= 16) */
  __u32 api;  /* enum strata_api */
  __u32 pid;
  __u32 tid;
  __u64 enter_ns; /* CLOCK_MONOTONIC */
  __u64 exit_ns;
  __u64 args[STRATA_API_ARGS];
  __s64 ret;
  __u64 out;      /* e.g. the ncclComm_t written by CommInitRank, the version of GetVersion */
  __u32 flags;
  __u16 ustack_len; /* user frames (struct bpf_stack_build_id) following the event */
  __u16 _pad;
  __u8 nccl_id[STRATA_NCCL_ID_BYTES];
};

#define STRATA_EV_API 16

/* A call in flight (the `calls` map's value, keyed by (tid << 8) | api): saved at entry, deleted
 * at return. The agent reads the map at each window's end: a collective still in it has been
 * entered and has not returned (gloo blocks until the collective is done; a hung one never
 * returns), the evidence of a rank stuck inside a call that the return events never show. */
struct strata_api_call {
  __u64 enter_ns; /* CLOCK_MONOTONIC */
  __u64 args[STRATA_API_ARGS];
  __u32 flags;
  __u32 tgid;     /* the calling process: the key has only the thread */
  __u8 nccl_id[STRATA_NCCL_ID_BYTES];
};

#endif /* STRATA_ABI_GPU_COMM_H */
