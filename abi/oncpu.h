/* Kernel <-> user layout of the on-CPU sampler and process tracker (bpf/oncpu.bpf.c).
 * Plain structs, no logic; included by the BPF program (with vmlinux.h) and by C++.
 * Bump STRATA_ONCPU_ABI_VERSION on any change: the agent checks it against the program's rodata. */
#ifndef STRATA_ABI_ONCPU_H
#define STRATA_ABI_ONCPU_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define STRATA_ONCPU_ABI_VERSION 1
#define STRATA_MAX_STACK_DEPTH 127 /* PERF_MAX_STACK_DEPTH */
#define STRATA_COMM_LEN 16
#define STRATA_BUILD_ID_LEN 20

enum strata_event_type {
  STRATA_EV_SAMPLE = 1,
  STRATA_EV_FORK = 2,  /* a watched process started a child process */
  STRATA_EV_EXEC = 3,  /* a watched process called execve */
  STRATA_EV_EXIT = 4,  /* the last thread of a watched process exited */
};

/* Counters the BPF side bumps (a per-CPU array indexed by this enum); never log lines. */
enum strata_oncpu_counter {
  STRATA_CNT_SAMPLES = 0,     /* perf_event hits on a watched thread */
  STRATA_CNT_EMITTED,         /* samples written to the ring buffer */
  STRATA_CNT_RINGBUF_DROP,    /* lost: ring buffer full */
  STRATA_CNT_KSTACK_ERR,      /* kernel stack could not be read */
  STRATA_CNT_USTACK_ERR,      /* user stack could not be read */
  STRATA_CNT_PROC_EVENTS,     /* fork/exec/exit events emitted */
  STRATA_CNT_PROC_DROP,       /* fork/exec/exit events lost */
  STRATA_CNT_TARGETS_FULL,    /* a child could not be added: target map full */
  STRATA_CNT__COUNT,
};

/* One sample: header, then kstack_len kernel addresses (__u64), then ustack_len user frames
 * (struct bpf_stack_build_id: build id + file offset, or a raw ip when the kernel could not read
 * the build id). Both stacks are leaf first. */
struct strata_sample {
  __u32 type; /* STRATA_EV_SAMPLE */
  __u32 pid;  /* tgid */
  __u32 tid;
  __u32 cpu;
  __u64 ts_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
  char comm[STRATA_COMM_LEN];
  __u16 kstack_len;
  __u16 ustack_len;
  __u32 flags;
};

struct strata_proc_event {
  __u32 type; /* STRATA_EV_FORK | STRATA_EV_EXEC | STRATA_EV_EXIT */
  __u32 pid;
  __u32 ppid; /* for FORK: the parent tgid */
  __u32 _pad;
  __u64 ts_ns;
  char comm[STRATA_COMM_LEN];
};

#endif /* STRATA_ABI_ONCPU_H */
