// SPDX-License-Identifier: GPL-2.0
/* Probes on the CUDA runtime, NCCL and gloo APIs of watched processes.
 * One entry and one return program serve every function: the attach cookie is the API id
 * (abi/gpu_comm.h); arguments are saved raw at entry and decoded by the agent, which knows each
 * API's real signature. Hot APIs (kernel launches) are attached only in short bursts by the agent. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "bpf/strata_ringbuf.bpf.h"

#include "abi/gpu_comm.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 abi_version = STRATA_GPU_COMM_ABI_VERSION;

/* Set by the agent while a launch burst runs: the always-on memory-call probes take their CPU
 * stack only then, so a stack walk is paid within the launch budget, never per call. */
volatile __u32 memory_stacks = 0;

/* Shared with the on-CPU sampler (reused fd): the watched tgids. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 16384);
  __type(key, __u32);
  __type(value, __u8);
} targets SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 22);
} api_events SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, STRATA_GC__COUNT);
  __type(key, __u32);
  __type(value, __u64);
} gc_counters SEC(".maps");

/* A call in flight, per (thread, api) (abi/gpu_comm.h: the agent reads it for calls that have
 * not returned). LRU: threads that die mid-call do not leak entries. */

struct {
  __uint(type, BPF_MAP_TYPE_LRU_HASH);
  __uint(max_entries, 16384);
  __type(key, __u64);
  __type(value, struct strata_api_call);
} calls SEC(".maps");

struct event_buf {
  struct strata_api_event ev;
  struct bpf_stack_build_id stack[STRATA_API_STACK_DEPTH];
};

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct event_buf);
} scratch SEC(".maps");

/* A call record is built here: too large for the 512-byte BPF stack. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct strata_api_call);
} call_scratch SEC(".maps");

static __always_inline void bump(__u32 counter) {
  __u64* v = bpf_map_lookup_elem(&gc_counters, &counter);
  if (v) *v += 1;
}

static __always_inline __u64 call_key(__u32 tid, __u32 api) { return ((__u64)tid << 8) | (api & 0xff); }

/* Kernel launches and async copies: attached only during bursts; each keeps its CPU stack. */
static __always_inline bool is_launch(__u32 api) {
  return api == STRATA_API_CUDA_LAUNCH_KERNEL || api == STRATA_API_CUDA_MEMCPY_ASYNC ||
         api == STRATA_API_CU_LAUNCH_KERNEL || api == STRATA_API_CU_LAUNCH_KERNEL_EX;
}

static __always_inline bool is_memory(__u32 api) {
  return api == STRATA_API_CUDA_MALLOC || api == STRATA_API_CUDA_FREE || api == STRATA_API_CUDA_MEMCPY ||
         api == STRATA_API_CU_MEM_ALLOC || api == STRATA_API_CU_MEM_FREE;
}

static __always_inline bool is_init(__u32 api) {
  return api == STRATA_API_NCCL_COMM_INIT_RANK || api == STRATA_API_NCCL_COMM_INIT_RANK_CONFIG;
}

/* Calls that write a communicator handle (8 bytes) through an out-parameter. */
static __always_inline bool makes_comm(__u32 api) {
  return is_init(api) || api == STRATA_API_NCCL_COMM_INIT_ALL || api == STRATA_API_NCCL_COMM_SPLIT;
}

/* The out-parameter the agent wants back: the first argument, ncclCommSplit's fourth. */
static __always_inline __u64 out_arg(__u32 api, const __u64* args) {
  if (api == STRATA_API_NCCL_COMM_SPLIT) return args[3];
  if (makes_comm(api) || api == STRATA_API_NCCL_GET_VERSION || api == STRATA_API_CUDA_GET_DEVICE_COUNT) return args[0];
  return 0;
}

SEC("uprobe")
int api_enter(struct pt_regs* ctx) {
  __u64 id = bpf_get_current_pid_tgid();
  __u32 tgid = id >> 32;
  if (!bpf_map_lookup_elem(&targets, &tgid)) return 0;
  bump(STRATA_GC_ENTRIES);
  __u32 api = (__u32)bpf_get_attach_cookie(ctx);

  __u32 zero = 0;
  struct strata_api_call* c = bpf_map_lookup_elem(&call_scratch, &zero);
  if (!c) return 0;
  __builtin_memset(c, 0, sizeof(*c));
  c->enter_ns = bpf_ktime_get_ns();
  c->tgid = tgid;
  c->args[0] = PT_REGS_PARM1(ctx);
  c->args[1] = PT_REGS_PARM2(ctx);
  c->args[2] = PT_REGS_PARM3(ctx);
  c->args[3] = PT_REGS_PARM4(ctx);
  c->args[4] = PT_REGS_PARM5(ctx);
  c->args[5] = ctx->r9; /* PT_REGS_PARM6: libbpf 1.1 lacks the macro */
  /* Arguments past the sixth, and structs larger than 16 bytes, are on the stack above the
   * return address. */
  __u64 sp = PT_REGS_SP(ctx);
  bpf_probe_read_user(&c->args[6], 2 * sizeof(__u64), (void*)(sp + 8));
  if (is_init(api)) {
    /* ncclUniqueId (128 bytes) is passed by value, so in memory: it is the first stack argument. */
    if (bpf_probe_read_user(c->nccl_id, sizeof(c->nccl_id), (void*)(sp + 8)) == 0) c->flags |= STRATA_API_F_HAS_ID;
  }
  __u64 key = call_key((__u32)id, api);
  bpf_map_update_elem(&calls, &key, c, BPF_ANY);
  return 0;
}

