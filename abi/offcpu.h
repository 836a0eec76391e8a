/* Kernel <-> user layout of the scheduler probe (bpf/offcpu.bpf.c): off-CPU blocked time with stacks,
 * and the per-process scheduler counters of the OS layer (run time per CPU, run-queue latency,
 * switches, migrations, blocked time by reason, the other processes on the same CPUs).
 * Plain structs, no logic. Bump STRATA_OFFCPU_ABI_VERSION on any change. */
#ifndef STRATA_ABI_OFFCPU_H
#define STRATA_ABI_OFFCPU_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#include "abi/oncpu.h" /* STRATA_MAX_STACK_DEPTH, STRATA_COMM_LEN */

#define STRATA_OFFCPU_ABI_VERSION 5
#define STRATA_OS_MAX_CPUS 256        /* per-CPU run time is kept for CPUs below this */
#define STRATA_HIST_BUCKETS 128       /* a power of two; see bpf/strata_hist.bpf.h */
#define STRATA_HIST_SUB 4             /* sub-buckets per power of two */

/* Why the thread was off CPU, from the scheduler's prev_state at switch-out. */
enum strata_offcpu_reason {
  STRATA_OFFCPU_PREEMPTED = 0,       /* still runnable: preempted or yielded (involuntary) */
  STRATA_OFFCPU_SLEEP = 1,           /* S: interruptible sleep (nanosleep, poll, pipe, futex, ...) */
  STRATA_OFFCPU_IO = 2,              /* D while in io_schedule (in_iowait): block I/O, page locks */
  STRATA_OFFCPU_UNINTERRUPTIBLE = 3, /* D otherwise: mutexes, reclaim waits, ... */
  STRATA_OFFCPU_OTHER = 4,           /* stopped, traced, ... */
  STRATA_OFFCPU_REASONS = 5,
};

/* Sampling classes, each with its own per-CPU target (capture_target_per_sec): a node's many
 * sleeps cannot crowd out the few blocks on I/O and in D state, the ones the diagnosis weighs. */
enum strata_offcpu_class {
  STRATA_OFFCPU_CLASS_SLEEP = 0,   /* captures at switch-out of sleeping (and other) threads */
  STRATA_OFFCPU_CLASS_BLOCKED = 1, /* captures at switch-out of threads in D state (I/O or not) */
  STRATA_OFFCPU_CLASS_BARE = 2,    /* long blocks without a capture, sent with the kernel stack only */
  STRATA_OFFCPU_CLASSES = 3,
};

enum strata_offcpu_counter {
  STRATA_OFFCPU_CNT_BLOCKS = 0,    /* switch-ins of watched threads with a known switch-out */
  STRATA_OFFCPU_CNT_LONG,          /* ... blocked at least the threshold */
  STRATA_OFFCPU_CNT_EMITTED,       /* long blocks written to the ring buffer */
  STRATA_OFFCPU_CNT_RINGBUF_DROP,  /* lost: ring buffer full */
  STRATA_OFFCPU_CNT_RATE_LIMITED,  /* long blocks not emitted: per-CPU event cap reached */
  STRATA_OFFCPU_CNT_CAPTURES,      /* stacks captured at switch-out */
  STRATA_OFFCPU_CNT_CAPTURE_SKIPPED, /* a capture wanted but the per-CPU capture cap was reached */
  STRATA_OFFCPU_CNT_NO_USER_STACK, /* emitted with the kernel stack only (no capture at switch-out) */
  STRATA_OFFCPU_CNT_STORAGE_FAIL,  /* task storage could not be created */
  STRATA_OFFCPU_CNT_NEIGHBOURS_FULL, /* neighbour map full: a neighbour's time was not counted */
  STRATA_OFFCPU_CNT_SNAPSHOTS,     /* user stack copies taken at switch-out (for CFI unwinding) */
  STRATA_OFFCPU_CNT_SNAPSHOT_SKIPPED, /* a copy wanted but the per-CPU copy cap was reached */
  STRATA_OFFCPU_CNT_SNAPSHOT_LOST, /* a copy reused by another thread before its owner woke */
  STRATA_OFFCPU_CNT_SNAPSHOT_SENT, /* long blocks sent with their stack copy */
  STRATA_OFFCPU_CNT_SNAPSHOT_DROPPED, /* ... sent without it: no room in the ring buffer */
  STRATA_OFFCPU_CNT_SAMPLED_OUT,   /* captures wanted but sampled out (capture_target_per_sec) */
  STRATA_OFFCPU_CNT_BARE_SAMPLED_OUT, /* long blocks without a capture, sampled out (capture_target_per_sec) */
  STRATA_OFFCPU_CNT__COUNT,
};

