// SPDX-License-Identifier: GPL-2.0
/* OS events that slow a watched process down, aggregated in kernel maps per process (tgid); the agent
 * reads the cumulative values every window and takes deltas. Tracepoints only (tp_btf), no kprobes:
 *   - hard IRQ and softirq time that ran while a watched thread was current (time stolen from it);
 *   - direct reclaim (global and memcg) and direct compaction in a watched thread's context;
 *   - block requests started in a watched thread's context: count and latency to completion;
 *   - TCP retransmits by socket inode (retransmits fire in softirq context, where current is not the
 *     owner; the agent maps the inode to a process through /proc/PID/fd). */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "abi/os.h"
#include "bpf/strata_maps.bpf.h"
#include "bpf/strata_targets.bpf.h"
#include "bpf/strata_hist.bpf.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 abi_version = STRATA_OS_ABI_VERSION;

/* target_bits (bpf/strata_targets.bpf.h) is replaced by the on-CPU sampler's (bpf_map__reuse_fd). */

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, STRATA_OS_CNT__COUNT);
  __type(key, __u32);
  __type(value, __u64);
} counters SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 8192);
  __type(key, struct strata_irq_key);
  __type(value, __u64); /* ns */
} irq_time SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __uint(max_entries, 4096); /* resized by the agent */
  __type(key, __u32);        /* tgid */
  __type(value, struct strata_os_stats);
} os_stats SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct strata_os_stats);
} zero_stats SEC(".maps");

/* When the current hard IRQ / softirq on this CPU began. */
struct irq_start {
  __u64 hard_ns;
  __u64 soft_ns;
};
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct irq_start);
} irq_starts SEC(".maps");

/* A stall in progress in a watched thread: key tid * 4 + kind. */
enum stall_kind { STALL_RECLAIM = 0, STALL_MEMCG_RECLAIM = 1, STALL_COMPACTION = 2 };
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, __u64);
  __type(value, __u64); /* start ns */
} stalls SEC(".maps");

struct bio_start {
  __u32 tgid;
  __u32 _pad;
  __u64 start_ns;
};
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 8192);
  __type(key, __u64); /* struct request address */
  __type(value, struct bio_start);
} bios SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 4096);
  __type(key, __u64);   /* socket inode */
  __type(value, __u64); /* retransmitted segments */
} retransmits SEC(".maps");

static __always_inline void bump(__u32 counter) {
  __u64* v = bpf_map_lookup_elem(&counters, &counter);
  if (v) *v += 1;
}

static __always_inline bool watched(__u32 tgid) { return tgid && strata_is_target(tgid); }

static __always_inline struct strata_os_stats* stats_of(__u32 tgid) {
  bool full = false;
  struct strata_os_stats* st = strata_lookup_or_init(&os_stats, &tgid, &zero_stats, &full);
  if (full) bump(STRATA_OS_CNT_STATS_FULL);
  return st;
}

static __always_inline struct irq_start* irq_start_here(void) {
  __u32 zero = 0;
  return bpf_map_lookup_elem(&irq_starts, &zero);
}

/* The start of an interrupt, or 0 when it did not interrupt a watched process: softirqs run tens of
 * thousands of times a second on a busy node, nearly all of them in processes strata does not watch,
 * and those leave before reading the clock. An interrupt runs in the context of the task it
 * interrupted from its entry to its exit, so the check at the entry holds for the exit. */
static __always_inline __u64 watched_start(void) {
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  return watched(tgid) ? bpf_ktime_get_ns() : 0;
}

/* start: from watched_start, so the interrupted process is watched. */
static __always_inline void add_irq_time(__u16 kind, __u16 vector, __u64 start) {
  if (!start) return;
  __u64 now = bpf_ktime_get_ns();
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  struct strata_irq_key k = {.tgid = tgid, .kind = kind, .vector = vector};
  __u64* v = bpf_map_lookup_elem(&irq_time, &k);
  if (v) {
    __sync_fetch_and_add(v, now - start);
    return;
  }
  __u64 d = now - start;
  if (bpf_map_update_elem(&irq_time, &k, &d, BPF_NOEXIST) != 0) bump(STRATA_OS_CNT_IRQ_FULL);
}

SEC("tp_btf/irq_handler_entry")
int BPF_PROG(on_irq_entry, int irq, struct irqaction* action) {
  struct irq_start* s = irq_start_here();
  if (s) s->hard_ns = watched_start();
  return 0;
}

