// SPDX-License-Identifier: GPL-2.0
/* Everything the OS layer learns from sched_switch alone, in one program so a context switch costs one
 * BPF run (sched_switch fires tens of thousands of times a second on a busy node):
 *   - off-CPU blocked time of watched threads with their stacks (the "offcpu" layer);
 *   - per watched process: run time per CPU, run-queue latency (from the kernel's own
 *     sched_info.run_delay, so no sched_wakeup program is needed), voluntary/involuntary switches,
 *     migrations, blocked time by reason (the "os" layer);
 *   - the processes that ran on CPUs where a watched process ran recently (neighbours).
 * User stacks are captured at switch-out (only then is the thread current), kept in task storage, and
 * sent at switch-in if the thread was off CPU for at least min_block_ns, with the kernel stack walked
 * then (a blocked thread's kernel stack does not change until it runs). Capturing on every switch would
 * cost O(switches), so a capture is wanted only for threads that blocked long lately (within their last
 * eight blocks: threads that alternate short and long waits, like a stream worker, stay covered), for
 * every switch-out in D state, plus a small per-CPU exploration budget; never for a preempted thread
 * (see switch_out). A capture (two stack walks and a 16 KB copy) is most of what this program costs,
 * so the wanted captures are sampled: when a CPU wanted more than capture_target_per_sec of a class
 * (sleeps; D state; see abi/offcpu.h) in the last period, one in 2^k of that class is taken at random
 * (k per CPU, per class, per period), and a long block sent with such a stack counts 2^k times its
 * blocked time. The sum stays an unbiased estimate of the blocked time of the sampled threads whatever
 * k is; a long block whose capture was sampled out is not sent (its sampled siblings stand for it).
 * The agent's cost budget lowers the target at run time. A long block of a thread not wanted at
 * switch-out is sent with the kernel stack read at switch-in, sampled and weighted the same way, in a
 * third class.
 * The frame-pointer walk of the user stack stops in frameless code (glibc's futex and poll waits, where
 * most blocked threads sit), so a capture also copies the top of the user stack with rip/rsp/rbp for
 * the node to unwind with CFI, as on-CPU samples do. The copies (16 KB) live in a fixed pool, not in
 * every watched thread's storage: memory stays bounded however many threads block, and a copy that
 * another thread's capture reused before its owner woke is dropped (counted), leaving the FP stack. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "bpf/strata_ringbuf.bpf.h"

#include "abi/offcpu.h"
#include "bpf/strata_maps.bpf.h"
#include "bpf/strata_targets.bpf.h"
#include "bpf/strata_uret.bpf.h"
#include "bpf/strata_hist.bpf.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 abi_version = STRATA_OFFCPU_ABI_VERSION;
const volatile bool capture_stacks = true;   /* offcpu layer: send long blocks with stacks */
const volatile bool sched_metrics = true;    /* os layer: per-process scheduler counters, neighbours */
const volatile __u64 min_block_ns = 1000000; /* a block shorter than this is counted, not sent */
const volatile __u32 max_events_per_sec = 1000;   /* per CPU: long blocks sent */
const volatile __u32 max_captures_per_sec = 1000; /* per CPU: stack captures at switch-out, a hard cap */
const volatile __u32 explore_per_sec = 50;        /* per CPU: captures for threads not known to block long */
const volatile __u64 neighbour_horizon_ns = 2000000000ull; /* count neighbours this long after a watched thread ran */
const volatile __u32 snapshot_pages = 4;          /* user stack copy: rest of rsp's page + up to this many; 0: none */
const volatile __u32 max_snapshots_per_sec = 500; /* per CPU: stack copies at switch-out */
const volatile __u32 pool_mask = 255;             /* snapshot pool slots - 1 (a power of two) */
/* Written by the agent while it runs (.data is mapped): per CPU, the captures a period may take before
 * they are sampled (see the top). */