SEC("uretprobe")
int api_exit(struct pt_regs* ctx) {
  __u64 id = bpf_get_current_pid_tgid();
  __u32 tgid = id >> 32;
  if (!bpf_map_lookup_elem(&targets, &tgid)) return 0;
  __u32 api = (__u32)bpf_get_attach_cookie(ctx);
  __u64 key = call_key((__u32)id, api);
  struct strata_api_call* c = bpf_map_lookup_elem(&calls, &key);
  if (!c) {
    bump(STRATA_GC_UNMATCHED_RETURN);
    return 0;
  }
  bump(STRATA_GC_RETURNS);

  __u32 zero = 0;
  struct event_buf* b = bpf_map_lookup_elem(&scratch, &zero);
  if (!b) {
    bpf_map_delete_elem(&calls, &key);
    return 0;
  }
  struct strata_api_event* e = &b->ev;
  e->type = STRATA_EV_API;
  e->api = api;
  e->pid = tgid;
  e->tid = (__u32)id;
  e->enter_ns = c->enter_ns;
  e->exit_ns = bpf_ktime_get_ns();
  __builtin_memcpy(e->args, c->args, sizeof(e->args));
  e->ret = (__s64)PT_REGS_RC(ctx);
  e->flags = c->flags;
  e->out = 0;
  e->ustack_len = 0;
  e->_pad = 0;
  if (c->flags & STRATA_API_F_HAS_ID) __builtin_memcpy(e->nccl_id, c->nccl_id, sizeof(e->nccl_id));
  else __builtin_memset(e->nccl_id, 0, sizeof(e->nccl_id));
  bpf_map_delete_elem(&calls, &key);

  __u64 out_ptr = out_arg(api, e->args);
  if (out_ptr) {
    /* ncclComm_t / int written through the out-parameter. */
    __u64 out = 0;
    long rc = makes_comm(api) ? bpf_probe_read_user(&out, sizeof(__u64), (void*)out_ptr)
                              : bpf_probe_read_user(&out, sizeof(__u32), (void*)out_ptr);
    if (rc == 0) {
      e->out = out;
      e->flags |= STRATA_API_F_HAS_OUT;
    }
  }
  if (api == STRATA_API_NCCL_COMM_INIT_ALL && e->args[0] && e->ret == 0) {
    /* Its handles (an array of ndev): the first 16 in the id's bytes (unused by this call). A
     * shorter array at the end of a mapping fails the read: then only `out` (the first) is known. */
    if (bpf_probe_read_user(e->nccl_id, sizeof(e->nccl_id), (void*)e->args[0]) == 0) e->flags |= STRATA_API_F_HAS_HANDLES;
  }
  if ((api == STRATA_API_CU_MODULE_GET_FUNCTION || api == STRATA_API_CU_LIBRARY_GET_KERNEL ||
       api == STRATA_API_CU_KERNEL_GET_FUNCTION) && e->ret == 0 && e->args[0]) {
    /* The CUfunction / CUkernel written through the first argument, and (lookups by name) the
     * name: launches name their kernel by this handle. */
    __u64 out = 0;
    if (bpf_probe_read_user(&out, sizeof(out), (void*)e->args[0]) == 0) {
      e->out = out;
      e->flags |= STRATA_API_F_HAS_OUT;
    }
    if (api != STRATA_API_CU_KERNEL_GET_FUNCTION && e->args[2] &&
        bpf_probe_read_user_str(e->nccl_id, sizeof(e->nccl_id), (void*)e->args[2]) > 0)
      e->flags |= STRATA_API_F_HAS_NAME;
  }
  if ((api == STRATA_API_CU_FUNC_GET_NAME || api == STRATA_API_CU_KERNEL_GET_NAME) && e->ret == 0 && e->args[0]) {
    /* (const char** name, CUfunction or CUkernel): the driver's own name of the handle. */
    __u64 name = 0;
    if (bpf_probe_read_user(&name, sizeof(name), (void*)e->args[0]) == 0 && name &&
        bpf_probe_read_user_str(e->nccl_id, sizeof(e->nccl_id), (void*)name) > 0)
      e->flags |= STRATA_API_F_HAS_NAME;
  }
  __u64 size = sizeof(*e);
  if (is_launch(api) || (is_memory(api) && memory_stacks)) {
    /* Sampled launches and copies keep the CPU stack that issued them (the caller's frames at
     * return); memory calls too, during a burst. */
    long bytes = bpf_get_stack(ctx, b->stack, sizeof(b->stack), BPF_F_USER_STACK | BPF_F_USER_BUILD_ID);
    if (bytes > 0) {
      if (bytes > sizeof(b->stack)) bytes = sizeof(b->stack);
      e->ustack_len = bytes / sizeof(struct bpf_stack_build_id);
      size += bytes;
    }
  }
  if (size > sizeof(*b)) size = sizeof(*b);
  /* Launch bursts are many; everything else is rare and wanted promptly (communicator set-up). */
  __u64 flags = is_launch(api) || is_memory(api) ? strata_rb_flags(&api_events) : 0;
  if (bpf_ringbuf_output(&api_events, b, size, flags) == 0)
    bump(STRATA_GC_EMITTED);
  else
    bump(STRATA_GC_RINGBUF_DROP);
  return 0;
}
