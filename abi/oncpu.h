/* Kernel <-> user layout of the on-CPU sampler and process tracker (bpf/oncpu.bpf.c).
 * Plain structs, no logic; included by the BPF program (with vmlinux.h) and by C++.
 * Bump STRATA_ONCPU_ABI_VERSION on any change: the agent checks it against the program's rodata. */
#ifndef STRATA_ABI_ONCPU_H
#define STRATA_ABI_ONCPU_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define STRATA_ONCPU_ABI_VERSION 6
#define STRATA_MAX_STACK_DEPTH 127 /* PERF_MAX_STACK_DEPTH */
#define STRATA_COMM_LEN 16
#define STRATA_BUILD_ID_LEN 20
#define STRATA_STACK_SNAPSHOT_MAX 16384 /* bytes of user stack copied per sample, at most */
/* ... by the on-CPU sampler: a CPython 3.11 rank importing torch is deeper than 16 KiB (nested
 * imports each add a few C frames of the eval loop); with 16 KiB, 16% of a DDP job's samples ended
 * short of the thread's start (issue 15). 24 KiB is what the per-CPU scratch allows (a per-CPU map
 * value is at most 32 KiB, and the sample's other sections take ~4.5 KiB). The off-CPU pool keeps
 * the size above. */
#define STRATA_ONCPU_SNAPSHOT_MAX 24576
#define STRATA_MAX_PY_FRAMES 128
#define STRATA_PY_NO_FIELD 0xffff   /* a field the version does not have */
#define STRATA_PY_FRAME_READ 128    /* bytes of one interpreter frame read at once */
#define STRATA_MAX_URETPROBES 4     /* pending uretprobe returns reported per stack copy */
/* Executable mappings per process the kernel CFI walk knows (a power of two: indexes are masked).
 * A PyTorch rank maps 314 (Debian's python3-torch, gloo): 128 left 74% of one rank's samples a lone
 * [unknown] frame. 1024 is 32 KiB a process; more are dropped, counted (kernel_mappings_dropped). */
#define STRATA_MAX_PROC_MAPPINGS 1024
#define STRATA_MAX_PROC_MAPPINGS_LOG2 10
#define STRATA_KCFI_NO_MODULE 0xffffffffu /* strata_exec_mapping.module_id: no tables (frame pointers) */
#define STRATA_KCFI_NO_TABLE 0xfffffffeu  /* ... neither frame pointers nor tables (table budget spent): stop */
#define STRATA_TARGET_BITMAP_WORDS 65536 /* bits for every tgid below PID_MAX_LIMIT (4194304) */

/* The argument of the "syscall" program set_target (run by the agent with BPF_PROG_TEST_RUN). */
struct strata_set_target_args {
  __u32 tgid;
  __u32 on;
};

/* A return address a uretprobe replaced with the kernel's trampoline: `slot` is where on the user
 * stack it was (rsp at the probed function's entry), `ret` what it was. A stack copy holds the
 * trampoline address there, which would end a CFI walk at "[uprobes]"; the node puts `ret` back.
 * (The kernel does the same for its own frame-pointer walk.) */
struct strata_uret {
  __u64 ret;
  __u64 slot;
};

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
  STRATA_CNT_SNAPSHOT_ERR,    /* user stack could not be copied */
  STRATA_CNT_PY_SAMPLES,      /* samples of a process known to run CPython */
  STRATA_CNT_PY_NO_THREAD,    /* no thread state for the sampled thread (not a Python thread, or gone) */
  STRATA_CNT_PY_READ_ERR,     /* interpreter memory could not be read */
  STRATA_CNT_PY_TRUNCATED,    /* more Python frames than STRATA_MAX_PY_FRAMES */
  /* The kernel CFI walk (STRATA_USTACK_KERNEL_CFI): samples it walked, and why each walk stopped. */
  STRATA_CNT_KCFI_WALKS,
  STRATA_CNT_KCFI_END,        /* reached the outermost frame: the chain is whole */
  STRATA_CNT_KCFI_NO_PROC,    /* no mappings for the process yet: the kernel's frame-pointer walk instead */
  STRATA_CNT_KCFI_NO_MAPPING, /* an address outside the known executable mappings (dlopen, JIT) */
  STRATA_CNT_KCFI_NO_ROW,     /* a module with tables but no row for the address */
  STRATA_CNT_KCFI_BAD_FRAME,  /* rbp unknown where needed, or a frame that does not move up */
  STRATA_CNT_KCFI_READ_ERR,   /* the return address or saved rbp could not be read */
  STRATA_CNT_KCFI_MAX_DEPTH,  /* STRATA_MAX_STACK_DEPTH frames */
  STRATA_CNT_KCFI_FRAMES,     /* frames stepped with CFI rows */
  STRATA_CNT_KCFI_FP_FRAMES,  /* frames stepped with frame pointers (modules without tables) */
  /* The adaptive mode (STRATA_USTACK_BOTH): samples whose frame-pointer walk stayed in modules that
   * keep frame pointers, sent without a stack copy. */
  STRATA_CNT_COPY_SKIPPED,
  STRATA_CNT__COUNT,
};

