// SPDX-License-Identifier: GPL-2.0
/* On-CPU stack sampling for a process tree.
 * A perf_event cpu-clock program on every CPU keeps only threads of watched processes (the `targets`
 * map, by tgid) and writes one ring-buffer record per sample: kernel addresses; user frames as
 * build id + file offset from a frame-pointer walk (normalized in the kernel, so short-lived
 * processes need no /proc lookup); and/or a copy of the top of the user stack with rip/rsp/rbp,
 * which the node unwinds with CFI where modules have no frame pointers (unwind/); and, for
 * processes the agent recognized as CPython (`py_procs`), the thread's Python frames, read here
 * because they live in the heap and change as soon as the thread runs on.
 * The agent aggregates per window. Children of watched processes are added at fork. */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

#include "bpf/strata_ringbuf.bpf.h"

#include "abi/oncpu.h"
#include "bpf/strata_targets.bpf.h"
#include "bpf/strata_uret.bpf.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u32 abi_version = STRATA_ONCPU_ABI_VERSION;
const volatile bool follow_children = true;
const volatile __u32 user_stack_mode = STRATA_USTACK_BOTH;
const volatile __u32 snapshot_pages = 6; /* the stack copy: the rest of rsp's page + up to this many pages */

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

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1024);
  __type(key, __u32); /* tgid */
  __type(value, struct strata_py_offsets);
} py_procs SEC(".maps");

/* The kernel CFI walk's tables (STRATA_USTACK_KERNEL_CFI; abi/oncpu.h), filled by the agent:
 * all modules' rows in one array, where each module's rows begin, each process's executable
 * mappings. Sized by the agent before load (one entry each in the other modes). */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct strata_unwind_row);
} kcfi_rows SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32); /* module id */
  __type(value, struct strata_kcfi_module);
} kcfi_modules SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1);
  __type(key, __u32); /* tgid */
  __type(value, struct strata_proc_mappings);
} kcfi_procs SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u32); /* row index: struct strata_kcfi_module's page index */
} kcfi_pages SEC(".maps");

#define KSTACK_BYTES (STRATA_MAX_STACK_DEPTH * sizeof(__u64))
#define USTACK_BYTES (STRATA_MAX_STACK_DEPTH * sizeof(__u64))
#define PY_BYTES (STRATA_MAX_PY_FRAMES * sizeof(struct strata_py_frame))
#define PAGE 4096
#define SNAP_BYTES STRATA_ONCPU_SNAPSHOT_MAX

/* The kernel CFI walk's state (kernel_cfi_walk). */
struct kcfi_state {
  __u64 off; /* where user addresses start in frames */
  __u64 pc, sp, bp;
  __u32 n, cfi_frames, fp_frames, bp_known, stop;
  __u32 last_map; /* the mapping of the frame before */
  __u32 lo, hi, err; /* binary searches: the first entry that starts above x */
  __u64 x;
};

/* Per-CPU scratch: a sample is assembled here, then copied to the ring buffer at its real size.
 * Sections follow each other at their real lengths: kernel, user (FP), Python, stack copy. */