volatile __u32 capture_target_per_sec = 100;
#define MAX_CAPTURE_SHIFT 12 /* 1 in 4096: a CPU wanting a million captures a second still takes a few */

#define TASK_INTERRUPTIBLE 0x1
#define TASK_UNINTERRUPTIBLE 0x2

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 22); /* resized by the agent before load */
} events SEC(".maps");

#define KSTACK_BYTES (STRATA_MAX_STACK_DEPTH * sizeof(__u64))
#define USTACK_BYTES (STRATA_MAX_STACK_DEPTH * sizeof(__u64))

#define PAGE 4096
#define SNAP_BYTES STRATA_STACK_SNAPSHOT_MAX

struct offcpu_buf {
  struct strata_offcpu_event hdr;
  __u8 frames[KSTACK_BYTES + USTACK_BYTES];
};

/* What is sent: the frames, then the stack copy. Assembled in per-CPU scratch. */
struct offcpu_send_buf {
  struct strata_offcpu_event hdr;
  __u8 frames[KSTACK_BYTES + USTACK_BYTES + SNAP_BYTES];
};

/* One stack copy. `stamp` names the capture that wrote it (0 while being written). */
struct snap_slot {
  __u64 stamp;
  __u64 ip, sp, bp;
  __u32 len;
  __u32 uret_len;
  struct strata_uret uret[STRATA_MAX_URETPROBES];
  __u8 data[SNAP_BYTES];
};

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 256); /* pool_mask + 1, set by the agent before load */
  __type(key, __u32);
  __type(value, struct snap_slot);
} snap_pool SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} snap_cursor SEC(".maps");

/* Per watched thread. The event buffer lives here so a captured stack waits in place for switch-in. */
struct task_state {
  __u64 out_ns;         /* switch-out time; 0 while on CPU */
  __u64 last_run_delay; /* sched_info.run_delay at the last switch-out */
  __u32 last_cpu;       /* CPU + 1 where it last ran; 0 unknown */
  __u8 reason;
  __u8 has_stack;
  __u8 long_score;      /* 8 after a block reached min_block_ns, less one per shorter block */
  __u8 run_delay_seen;
  __u8 sampled_out;     /* a capture was wanted at switch-out and sampled out: the block is not sent */
  __u8 weight_shift;    /* the captured stack stands for 2^weight_shift blocks */
  __u8 _pad[2];
  __u32 snap_slot;      /* pool slot of the stack copy, valid while snap_stamp matches the slot's */
  __u64 snap_stamp;     /* 0: no copy */
  struct offcpu_buf buf;
};

struct {
  __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, int);
  __type(value, struct task_state);
} task_states SEC(".maps");

#define cpu_state strata_offcpu_cpu_state

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct cpu_state);
} cpu_states SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __uint(max_entries, 4096); /* resized by the agent */
  __type(key, __u32);        /* tgid */
  __type(value, struct strata_sched_stats);
} sched_stats SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 8192);
  __type(key, struct strata_neighbour_key);
  __type(value, struct strata_neighbour_value);
} neighbours SEC(".maps");

/* Zeroes to create sched_stats entries from (too big for the BPF stack); never written. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct strata_sched_stats);
} zero_stats SEC(".maps");

/* Scratch where a long block is assembled before it is sent. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct offcpu_send_buf);
} scratch SEC(".maps");

static __always_inline void bump(struct cpu_state* cs, __u32 counter) {
  if (counter < STRATA_OFFCPU_CNT__COUNT) cs->counters[counter] += 1;
}

static __always_inline void roll_period(struct cpu_state* cs, __u64 now) {
  __u64 p = now >> 30; /* ~1.07 s */
  if (p != cs->period) {
    /* The next period's sampling, per class: the smallest k that brings the last period's wanted
     * captures within the target. */
    __u32 target = capture_target_per_sec ? capture_target_per_sec : 1;
    for (int c = 0; c < STRATA_OFFCPU_CLASSES; c++) {
      __u32 k = 0;
      for (int i = 0; i < MAX_CAPTURE_SHIFT; i++) {
        if ((cs->wanted[c] >> k) <= target) break;
        k++;
      }
      cs->shift[c] = k;
      cs->wanted[c] = 0;
    }
    cs->period = p;
    cs->events = 0;
    cs->captures = 0;
    cs->explores = 0;
    cs->snapshots = 0;
  }
}