/* What user stack the sampler captures (rodata `user_stack_mode`). */
enum strata_user_stack_mode {
  STRATA_USTACK_FP = 0,        /* frame-pointer walk in the kernel, build id + offset per frame */
  STRATA_USTACK_SNAPSHOT = 1,  /* copy of the stack top + rip/rsp/rbp, unwound on the node */
  STRATA_USTACK_BOTH = 2,      /* adaptive (the default): the kernel's frame-pointer walk, and a stack
                                  copy only when that walk enters a module the agent did not find to
                                  keep frame pointers (per module, in `kcfi_procs`: module_id
                                  STRATA_KCFI_NO_MODULE) or a process it has not described yet */
  STRATA_USTACK_KERNEL_CFI = 3, /* CFI walk in the kernel from the agent's compact tables (below),
                                   frame pointers for modules without tables; no stack copy */
};

/* Why a kernel CFI walk stopped (strata_sample.kcfi_stop; 0 when there was no such walk). */
enum strata_kcfi_stop {
  STRATA_KCFI_STOP_NONE = 0,
  STRATA_KCFI_STOP_END = 1,
  STRATA_KCFI_STOP_NO_PROC = 2,
  STRATA_KCFI_STOP_NO_MAPPING = 3,  /* the agent re-reads the process's maps (dlopen) */
  STRATA_KCFI_STOP_NO_ROW = 4,
  STRATA_KCFI_STOP_BAD_FRAME = 5,
  STRATA_KCFI_STOP_READ_ERR = 6,
  STRATA_KCFI_STOP_MAX_DEPTH = 7,
};

/* One row of a module's compact unwind table (the same 12 bytes as unwind::UnwindRow): from `pc`
 * (ELF virtual address) up to the next row's pc, CFA = (rsp or rbp) + cfa_offset, the return
 * address at CFA-8, the caller's rbp unchanged or saved at CFA + rbp_offset. Rows of all modules
 * live in one array map (`kcfi_rows`); `kcfi_modules[module id]` says where a module's begin. */
#define STRATA_KCFI_CFA_INVALID 0  /* no CFI here: stop */
#define STRATA_KCFI_CFA_RSP 1
#define STRATA_KCFI_CFA_RBP 2
#define STRATA_KCFI_CFA_PLT 3      /* CFA = rsp + 8 + ((rip & 15) >= 11 ? 8 : 0) */
#define STRATA_KCFI_CFA_END 4      /* the outermost frame */
#define STRATA_KCFI_RBP_SAME 0
#define STRATA_KCFI_RBP_OFFSET 1
#define STRATA_KCFI_RBP_UNKNOWN 2
struct strata_unwind_row {
  __u32 pc;
  __s32 cfa_offset;
  __s16 rbp_offset;
  __u8 cfa_rule;
  __u8 rbp_rule;
};

struct strata_kcfi_module {
  __u32 first; /* index of the module's first row in kcfi_rows */
  __u32 count;
  /* A page index narrows the row search to a few rows: kcfi_pages[page_first + p] is the last row
   * that starts at or below the start of page base_page + p (4 KiB pages of ELF addresses).
   * page_count 0: no index (the search covers all the module's rows). */
  __u32 page_first;
  __u32 page_count;
  __u32 base_page;
  __u32 _pad;
};

/* One executable mapping: ELF virtual address = process address - bias. */
struct strata_exec_mapping {
  __u64 start, end;
  __u64 bias;
  __u32 module_id; /* STRATA_KCFI_NO_MODULE: walk with frame pointers */
  __u32 _pad;
};