enum strata_offcpu_event_type {
  STRATA_OFFCPU_EV_BLOCK = 16, /* distinct from abi/oncpu.h types */
};

#define STRATA_OFFCPU_F_USER_STACK 1 /* the user stack was captured at switch-out */
#define STRATA_OFFCPU_F_SNAPSHOT 2   /* ip/sp/bp and a copy of the user stack follow the frames */

/* One long block: header, then kstack_len kernel addresses (__u64), then ustack_len user
 * addresses (__u64), both leaf first (as struct strata_sample), then stack_len bytes of user stack
 * from stack_base (STRATA_OFFCPU_F_SNAPSHOT): the frame-pointer walk stops in frameless code such as
 * glibc's futex wait, so the node unwinds this copy with CFI, as it does for on-CPU samples. */
struct strata_offcpu_event {
  __u32 type; /* STRATA_OFFCPU_EV_BLOCK */
  __u32 pid;  /* tgid */
  __u32 tid;
  __u32 cpu;          /* where it ran again */
  __u64 ts_ns;        /* switch-in, CLOCK_MONOTONIC */
  __u64 blocked_ns;   /* switch-out to switch-in */
  char comm[STRATA_COMM_LEN];
  __u16 kstack_len;
  __u16 ustack_len;
  __u8 reason; /* enum strata_offcpu_reason */
  __u8 flags;  /* STRATA_OFFCPU_F_* */
  __u16 _pad;
  __u32 stack_len;  /* bytes of stack copy after the frames */
  __u32 _pad2;
  __u64 ip, sp, bp; /* user registers at switch-out (STRATA_OFFCPU_F_SNAPSHOT) */
  __u64 stack_base; /* address of the first copied byte */
  __u32 uret_len;   /* pending uretprobe returns at switch-out (abi/oncpu.h) */
  __u32 _pad3;
  struct strata_uret uret[STRATA_MAX_URETPROBES];
};

/* Per-CPU state of the probe (a per-CPU array of one): the last switch, rate caps, counters. */
struct strata_offcpu_cpu_state {
  __u64 last_switch_ns;
  __u64 watched_seen_ns; /* a watched thread ran here */
  __u64 period;          /* ~1 s periods of the rate caps */
  __u32 events, captures, explores, snapshots;
  __u32 wanted[STRATA_OFFCPU_CLASSES]; /* per sampling class: captures (or bare blocks) wanted this period */
  __u32 shift[STRATA_OFFCPU_CLASSES];  /* this period takes 1 in 2^shift of them */
  __u64 counters[STRATA_OFFCPU_CNT__COUNT];
};

/* Per watched process (key: tgid), cumulative since it was first seen; the agent takes deltas. */
struct strata_sched_stats {
  __u64 offcpu_ns[STRATA_OFFCPU_REASONS]; /* all blocks, whatever their length */
  __u64 voluntary;
  __u64 involuntary;
  __u64 migrations;
  __u64 runq_count;  /* run slices whose run-queue wait was measured */
  __u64 runq_ns;     /* sum of those waits */
  __u64 runq_hist[STRATA_HIST_BUCKETS]; /* waits in microseconds, log-linear buckets */
  __u64 cpu_ns[STRATA_OS_MAX_CPUS];      /* run time on each CPU */
};

/* Time that processes (watched or not) ran on a CPU where a watched process ran recently. */
struct strata_neighbour_key {
  __u32 cpu;
  __u32 tgid;
};
struct strata_neighbour_value {
  __u64 run_ns;
  char comm[STRATA_COMM_LEN]; /* the process's (group leader's) name */
};

#endif /* STRATA_ABI_OFFCPU_H */