/* Counts one wanted capture (or bare block) of class c and says whether this one is sampled out;
 * *shift gets the weight's power of two for the one that is kept. */
static __always_inline bool skip_by_sampling(struct cpu_state* cs, __u32 c, __u32* shift) {
  if (c >= STRATA_OFFCPU_CLASSES) c = 0;
  cs->wanted[c]++;
  __u32 k = cs->shift[c];
  if (k > MAX_CAPTURE_SHIFT) k = MAX_CAPTURE_SHIFT;
  *shift = k;
  return k && (bpf_get_prandom_u32() & ((1u << k) - 1));
}

static __always_inline struct strata_sched_stats* stats_of(__u32 tgid) {
  bool full = false; /* the agent sizes sched_stats for its processes; a miss is a process too many */
  return strata_lookup_or_init(&sched_stats, &tgid, &zero_stats, &full);
}

static __always_inline __u8 reason_of(struct task_struct* prev, bool preempt, unsigned int state) {
  if (preempt || state == 0) return STRATA_OFFCPU_PREEMPTED;
  if (state & TASK_UNINTERRUPTIBLE)
    /* prev is a BTF pointer (tp_btf): a direct load, not a probe-read helper call */
    return BPF_CORE_READ_BITFIELD(prev, in_iowait) ? STRATA_OFFCPU_IO : STRATA_OFFCPU_UNINTERRUPTIBLE;
  if (state & TASK_INTERRUPTIBLE) return STRATA_OFFCPU_SLEEP;
  return STRATA_OFFCPU_OTHER;
}

/* The user stack can only be walked now, while the thread is current; its kernel stack stays as it
 * is until the thread runs again, so it is walked at switch-in, only for the blocks that are sent
 * (most captures are of blocks that turn out short, and the kernel walk is half a capture). */
static __always_inline void capture(void* ctx, struct task_state* ts, struct cpu_state* cs) {
  struct offcpu_buf* b = &ts->buf;
  long ubytes = bpf_get_stack(ctx, b->frames, USTACK_BYTES, BPF_F_USER_STACK);
  if (ubytes < 0) ubytes = 0;
  if (ubytes > USTACK_BYTES) ubytes = USTACK_BYTES;
  b->hdr.kstack_len = 0;
  b->hdr.ustack_len = ubytes / sizeof(__u64);
  ts->has_stack = 1;
  bump(cs, STRATA_OFFCPU_CNT_CAPTURES);
}

/* Copies the top of the user stack into a pool slot: the rest of rsp's page, then whole pages while
 * they read. The slot is marked unwritten first and stamped last, so a reader can tell a torn copy. */