/* A process's executable mappings, sorted by start (map `kcfi_procs`, by tgid): the kernel CFI walk's
 * (mode 3), and in the adaptive mode (2) which modules keep frame pointers (STRATA_KCFI_NO_MODULE;
 * any other id: a copy is needed). */
struct strata_proc_mappings {
  __u32 n;
  __u32 _pad;
  struct strata_exec_mapping m[STRATA_MAX_PROC_MAPPINGS];
};

/* sample flags */
#define STRATA_SAMPLE_HAS_REGS 1u  /* regs and the stack snapshot are valid */
#define STRATA_SAMPLE_KERNEL_CFI 2u  /* the user stack is the kernel's CFI walk (kcfi_* below) */

/* One Python frame as the kernel reads it: the code object's address and where in it. */
struct strata_py_frame {
  __u64 code;   /* PyCodeObject* */
  __u32 lasti;  /* instruction index (code units) */
  __u32 flags;  /* STRATA_PY_FRAME_* */
};
#define STRATA_PY_FRAME_ENTRY 1u  /* the first frame a C call of the eval loop ran: a splice point */

/* One sample: header, then kstack_len kernel addresses (__u64), then ustack_len user addresses
 * (__u64; the node normalizes them to build id + file offset through /proc/PID/maps: asking the
 * kernel for build ids cost ~5 us per sample, more than the rest of the program; was: struct
 * bpf_stack_build_id: build id + file offset, or a raw ip when the kernel could not read
 * the build id), then py_len struct strata_py_frame, then stack_len bytes of user stack starting at
 * stack_base. Stacks are leaf first. */
struct strata_sample {
  __u32 type; /* STRATA_EV_SAMPLE */
  __u32 pid;  /* tgid */
  __u32 tid;
  __u32 cpu;
  __u64 ts_ns; /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
  char comm[STRATA_COMM_LEN];
  __u16 kstack_len;
  __u16 ustack_len;
  __u32 flags;      /* STRATA_SAMPLE_* */
  __u16 py_len;
  __u16 py_status;  /* 0: no Python; 1: frames read; 2: no thread state; 3: read error */
  __u32 stack_len;  /* bytes of stack snapshot */
  __u64 ip, sp, bp; /* user registers at the sample */
  __u64 stack_base; /* address of the first snapshot byte */
  __u32 uret_len;   /* entries of uret in use, innermost first */
  __u8 kcfi_stop;   /* enum strata_kcfi_stop */
  __u8 kcfi_fp_frames; /* frames of the kernel walk stepped with frame pointers */
  __u16 kcfi_frames; /* frames of the kernel walk stepped with CFI rows (the rest: frame pointers) */
  struct strata_uret uret[STRATA_MAX_URETPROBES];
};

/* Where a CPython version keeps what the frame walk needs; the agent fills one per process after
 * recognizing the interpreter in its mappings (map `py_procs`, by tgid). Offsets in bytes. */
struct strata_py_offsets {
  __u64 runtime_addr;              /* &_PyRuntime in the process */
  __u16 minor;                     /* 3.minor */
  __u16 runtime_interpreters_head; /* _PyRuntime.interpreters.head */
  __u16 interp_threads_head;       /* PyInterpreterState.threads.head (3.10: tstate_head) */
  __u16 tstate_next;
  __u16 tstate_native_thread_id;   /* NO_FIELD before 3.11: then thread_id == pthread_self == fsbase */
  __u16 tstate_thread_id;
  __u16 tstate_frame;              /* 3.10: frame; 3.11/3.12: cframe; 3.13: current_frame */
  __u16 cframe_current_frame;      /* 3.11/3.12; NO_FIELD when tstate_frame is the frame itself */
  __u16 frame_previous;            /* 3.10: f_back */
  __u16 frame_code;                /* f_code / f_executable */
  __u16 frame_instr;               /* 3.10: f_lasti (int); later: prev_instr / instr_ptr */
  __u16 frame_is_entry;            /* 3.11 */
  __u16 frame_owner;               /* 3.12+: FRAME_OWNED_BY_CSTACK marks the eval loop's shim */
  __u16 code_adaptive;             /* 3.11+: first instruction in the code object */
  __u16 _pad[2];
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
