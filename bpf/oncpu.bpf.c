// SPDX-License-Identifier: GPL-2.0
/* On-CPU stack sampling for a process tree.
 * A perf_event cpu-clock program on every CPU keeps only threads of watched processes (the `targets`
 * map, by tgid) and writes one ring-buffer record per sample: kernel addresses and user frames as
 * build id + file offset (normalized in the kernel, so short-lived processes need no /proc lookup).
 * The agent aggregates per window. Children of watched processes are added at fork. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "abi/oncpu.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 abi_version = STRATA_ONCPU_ABI_VERSION;
const volatile bool follow_children = true;

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 16384); /* resized by the agent before load */
  __type(key, __u32);         /* tgid */
  __type(value, __u8);
} targets SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 22); /* resized by the agent before load */
} events SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, STRATA_CNT__COUNT);
  __type(key, __u32);
  __type(value, __u64);
} counters SEC(".maps");

#define KSTACK_BYTES (STRATA_MAX_STACK_DEPTH * sizeof(__u64))
#define USTACK_BYTES (STRATA_MAX_STACK_DEPTH * sizeof(struct bpf_stack_build_id))

/* Per-CPU scratch: a sample is assembled here, then copied to the ring buffer at its real size. */
struct sample_buf {
  struct strata_sample hdr;
  __u8 frames[KSTACK_BYTES + USTACK_BYTES];
};

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct sample_buf);
} scratch SEC(".maps");

static __always_inline void bump(__u32 counter) {
  __u64* v = bpf_map_lookup_elem(&counters, &counter);
  if (v) *v += 1;
}

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data* ctx) {
  __u64 id = bpf_get_current_pid_tgid();
  __u32 tgid = id >> 32;
  if (!bpf_map_lookup_elem(&targets, &tgid)) return 0;
  bump(STRATA_CNT_SAMPLES);

  __u32 zero = 0;
  struct sample_buf* buf = bpf_map_lookup_elem(&scratch, &zero);
  if (!buf) return 0;

  buf->hdr.type = STRATA_EV_SAMPLE;
  buf->hdr.pid = tgid;
  buf->hdr.tid = (__u32)id;
  buf->hdr.cpu = bpf_get_smp_processor_id();
  buf->hdr.ts_ns = bpf_ktime_get_ns();
  buf->hdr.flags = 0;
  bpf_get_current_comm(buf->hdr.comm, sizeof(buf->hdr.comm));

  long kbytes = bpf_get_stack(ctx, buf->frames, KSTACK_BYTES, 0);
  if (kbytes < 0) {
    bump(STRATA_CNT_KSTACK_ERR);
    kbytes = 0;
  }
  /* Keep the verifier's bounds explicit: kbytes is in [0, KSTACK_BYTES]. */
  if (kbytes > KSTACK_BYTES) kbytes = KSTACK_BYTES;
  kbytes &= ~7L;

  long ubytes = bpf_get_stack(ctx, buf->frames + kbytes, USTACK_BYTES, BPF_F_USER_STACK | BPF_F_USER_BUILD_ID);
  if (ubytes < 0) {
    bump(STRATA_CNT_USTACK_ERR);
    ubytes = 0;
  }
  if (ubytes > USTACK_BYTES) ubytes = USTACK_BYTES;

  buf->hdr.kstack_len = kbytes / sizeof(__u64);
  buf->hdr.ustack_len = ubytes / sizeof(struct bpf_stack_build_id);

  __u64 size = sizeof(buf->hdr) + kbytes + ubytes;
  if (size > sizeof(*buf)) size = sizeof(*buf);
  if (bpf_ringbuf_output(&events, buf, size, 0) == 0)
    bump(STRATA_CNT_EMITTED);
  else
    bump(STRATA_CNT_RINGBUF_DROP);
  return 0;
}

static __always_inline void emit_proc_event(__u32 type, __u32 pid, __u32 ppid, struct task_struct* task) {
  struct strata_proc_event* e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
  if (!e) {
    bump(STRATA_CNT_PROC_DROP);
    return;
  }
  e->type = type;
  e->pid = pid;
  e->ppid = ppid;
  e->_pad = 0;
  e->ts_ns = bpf_ktime_get_ns();
  BPF_CORE_READ_STR_INTO(&e->comm, task, comm);
  bpf_ringbuf_submit(e, 0);
  bump(STRATA_CNT_PROC_EVENTS);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct* parent, struct task_struct* child) {
  if (!follow_children) return 0;
  __u32 ptgid = BPF_CORE_READ(parent, tgid);
  __u32 ctgid = BPF_CORE_READ(child, tgid);
  if (ptgid == ctgid) return 0; /* a new thread: already covered by its tgid */
  if (!bpf_map_lookup_elem(&targets, &ptgid)) return 0;
  __u8 one = 1;
  if (bpf_map_update_elem(&targets, &ctgid, &one, BPF_ANY) != 0) {
    bump(STRATA_CNT_TARGETS_FULL);
    return 0;
  }
  emit_proc_event(STRATA_EV_FORK, ctgid, ptgid, child);
  return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec, struct task_struct* task, pid_t old_pid, struct linux_binprm* bprm) {
  __u32 tgid = BPF_CORE_READ(task, tgid);
  if (!bpf_map_lookup_elem(&targets, &tgid)) return 0;
  emit_proc_event(STRATA_EV_EXEC, tgid, 0, task);
  return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit, struct task_struct* task) {
  __u32 tgid = BPF_CORE_READ(task, tgid);
  if (!bpf_map_lookup_elem(&targets, &tgid)) return 0;
  /* The group is dead when the last thread exits: signal->live has dropped to zero. */
  if (BPF_CORE_READ(task, signal, live.counter) != 0) return 0;
  bpf_map_delete_elem(&targets, &tgid);
  emit_proc_event(STRATA_EV_EXIT, tgid, 0, task);
  return 0;
}