static __always_inline void copy_stack(struct task_state* ts, struct cpu_state* cs, __u64 now, __u32 tid) {
  ts->snap_stamp = 0;
  if (!snapshot_pages) return;
  if (cs->snapshots >= max_snapshots_per_sec) {
    bump(cs, STRATA_OFFCPU_CNT_SNAPSHOT_SKIPPED);
    return;
  }
  __u32 zero = 0;
  __u64* cursor = bpf_map_lookup_elem(&snap_cursor, &zero);
  if (!cursor) return;
  __u32 idx = (__u32)__sync_fetch_and_add(cursor, 1) & pool_mask;
  struct snap_slot* slot = bpf_map_lookup_elem(&snap_pool, &idx);
  if (!slot) return;
  struct pt_regs* regs = (struct pt_regs*)bpf_task_pt_regs(bpf_get_current_task_btf());
  __u64 sp = regs->sp; /* a BTF pointer: direct loads */
  __u64 first = PAGE - (sp & (PAGE - 1));
  if (first > PAGE || first == 0 || !sp) return;
  cs->snapshots++;
  slot->stamp = 0;
  if (bpf_probe_read_user(slot->data, first, (void*)sp) != 0) return;
  __u64 len = first;
  for (__u32 i = 0; i < SNAP_BYTES / PAGE - 1; i++) {
    if (i + 1 >= snapshot_pages) break;
    if (len > SNAP_BYTES - PAGE) break;
    if (bpf_probe_read_user(slot->data + len, PAGE, (void*)(sp + len)) != 0) break;
    len += PAGE;
  }
  slot->ip = regs->ip;
  slot->sp = sp;
  slot->bp = regs->bp;
  slot->len = len;
  slot->uret_len = strata_read_uretprobes(slot->uret);
  __u64 stamp = (now << 8) ^ tid;
  if (!stamp) stamp = 1;
  slot->stamp = stamp;
  ts->snap_slot = idx;
  ts->snap_stamp = stamp;
  bump(cs, STRATA_OFFCPU_CNT_SNAPSHOTS);
}