SEC("tp_btf/irq_handler_exit")
int BPF_PROG(on_irq_exit, int irq, struct irqaction* action, int ret) {
  struct irq_start* s = irq_start_here();
  if (!s) return 0;
  __u64 start = s->hard_ns;
  s->hard_ns = 0;
  add_irq_time(STRATA_IRQ_HARD, (__u16)irq, start);
  return 0;
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(on_softirq_entry, unsigned int vec) {
  struct irq_start* s = irq_start_here();
  if (s) s->soft_ns = watched_start();
  return 0;
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(on_softirq_exit, unsigned int vec) {
  struct irq_start* s = irq_start_here();
  if (!s) return 0;
  __u64 start = s->soft_ns;
  s->soft_ns = 0;
  add_irq_time(STRATA_IRQ_SOFT, (__u16)vec, start);
  return 0;
}

static __always_inline void stall_begin(__u64 kind) {
  __u64 id = bpf_get_current_pid_tgid();
  if (!watched(id >> 32)) return;
  __u64 key = ((id & 0xFFFFFFFF) << 2) | kind;
  __u64 now = bpf_ktime_get_ns();
  bpf_map_update_elem(&stalls, &key, &now, BPF_ANY);
}

static __always_inline void stall_end(__u64 kind) {
  __u64 id = bpf_get_current_pid_tgid();
  __u64 key = ((id & 0xFFFFFFFF) << 2) | kind;
  __u64* start = bpf_map_lookup_elem(&stalls, &key);
  if (!start) return;
  __u64 d = bpf_ktime_get_ns() - *start;
  bpf_map_delete_elem(&stalls, &key);
  struct strata_os_stats* st = stats_of(id >> 32);
  if (!st) return;
  if (kind == STALL_COMPACTION) {
    __sync_fetch_and_add(&st->compaction_count, 1);
    __sync_fetch_and_add(&st->compaction_ns, d);
  } else {
    __u32 i = kind == STALL_MEMCG_RECLAIM ? 1 : 0;
    __sync_fetch_and_add(&st->reclaim_count[i], 1);
    __sync_fetch_and_add(&st->reclaim_ns[i], d);
  }
}

SEC("tp_btf/mm_vmscan_direct_reclaim_begin")
int BPF_PROG(on_reclaim_begin) {
  stall_begin(STALL_RECLAIM);
  return 0;
}

SEC("tp_btf/mm_vmscan_direct_reclaim_end")
int BPF_PROG(on_reclaim_end) {
  stall_end(STALL_RECLAIM);
  return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_begin")
int BPF_PROG(on_memcg_reclaim_begin) {
  stall_begin(STALL_MEMCG_RECLAIM);
  return 0;
}

SEC("tp_btf/mm_vmscan_memcg_reclaim_end")
int BPF_PROG(on_memcg_reclaim_end) {
  stall_end(STALL_MEMCG_RECLAIM);
  return 0;
}

SEC("tp_btf/mm_compaction_begin")
int BPF_PROG(on_compaction_begin) {
  stall_begin(STALL_COMPACTION);
  return 0;
}

SEC("tp_btf/mm_compaction_end")
int BPF_PROG(on_compaction_end) {
  stall_end(STALL_COMPACTION);
  return 0;
}

SEC("tp_btf/block_io_start")
int BPF_PROG(on_block_io_start, struct request* rq) {
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (!watched(tgid)) return 0;
  __u64 key = (__u64)rq;
  struct bio_start v = {.tgid = tgid, .start_ns = bpf_ktime_get_ns()};
  if (bpf_map_update_elem(&bios, &key, &v, BPF_ANY) != 0) bump(STRATA_OS_CNT_BIO_FULL);
  return 0;
}

SEC("tp_btf/block_io_done")
int BPF_PROG(on_block_io_done, struct request* rq) {
  __u64 key = (__u64)rq;
  struct bio_start* s = bpf_map_lookup_elem(&bios, &key);
  if (!s) return 0;
  __u64 d = bpf_ktime_get_ns() - s->start_ns;
  __u32 tgid = s->tgid;
  bpf_map_delete_elem(&bios, &key);
  struct strata_os_stats* st = stats_of(tgid);
  if (!st) return 0;
  __sync_fetch_and_add(&st->bio_count, 1);
  __sync_fetch_and_add(&st->bio_ns, d);
  strata_hist_add(st->bio_hist, d);
  return 0;
}

SEC("tp_btf/tcp_retransmit_skb")
int BPF_PROG(on_tcp_retransmit, const struct sock* sk) {
  __u64 ino = BPF_CORE_READ(sk, sk_socket, file, f_inode, i_ino);
  if (!ino) {
    bump(STRATA_OS_CNT_RETRANS_NO_INODE);
    return 0;
  }
  __u64* v = bpf_map_lookup_elem(&retransmits, &ino);
  if (v) {
    __sync_fetch_and_add(v, 1);
    return 0;
  }
  __u64 one = 1;
  if (bpf_map_update_elem(&retransmits, &ino, &one, BPF_NOEXIST) != 0) bump(STRATA_OS_CNT_RETRANS_FULL);
  return 0;
}