struct sample_buf {
  struct strata_sample hdr;
  __u8 frames[KSTACK_BYTES + USTACK_BYTES + PY_BYTES + SNAP_BYTES];
  __u8 pyframe[STRATA_PY_FRAME_READ]; /* one interpreter frame, read at once */
  struct kcfi_state kcfi;              /* the kernel CFI walk's state (never sent) */
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

/* The user registers at the sample: from the task's saved user state, which is right whether the
 * timer hit in user or in kernel mode. */
static __always_inline struct pt_regs* user_regs(void) {
  return (struct pt_regs*)bpf_task_pt_regs(bpf_get_current_task_btf());
}

/* Copies the user stack from rsp upward: the rest of rsp's page, then whole pages while they read
 * (the stack's top ends the copy). Returns the bytes written at frames[off]. */
static __always_inline __u64 copy_user_stack(struct sample_buf* buf, __u64 off) {
  struct pt_regs* regs = user_regs();
  __u64 sp = BPF_CORE_READ(regs, sp);
  buf->hdr.ip = BPF_CORE_READ(regs, ip);
  buf->hdr.sp = sp;
  buf->hdr.bp = BPF_CORE_READ(regs, bp);
  buf->hdr.stack_base = sp;
  buf->hdr.flags |= STRATA_SAMPLE_HAS_REGS;
  buf->hdr.uret_len = strata_read_uretprobes(buf->hdr.uret);
  if (off > KSTACK_BYTES + USTACK_BYTES + PY_BYTES) return 0;
  __u64 first = PAGE - (sp & (PAGE - 1));
  if (first > PAGE || first == 0) return 0;
  if (bpf_probe_read_user(buf->frames + off, first, (void*)sp) != 0) {
    bump(STRATA_CNT_SNAPSHOT_ERR);
    return 0;
  }
  __u64 len = first;
  for (__u32 i = 0; i < SNAP_BYTES / PAGE - 1; i++) {
    if (i + 1 >= snapshot_pages) break;
    __u64 at = off + len;
    if (at > KSTACK_BYTES + USTACK_BYTES + PY_BYTES + SNAP_BYTES - PAGE) break;
    if (bpf_probe_read_user(buf->frames + at, PAGE, (void*)(sp + len)) != 0) break;
    len += PAGE;
  }
  buf->hdr.stack_len = len;
  return len;
}

static __always_inline __u64 frame_u64(struct sample_buf* buf, __u16 field) {
  if (field > STRATA_PY_FRAME_READ - 8) return 0;
  __u64 v;
  __builtin_memcpy(&v, buf->pyframe + field, sizeof(v));
  return v;
}

static __always_inline __u8 frame_u8(struct sample_buf* buf, __u16 field) {
  if (field > STRATA_PY_FRAME_READ - 1) return 0;
  return buf->pyframe[field];
}

#define PY_FRAME_OWNED_BY_CSTACK 3

/* State of the Python walk, shared with its bpf_loop callbacks (loops the verifier need not unroll). */
struct py_walk {
  struct sample_buf* buf;
  struct strata_py_offsets* o;
  __u64 off;     /* where Python frames start in buf->frames */
  __u64 want;    /* the thread id the thread state must carry */
  __u16 id_field;
  __u64 tstate;  /* thread walk: current; then the one found */
  __u64 found;
  __u64 frame;
  __u32 n;
  int err;
};

static long find_thread_cb(__u32 i, void* ctx) {
  struct py_walk* w = ctx;
  if (!w->tstate) return 1;
  __u64 v = 0;
  if (bpf_probe_read_user(&v, sizeof(v), (void*)(w->tstate + w->id_field))) return 1;
  if (v == w->want) {
    w->found = w->tstate;
    return 1;
  }
  if (bpf_probe_read_user(&w->tstate, sizeof(w->tstate), (void*)(w->tstate + w->o->tstate_next))) return 1;
  return 0;
}

static long walk_frame_cb(__u32 i, void* ctx) {
  struct py_walk* w = ctx;
  struct sample_buf* buf = w->buf;
  struct strata_py_offsets* o = w->o;
  if (!w->frame) return 1;
  if (bpf_probe_read_user(buf->pyframe, STRATA_PY_FRAME_READ, (void*)w->frame)) {
    w->err = 1;
    return 1;
  }
  __u64 code = frame_u64(buf, o->frame_code);
  __u64 instr = frame_u64(buf, o->frame_instr);
  __u64 prev = frame_u64(buf, o->frame_previous);
  __u32 n = w->n;
  if (n > STRATA_MAX_PY_FRAMES) return 1;
  __u64 base = w->off;
  if (base > KSTACK_BYTES + USTACK_BYTES) return 1;
  if (o->minor >= 12 && frame_u8(buf, o->frame_owner) == PY_FRAME_OWNED_BY_CSTACK) {
    /* The shim frame the eval loop pushes on entry: the frame before it began a C-level call. */
    if (n > 0) {
      __u64 at = base + (n - 1) * sizeof(struct strata_py_frame);
      if (at <= KSTACK_BYTES + USTACK_BYTES + PY_BYTES - sizeof(struct strata_py_frame))
        ((struct strata_py_frame*)(buf->frames + at))->flags |= STRATA_PY_FRAME_ENTRY;
    }
    w->frame = prev;
    return 0;
  }
  if (n >= STRATA_MAX_PY_FRAMES) {
    bump(STRATA_CNT_PY_TRUNCATED);
    return 1;
  }
  __u32 lasti, flags = 0;
  if (o->minor <= 10) {
    lasti = (__u32)instr;          /* f_lasti, already in code units */
    flags = STRATA_PY_FRAME_ENTRY; /* one eval loop call per frame */
  } else {
    lasti = instr > code + o->code_adaptive ? (__u32)((instr - code - o->code_adaptive) / 2) : 0;
    if (o->minor == 11 && frame_u8(buf, o->frame_is_entry)) flags = STRATA_PY_FRAME_ENTRY;
  }
  __u64 at = base + n * sizeof(struct strata_py_frame);
  if (at > KSTACK_BYTES + USTACK_BYTES + PY_BYTES - sizeof(struct strata_py_frame)) return 1;
  struct strata_py_frame* pf = (struct strata_py_frame*)(buf->frames + at);
  pf->code = code;
  pf->lasti = lasti;
  pf->flags = flags;
  w->n = n + 1;
  w->frame = prev;
  return 0;
}

/* The sampled thread's Python frames, leaf first, written at frames[off]. The thread state is
 * found by walking the interpreter's thread list for the sampled thread id; frames are read one
 * struct at a time. Returns the bytes written. */
static __noinline __u64 read_python(struct sample_buf* buf, __u64 off, __u32 tid) {
  if (!buf) return 0;
  __u32 tgid = buf->hdr.pid;
  struct strata_py_offsets* o = bpf_map_lookup_elem(&py_procs, &tgid);
  if (!o) return 0;
  bump(STRATA_CNT_PY_SAMPLES);
  struct py_walk w = {};
  w.buf = buf;
  w.o = o;
  w.off = off;
  __u64 interp = 0;
  if (bpf_probe_read_user(&interp, sizeof(interp), (void*)(o->runtime_addr + o->runtime_interpreters_head)) ||
      !interp || bpf_probe_read_user(&w.tstate, sizeof(w.tstate), (void*)(interp + o->interp_threads_head)))
    goto read_err;
  /* Before 3.11 a thread state knows only pthread_self(), which on x86-64 glibc is the fs base. */
  w.want = tid;
  w.id_field = o->tstate_native_thread_id;
  if (w.id_field == STRATA_PY_NO_FIELD) {
    w.want = BPF_CORE_READ(bpf_get_current_task_btf(), thread.fsbase);
    w.id_field = o->tstate_thread_id;
  }
  bpf_loop(64, find_thread_cb, &w, 0);
  if (!w.found) {
    buf->hdr.py_status = 2;
    bump(STRATA_CNT_PY_NO_THREAD);
    return 0;
  }
  if (bpf_probe_read_user(&w.frame, sizeof(w.frame), (void*)(w.found + o->tstate_frame))) goto read_err;
  if (o->cframe_current_frame != STRATA_PY_NO_FIELD && w.frame &&
      bpf_probe_read_user(&w.frame, sizeof(w.frame), (void*)(w.frame + o->cframe_current_frame)))
    goto read_err;
  bpf_loop(STRATA_MAX_PY_FRAMES + 16, walk_frame_cb, &w, 0);
  if (w.err && w.n == 0) goto read_err;
  buf->hdr.py_len = w.n;
  buf->hdr.py_status = 1;
  return w.n * sizeof(struct strata_py_frame);
read_err:
  buf->hdr.py_status = 3;
  bump(STRATA_CNT_PY_READ_ERR);
  return 0;
}

/* The kernel CFI walk (STRATA_USTACK_KERNEL_CFI): per frame, the mapping of the address (binary
 * search in the process's sorted mappings), the module's row (binary search in its rows), then
 * CFA, return address at CFA-8 and the saved rbp, read from the live stack. Modules without
 * tables are stepped with frame pointers. Loops are bpf_loop callbacks over state kept in the
 * per-CPU scratch (struct kcfi_state): the verifier checks each callback once, while state on the
 * stack, which it tracks exactly, made it check every iteration (past its million instructions). */
struct kcfi_ctx {
  struct sample_buf* buf;
  struct strata_proc_mappings* pm;
};

static __always_inline __u64 kcfi_fix_uret(struct sample_buf* buf, __u64 slot, __u64 ra) {
  /* A pending uretprobe put the kernel's trampoline where this return address was. */
  for (int i = 0; i < STRATA_MAX_URETPROBES; i++) {
    if (i >= buf->hdr.uret_len) break;
    if (buf->hdr.uret[i].slot == slot) return buf->hdr.uret[i].ret;
  }
  return ra;
}

/* Binary searches: end with lo = the first entry that starts above x. */
static long kcfi_mapping_cb(__u32 i, void* ctx) {
  struct kcfi_ctx* c = ctx;
  struct kcfi_state* s = &c->buf->kcfi;
  if (s->lo >= s->hi) return 1;
  __u32 mid = s->lo + (s->hi - s->lo) / 2;
  if (c->pm->m[mid & (STRATA_MAX_PROC_MAPPINGS - 1)].start <= s->x) s->lo = mid + 1;
  else s->hi = mid;
  return 0;
}

static long kcfi_row_cb(__u32 i, void* ctx) {
  struct kcfi_ctx* c = ctx;
  struct kcfi_state* s = &c->buf->kcfi;
  if (s->lo >= s->hi) return 1;
  __u32 mid = s->lo + (s->hi - s->lo) / 2;
  struct strata_unwind_row* r = bpf_map_lookup_elem(&kcfi_rows, &mid);
  if (!r) {
    s->err = 1;
    return 1;
  }
  if (r->pc <= s->x) s->lo = mid + 1;
  else s->hi = mid;
  return 0;
}

static long kcfi_step(__u32 depth, void* ctx) {
  struct kcfi_ctx* c = ctx;
  struct sample_buf* buf = c->buf;
  struct strata_proc_mappings* pm = c->pm;
  struct kcfi_state* w = &buf->kcfi;
  __u32 n = w->n;
  if (n >= STRATA_MAX_STACK_DEPTH) {
    w->stop = STRATA_KCFI_STOP_MAX_DEPTH;
    return 1;
  }
  __u64 at = w->off + n * sizeof(__u64);
  if (at > KSTACK_BYTES + USTACK_BYTES - sizeof(__u64)) {
    w->stop = STRATA_KCFI_STOP_MAX_DEPTH;
    return 1;
  }
  __u64 pc = w->pc, sp = w->sp, bp = w->bp;
  *(__u64*)(buf->frames + at) = pc;
  w->n = n + 1;
  /* A return address points after the call; the call itself (pc-1) is in the caller's range. */
  __u64 lookup = n == 0 ? pc : pc - 1;

  __u32 cnt = pm->n;
  if (cnt > STRATA_MAX_PROC_MAPPINGS) cnt = STRATA_MAX_PROC_MAPPINGS;
  /* Callers are mostly in the callee's module: try the last frame's mapping before searching. */
  struct strata_exec_mapping* m = &pm->m[w->last_map & (STRATA_MAX_PROC_MAPPINGS - 1)];
  if (w->last_map >= cnt || lookup < m->start || lookup >= m->end) {
    w->x = lookup;
    w->lo = 0;
    w->hi = cnt;
    bpf_loop(STRATA_MAX_PROC_MAPPINGS_LOG2 + 1, kcfi_mapping_cb, c, 0);
    __u32 lo = w->lo;
    if (lo == 0 || lo > cnt) goto no_mapping;
    w->last_map = lo - 1;
    m = &pm->m[(lo - 1) & (STRATA_MAX_PROC_MAPPINGS - 1)];
    if (lookup >= m->end) goto no_mapping;
  }

  __u64 cfa = 0, ra = 0, next_bp = bp;
  __u32 next_bp_known = w->bp_known;
  __u32 mod_id = m->module_id;
  if (mod_id == STRATA_KCFI_NO_MODULE) {
    /* Frame pointers: rbp points at the saved caller rbp, the return address above it. */
    if (!w->bp_known || bp == 0) {
      w->stop = bp == 0 ? STRATA_KCFI_STOP_END : STRATA_KCFI_STOP_BAD_FRAME;
      return 1;
    }
    if (bpf_probe_read_user(&ra, sizeof(ra), (void*)(bp + 8)) ||
        bpf_probe_read_user(&next_bp, sizeof(next_bp), (void*)bp)) {
      w->stop = STRATA_KCFI_STOP_READ_ERR;
      return 1;
    }
    cfa = bp + 16;
    next_bp_known = 1;
    w->fp_frames++;
  } else {
    struct strata_kcfi_module* mod = bpf_map_lookup_elem(&kcfi_modules, &mod_id);
    __u64 vaddr = lookup - m->bias;
    if (!mod || mod->count == 0 || vaddr >= (1ull << 32)) goto no_row;
    __u32 first = mod->first, end = mod->first + mod->count;
    __u32 lo = first, hi = end;
    __u32 page = (__u32)(vaddr >> 12);
    if (page >= mod->base_page && page - mod->base_page < mod->page_count) {
      __u32 k = mod->page_first + (page - mod->base_page);
      __u32* a = bpf_map_lookup_elem(&kcfi_pages, &k);
      if (a && *a >= first && *a < end) lo = *a;
      k++;
      __u32* b = page - mod->base_page + 1 < mod->page_count ? bpf_map_lookup_elem(&kcfi_pages, &k) : 0;
      if (b && *b >= lo && *b < end) hi = *b + 1;
    }
    w->x = vaddr;
    w->lo = lo;
    w->hi = hi;
    w->err = 0;
    bpf_loop(32, kcfi_row_cb, c, 0);
    if (w->err || w->lo == first) goto no_row;
    __u32 idx = w->lo - 1;
    struct strata_unwind_row* row = bpf_map_lookup_elem(&kcfi_rows, &idx);
    if (!row) goto no_row;
    switch (row->cfa_rule) {
      case STRATA_KCFI_CFA_END:
        w->stop = STRATA_KCFI_STOP_END;
        return 1;
      case STRATA_KCFI_CFA_RSP: cfa = sp + (__s64)row->cfa_offset; break;
      case STRATA_KCFI_CFA_RBP:
        if (!w->bp_known) {
          w->stop = STRATA_KCFI_STOP_BAD_FRAME;
          return 1;
        }
        cfa = bp + (__s64)row->cfa_offset;
        break;
      case STRATA_KCFI_CFA_PLT: cfa = sp + 8 + ((pc & 15) >= 11 ? 8 : 0); break;
      default: goto no_row;
    }
    if (bpf_probe_read_user(&ra, sizeof(ra), (void*)(cfa - 8))) {
      w->stop = STRATA_KCFI_STOP_READ_ERR;
      return 1;
    }
    if (row->rbp_rule == STRATA_KCFI_RBP_OFFSET) {
      next_bp_known = bpf_probe_read_user(&next_bp, sizeof(next_bp), (void*)(cfa + (__s64)row->rbp_offset)) == 0;
    } else if (row->rbp_rule == STRATA_KCFI_RBP_UNKNOWN) {
      next_bp_known = 0;
    }
    w->cfi_frames++;
  }
  ra = kcfi_fix_uret(buf, cfa - 8, ra);
  if (ra == 0) { /* thread entry points clear the return address */
    w->stop = STRATA_KCFI_STOP_END;
    return 1;
  }
  if (cfa <= sp && n > 0) { /* a frame must move up; the leaf's may not have moved yet */
    w->stop = STRATA_KCFI_STOP_BAD_FRAME;
    return 1;
  }
  w->pc = ra;
  w->sp = cfa;
  w->bp = next_bp;
  w->bp_known = next_bp_known;
  return 0;
no_mapping:
  w->stop = STRATA_KCFI_STOP_NO_MAPPING;
  return 1;
no_row:
  w->stop = STRATA_KCFI_STOP_NO_ROW;
  return 1;
}

static __always_inline void bump_by(__u32 counter, __u64 n) {
  __u64* v = bpf_map_lookup_elem(&counters, &counter);
  if (v) *v += n;
}

/* Writes the user addresses at frames[off]; returns their bytes. A process the agent has not told
 * us about yet gets the kernel's frame-pointer walk. */
static __noinline long kernel_cfi_walk(struct bpf_perf_event_data* ctx, struct sample_buf* buf, __u64 off) {
  if (!buf || off > KSTACK_BYTES) return 0;
  bump(STRATA_CNT_KCFI_WALKS);
  __u32 tgid = buf->hdr.pid;
  buf->hdr.flags |= STRATA_SAMPLE_KERNEL_CFI;
  struct strata_proc_mappings* pm = bpf_map_lookup_elem(&kcfi_procs, &tgid);
  if (!pm) {
    bump(STRATA_CNT_KCFI_NO_PROC);
    buf->hdr.kcfi_stop = STRATA_KCFI_STOP_NO_PROC;
    return bpf_get_stack(ctx, buf->frames + off, USTACK_BYTES, BPF_F_USER_STACK);
  }
  struct pt_regs* regs = user_regs();
  struct kcfi_state* w = &buf->kcfi;
  w->off = off;
  w->pc = BPF_CORE_READ(regs, ip);
  w->sp = BPF_CORE_READ(regs, sp);
  w->bp = BPF_CORE_READ(regs, bp);
  w->bp_known = 1;
  w->n = w->cfi_frames = w->fp_frames = w->stop = 0;
  w->last_map = STRATA_MAX_PROC_MAPPINGS; /* none */
  buf->hdr.uret_len = strata_read_uretprobes(buf->hdr.uret);
  struct kcfi_ctx c = {.buf = buf, .pm = pm};
  bpf_loop(STRATA_MAX_STACK_DEPTH, kcfi_step, &c, 0);
  __u32 stop = w->stop;
  if (stop < STRATA_KCFI_STOP_END || stop > STRATA_KCFI_STOP_MAX_DEPTH) stop = STRATA_KCFI_STOP_MAX_DEPTH;
  buf->hdr.kcfi_stop = stop;
  buf->hdr.kcfi_frames = w->cfi_frames;
  buf->hdr.kcfi_fp_frames = w->fp_frames;
  bump(STRATA_CNT_KCFI_END + stop - STRATA_KCFI_STOP_END);
  bump_by(STRATA_CNT_KCFI_FRAMES, w->cfi_frames);
  bump_by(STRATA_CNT_KCFI_FP_FRAMES, w->fp_frames);
  __u32 n = w->n;
  if (n > STRATA_MAX_STACK_DEPTH) n = STRATA_MAX_STACK_DEPTH;
  return n * sizeof(__u64);
}

/* The adaptive mode (STRATA_USTACK_BOTH): whether the kernel's frame-pointer walk can stand alone.
 * Each of its addresses (the leaf as is, return addresses one byte back: the call) must lie in an
 * executable mapping of a module the agent found to keep frame pointers; the first that does not
 * -- a frameless module, whose rbp may hold anything, or no code at all -- asks for a stack copy,
 * which the node unwinds with CFI. A process the agent has not described yet always gets a copy. */
static long fp_check_step(__u32 i, void* ctx) {
  struct kcfi_ctx* c = ctx;
  struct sample_buf* buf = c->buf;
  struct kcfi_state* w = &buf->kcfi;
  if (i >= w->n) return 1;
  __u64 at = w->off + (__u64)i * sizeof(__u64);
  if (at > KSTACK_BYTES + USTACK_BYTES - sizeof(__u64)) return 1;
  __u64 ip = *(__u64*)(buf->frames + at);
  __u64 lookup = i == 0 ? ip : ip - 1;
  __u32 cnt = c->pm->n;
  if (cnt > STRATA_MAX_PROC_MAPPINGS) cnt = STRATA_MAX_PROC_MAPPINGS;
  struct strata_exec_mapping* m = &c->pm->m[w->last_map & (STRATA_MAX_PROC_MAPPINGS - 1)];
  if (w->last_map >= cnt || lookup < m->start || lookup >= m->end) {
    w->x = lookup;
    w->lo = 0;
    w->hi = cnt;
    bpf_loop(STRATA_MAX_PROC_MAPPINGS_LOG2 + 1, kcfi_mapping_cb, c, 0);
    __u32 lo = w->lo;
    if (lo == 0 || lo > cnt) goto need_copy;
    w->last_map = lo - 1;
    m = &c->pm->m[(lo - 1) & (STRATA_MAX_PROC_MAPPINGS - 1)];
    if (lookup >= m->end) goto need_copy;
  }
  if (m->module_id != STRATA_KCFI_NO_MODULE) goto need_copy;
  return 0;
need_copy:
  w->stop = 1;
  return 1;
}

static __noinline int fp_walk_trusted(struct sample_buf* buf, __u64 off, __u64 n) {
  if (!buf || n == 0 || off > KSTACK_BYTES) return 0;
  __u32 tgid = buf->hdr.pid;
  struct strata_proc_mappings* pm = bpf_map_lookup_elem(&kcfi_procs, &tgid);
  if (!pm) return 0;
  struct kcfi_state* w = &buf->kcfi;
  w->off = off;
  w->n = n > STRATA_MAX_STACK_DEPTH ? STRATA_MAX_STACK_DEPTH : (__u32)n;
  w->stop = 0;
  w->last_map = STRATA_MAX_PROC_MAPPINGS; /* none */
  struct kcfi_ctx c = {.buf = buf, .pm = pm};
  bpf_loop(STRATA_MAX_STACK_DEPTH, fp_check_step, &c, 0);
  return w->stop == 0;
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
  buf->hdr.py_len = 0;
  buf->hdr.py_status = 0;
  buf->hdr.stack_len = 0;
  buf->hdr.uret_len = 0;
  buf->hdr.kcfi_stop = 0;
  buf->hdr.kcfi_fp_frames = 0;
  buf->hdr.kcfi_frames = 0;
  bpf_get_current_comm(buf->hdr.comm, sizeof(buf->hdr.comm));

  long kbytes = bpf_get_stack(ctx, buf->frames, KSTACK_BYTES, 0);
  if (kbytes < 0) {
    bump(STRATA_CNT_KSTACK_ERR);
    kbytes = 0;
  }
  /* Keep the verifier's bounds explicit: kbytes is in [0, KSTACK_BYTES]. */
  if (kbytes > KSTACK_BYTES) kbytes = KSTACK_BYTES;
  kbytes &= ~7L;

  long ubytes = 0;
  if (user_stack_mode == STRATA_USTACK_KERNEL_CFI)
    ubytes = kernel_cfi_walk(ctx, buf, kbytes);
  else if (user_stack_mode != STRATA_USTACK_SNAPSHOT)
    ubytes = bpf_get_stack(ctx, buf->frames + kbytes, USTACK_BYTES, BPF_F_USER_STACK);
  if (ubytes < 0) {
    bump(STRATA_CNT_USTACK_ERR);
    ubytes = 0;
  }
  if (ubytes > USTACK_BYTES) ubytes = USTACK_BYTES;

  buf->hdr.kstack_len = kbytes / sizeof(__u64);
  buf->hdr.ustack_len = ubytes / sizeof(__u64);

  __u64 off = kbytes + ubytes;
  if (off > KSTACK_BYTES + USTACK_BYTES) off = KSTACK_BYTES + USTACK_BYTES;
  __u64 pybytes = read_python(buf, off, (__u32)id);
  if (pybytes > PY_BYTES) pybytes = PY_BYTES;
  off += pybytes;
  if (off > KSTACK_BYTES + USTACK_BYTES + PY_BYTES) off = KSTACK_BYTES + USTACK_BYTES + PY_BYTES;
  if (user_stack_mode == STRATA_USTACK_SNAPSHOT)
    off += copy_user_stack(buf, off);
  else if (user_stack_mode == STRATA_USTACK_BOTH && fp_walk_trusted(buf, kbytes, ubytes / sizeof(__u64)))
    bump(STRATA_CNT_COPY_SKIPPED);
  else if (user_stack_mode == STRATA_USTACK_BOTH)
    off += copy_user_stack(buf, off);

  __u64 size = sizeof(buf->hdr) + off;
  if (size > sizeof(buf->hdr) + sizeof(buf->frames)) size = sizeof(buf->hdr) + sizeof(buf->frames);
  if (bpf_ringbuf_output(&events, buf, size, strata_rb_flags(&events)) == 0)
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
  strata_mark_target(ctgid, true);
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
  strata_mark_target(tgid, false);
  emit_proc_event(STRATA_EV_EXIT, tgid, 0, task);
  return 0;
}

/* The agent watches a process: marks it in the bitmap (the agent adds it to `targets` itself). */
SEC("syscall")
int set_target(struct strata_set_target_args* args) {
  strata_mark_target(args->tgid, args->on != 0);
  return 0;
}