/* st: prev's process's sched_stats (NULL when sched_metrics is off or the map is full). */
static __always_inline void switch_out(void* ctx, struct task_struct* prev, bool preempt, unsigned int state,
                                       __u32 cpu, __u64 ran, __u64 now, struct cpu_state* cs,
                                       struct strata_sched_stats* st) {
  struct task_state* ts = bpf_task_storage_get(&task_states, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
  if (!ts) {
    bump(cs, STRATA_OFFCPU_CNT_STORAGE_FAIL);
    return;
  }
  __u8 reason = reason_of(prev, preempt, state);
  ts->out_ns = now;
  ts->reason = reason;
  ts->last_cpu = cpu + 1;
  ts->has_stack = 0;
  ts->sampled_out = 0;
  ts->weight_shift = 0;
  ts->snap_stamp = 0;

  if (st) {
    /* cpu_ns[cpu] is written only on this CPU: a plain add, no locked instruction */
    if (cpu < STRATA_OS_MAX_CPUS) st->cpu_ns[cpu & (STRATA_OS_MAX_CPUS - 1)] += ran;
    if (reason == STRATA_OFFCPU_PREEMPTED)
      __sync_fetch_and_add(&st->involuntary, 1);
    else
      __sync_fetch_and_add(&st->voluntary, 1);
    /* The run-queue wait before this run slice: the kernel added it to run_delay at switch-in. */
    if (bpf_core_field_exists(prev->sched_info)) {
      __u64 rd = prev->sched_info.run_delay; /* a BTF pointer: a direct load, no helper call */
      if (ts->run_delay_seen && rd >= ts->last_run_delay) {
        __u64 wait = rd - ts->last_run_delay;
        __sync_fetch_and_add(&st->runq_count, 1);
        __sync_fetch_and_add(&st->runq_ns, wait);
        strata_hist_add(st->runq_hist, wait);
      }
      ts->last_run_delay = rd;
      ts->run_delay_seen = 1;
    }
  }

  if (!capture_stacks) return;
  /* A preempted thread is runnable: its wait is run-queue wait (counted above from run_delay), and
   * what it was running is what the on-CPU sampler sees, with whole stacks. A capture here would be
   * a frame-pointer stack only (no copy, below), broken in every frameless module, of time the
   * diagnosis leaves out of the off-CPU profile (it weighs I/O and D-state blocks): measured on a
   * 2-rank PyTorch DDP job, 39% of the watched threads' switch-outs were preemptions. */
  if (reason == STRATA_OFFCPU_PREEMPTED) return;
  /* D state (I/O, a page fault on a slow disk, a lock in the kernel) is what the diagnosis weighs:
   * always wanted, sampled in a class of its own. */
  bool blocked = reason == STRATA_OFFCPU_IO || reason == STRATA_OFFCPU_UNINTERRUPTIBLE;
  bool want = blocked || ts->long_score > 0;
  if (!want && cs->explores < explore_per_sec) {
    cs->explores++;
    want = true;
  }
  if (!want) return;
  __u32 k = 0;
  if (skip_by_sampling(cs, blocked ? STRATA_OFFCPU_CLASS_BLOCKED : STRATA_OFFCPU_CLASS_SLEEP, &k)) {
    ts->sampled_out = 1;
    bump(cs, STRATA_OFFCPU_CNT_SAMPLED_OUT);
    return;
  }
  if (cs->captures >= max_captures_per_sec) {
    bump(cs, STRATA_OFFCPU_CNT_CAPTURE_SKIPPED);
    return;
  }
  cs->captures++;
  capture(ctx, ts, cs);
  ts->weight_shift = k;
  copy_stack(ts, cs, now, prev->pid);
}

static __always_inline void emit(struct task_struct* next, struct task_state* ts, __u32 tgid, __u32 cpu,
                                 __u64 now, __u64 blocked, struct cpu_state* cs) {
  __u32 zero = 0;
  struct offcpu_send_buf* b = bpf_map_lookup_elem(&scratch, &zero);
  if (!b) return;
  __u64 fbytes = 0;
  b->hdr.flags = 0;
  b->hdr.stack_len = 0;
  b->hdr.ip = b->hdr.sp = b->hdr.bp = b->hdr.stack_base = 0;
  b->hdr.uret_len = 0;
  b->hdr._pad3 = 0;
  if (ts->has_stack) {
    /* The kernel stack the thread blocked in (not running yet: it is as it was at switch-out),
     * then the user stack captured then. */
    long kbytes = bpf_get_task_stack(next, b->frames, KSTACK_BYTES, 0);
    if (kbytes < 0) kbytes = 0;
    if (kbytes > KSTACK_BYTES) kbytes = KSTACK_BYTES;
    kbytes &= ~7L;
    __u64 ubytes = (__u64)ts->buf.hdr.ustack_len * sizeof(__u64);
    if (ubytes > USTACK_BYTES) ubytes = USTACK_BYTES;
    if (ubytes && bpf_probe_read_kernel(b->frames + kbytes, ubytes, ts->buf.frames) != 0) ubytes = 0;
    fbytes = kbytes + ubytes;
    b->hdr.kstack_len = kbytes / sizeof(__u64);
    b->hdr.ustack_len = ubytes / sizeof(__u64);
    b->hdr.flags = STRATA_OFFCPU_F_USER_STACK;
  } else {
    long kbytes = bpf_get_task_stack(next, b->frames, KSTACK_BYTES, 0);
    if (kbytes < 0) kbytes = 0;
    if (kbytes > KSTACK_BYTES) kbytes = KSTACK_BYTES;
    fbytes = kbytes & ~7L;
    b->hdr.kstack_len = fbytes / sizeof(__u64);
    b->hdr.ustack_len = 0;
    bump(cs, STRATA_OFFCPU_CNT_NO_USER_STACK);
  }
  __u64 snap = 0;
  if (ts->has_stack && ts->snap_stamp) {
    __u32 idx = ts->snap_slot & pool_mask;
    struct snap_slot* slot = bpf_map_lookup_elem(&snap_pool, &idx);
    if (slot && slot->stamp == ts->snap_stamp) {
      snap = slot->len;
      if (snap > SNAP_BYTES) snap = SNAP_BYTES;
      if (fbytes > KSTACK_BYTES + USTACK_BYTES) fbytes = KSTACK_BYTES + USTACK_BYTES;
      if (snap && bpf_probe_read_kernel(b->frames + fbytes, snap, slot->data) == 0) {
        b->hdr.ip = slot->ip;
        b->hdr.sp = slot->sp;
        b->hdr.bp = slot->bp;
        b->hdr.uret_len = slot->uret_len;
        __builtin_memcpy(b->hdr.uret, slot->uret, sizeof(b->hdr.uret));
      } else {
        snap = 0;
      }
      /* Reused while being read (another CPU's capture took the slot): drop the copy. */
      if (snap && *(volatile __u64*)&slot->stamp != ts->snap_stamp) {
        snap = 0;
        b->hdr.uret_len = 0;
      }
    }
    if (snap) {
      b->hdr.flags |= STRATA_OFFCPU_F_SNAPSHOT;
      b->hdr.stack_len = snap;
      b->hdr.stack_base = b->hdr.sp;
      bump(cs, STRATA_OFFCPU_CNT_SNAPSHOT_SENT);
    } else {
      bump(cs, STRATA_OFFCPU_CNT_SNAPSHOT_LOST);
    }
    ts->snap_stamp = 0;
  }
  b->hdr.type = STRATA_OFFCPU_EV_BLOCK;
  b->hdr.pid = tgid;
  b->hdr.tid = next->pid;
  b->hdr.cpu = cpu;
  b->hdr.ts_ns = now;
  b->hdr.blocked_ns = blocked;
  b->hdr.reason = ts->reason;
  b->hdr._pad = 0;
  b->hdr._pad2 = 0;
  BPF_CORE_READ_STR_INTO(&b->hdr.comm, next, comm);
  __u64 size = sizeof(b->hdr) + fbytes + snap;
  if (size > sizeof(*b)) size = sizeof(*b);
  if (bpf_ringbuf_output(&events, b, size, strata_rb_flags(&events)) == 0) {
    bump(cs, STRATA_OFFCPU_CNT_EMITTED);
    return;
  }
  if (snap) {
    /* No room for the stack copy: the blocked time and the frame-pointer stack still go. */
    b->hdr.flags &= ~STRATA_OFFCPU_F_SNAPSHOT;
    b->hdr.stack_len = 0;
    b->hdr.uret_len = 0;
    size = sizeof(b->hdr) + fbytes;
    if (size > sizeof(*b)) size = sizeof(*b);
    if (bpf_ringbuf_output(&events, b, size, BPF_RB_FORCE_WAKEUP) == 0) {
      bump(cs, STRATA_OFFCPU_CNT_EMITTED);
      bump(cs, STRATA_OFFCPU_CNT_SNAPSHOT_DROPPED);
      return;
    }
  }
  bump(cs, STRATA_OFFCPU_CNT_RINGBUF_DROP);
}

/* prev_st: the sched_stats switch_out just looked up for prev_tgid, reused when next is of the same
 * process (a switch between two threads of one process) to save a hash lookup. */
static __always_inline void switch_in(struct task_struct* next, __u32 tgid, __u32 cpu, __u64 now,
                                      struct cpu_state* cs, __u32 prev_tgid, struct strata_sched_stats* prev_st) {
  struct task_state* ts = bpf_task_storage_get(&task_states, next, 0, 0);
  if (!ts || !ts->out_ns) return;
  __u64 blocked = now - ts->out_ns;
  ts->out_ns = 0;
  bump(cs, STRATA_OFFCPU_CNT_BLOCKS);
  if (sched_metrics) {
    struct strata_sched_stats* st = prev_st && prev_tgid == tgid ? prev_st : stats_of(tgid);
    if (st) {
      __u8 r = ts->reason;
      if (r < STRATA_OFFCPU_REASONS) __sync_fetch_and_add(&st->offcpu_ns[r], blocked);
      if (ts->last_cpu && ts->last_cpu != cpu + 1) __sync_fetch_and_add(&st->migrations, 1);
    }
  }
  if (blocked < min_block_ns) {
    if (ts->long_score) ts->long_score--;
    return;
  }
  ts->long_score = 8;
  bump(cs, STRATA_OFFCPU_CNT_LONG);
  if (!capture_stacks) return;
  if (ts->sampled_out) {  /* its sampled siblings' weight stands for it */
    ts->sampled_out = 0;
    return;
  }
  __u32 k = ts->has_stack ? ts->weight_shift : 0;
  if (!ts->has_stack) {
    /* No capture at switch-out (a thread not known to block long, a preemption, the capture cap):
     * sent with the kernel stack, walked now. Such blocks are sampled as captures are, over the same
     * per-CPU target, and weighted 2^k: a node of threads that mostly block briefly and now and then
     * long (a communication library's helpers) sent every one of them, a kernel stack walk and a
     * ring-buffer write each, ~110 a second on a 2-rank DDP job, no budget could lower. */
    if (skip_by_sampling(cs, STRATA_OFFCPU_CLASS_BARE, &k)) {
      bump(cs, STRATA_OFFCPU_CNT_BARE_SAMPLED_OUT);
      return;
    }
  }
  if (cs->events >= max_events_per_sec) {
    bump(cs, STRATA_OFFCPU_CNT_RATE_LIMITED);
    return;
  }
  cs->events++;
  emit(next, ts, tgid, cpu, now, blocked << k, cs);
}

static __always_inline void count_neighbour(struct task_struct* prev, __u32 tgid, __u32 cpu, __u64 ran,
                                            struct cpu_state* cs) {
  struct strata_neighbour_key k = {.cpu = cpu, .tgid = tgid};
  struct strata_neighbour_value* v = bpf_map_lookup_elem(&neighbours, &k);
  if (v) {
    v->run_ns += ran; /* the key holds the CPU: only this CPU writes it */
    return;
  }
  struct strata_neighbour_value nv = {.run_ns = ran};
  BPF_CORE_READ_STR_INTO(&nv.comm, prev, group_leader, comm);
  if (bpf_map_update_elem(&neighbours, &k, &nv, BPF_NOEXIST) != 0) bump(cs, STRATA_OFFCPU_CNT_NEIGHBOURS_FULL);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct* prev, struct task_struct* next, unsigned int prev_state) {
  __u32 zero = 0;
  struct cpu_state* cs = bpf_map_lookup_elem(&cpu_states, &zero);
  if (!cs) return 0;
  __u32 prev_tgid = prev->tgid;
  __u32 next_tgid = next->tgid;
  bool prev_watched = prev_tgid && strata_is_target(prev_tgid);
  bool next_watched = next_tgid && strata_is_target(next_tgid);
  /* The common case on a busy node: no watched thread here lately. Leave before reading the clock;
   * last_switch_ns goes stale, so the first slice after a quiet spell is not counted. */
  if (!prev_watched && !next_watched && !cs->watched_seen_ns) {
    cs->last_switch_ns = 0;
    return 0;
  }
  __u64 now = bpf_ktime_get_ns();
  __u64 ran = cs->last_switch_ns ? now - cs->last_switch_ns : 0;
  cs->last_switch_ns = now;
  __u32 cpu = bpf_get_smp_processor_id();
  roll_period(cs, now);
  struct strata_sched_stats* prev_st = 0;
  if (prev_watched) {
    cs->watched_seen_ns = now;
    if (sched_metrics) prev_st = stats_of(prev_tgid);
    switch_out(ctx, prev, preempt, prev_state, cpu, ran, now, cs, prev_st);
  }
  /* Every process that ran here counts, watched ones too (other ranks sharing a rank's CPU are
   * neighbours as well); the agent leaves out each process's own time. */
  if (sched_metrics && prev_tgid && now - cs->watched_seen_ns < neighbour_horizon_ns)
    count_neighbour(prev, prev_tgid, cpu, ran, cs);
  if (next_watched) {
    cs->watched_seen_ns = now;
    switch_in(next, next_tgid, cpu, now, cs, prev_tgid, prev_st);
  }
  return 0;
}
