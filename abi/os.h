/* Kernel <-> user layout of the OS event probe (bpf/os.bpf.c): IRQ and softirq time that
 * interrupted watched processes, direct reclaim and compaction stalls, block I/O latency, TCP
 * retransmits. Plain structs, no logic. Bump STRATA_OS_ABI_VERSION on any change. */
#ifndef STRATA_ABI_OS_H
#define STRATA_ABI_OS_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#include "abi/offcpu.h" /* STRATA_HIST_BUCKETS */

#define STRATA_OS_ABI_VERSION 1

enum strata_os_counter {
  STRATA_OS_CNT_IRQ_FULL = 0,   /* irq map full */
  STRATA_OS_CNT_STATS_FULL,     /* per-process map full */
  STRATA_OS_CNT_BIO_FULL,       /* in-flight request map full */
  STRATA_OS_CNT_RETRANS_FULL,   /* retransmit map full */
  STRATA_OS_CNT_RETRANS_NO_INODE, /* a retransmit on a socket without a file (kernel socket) */
  STRATA_OS_CNT__COUNT,
};

enum strata_irq_kind {
  STRATA_IRQ_HARD = 0,
  STRATA_IRQ_SOFT = 1,
};

/* Interrupt time that ran while a watched process's thread was current (stolen from it). */
struct strata_irq_key {
  __u32 tgid;
  __u16 kind;   /* enum strata_irq_kind */
  __u16 vector; /* irq number, or softirq vector (NET_RX_SOFTIRQ, ...) */
};

/* Per watched process (key: tgid), cumulative; the agent takes deltas. */
struct strata_os_stats {
  __u64 reclaim_count[2]; /* [0] global direct reclaim, [1] memcg reclaim (a cgroup at its limit) */
  __u64 reclaim_ns[2];
  __u64 compaction_count; /* direct compaction runs (compact_zone in the process's context) */
  __u64 compaction_ns;
  __u64 bio_count;        /* block requests started in the process's context, completed */
  __u64 bio_ns;
  __u64 bio_hist[STRATA_HIST_BUCKETS]; /* request latency in microseconds */
};

#endif /* STRATA_ABI_OS_H */
