/* Kernel <-> user layout of the on-CPU sampler and process tracker (bpf/oncpu.bpf.c).
 * Plain structs, no logic; included by the BPF program (with vmlinux.h) and by C++.
 * Bump STRATA_ONCPU_ABI_VERSION on any change: the agent checks it against the program's rodata. */
#ifndef STRATA_ABI_ONCPU_H
#define STRATA_ABI_ONCPU_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define STRATA_ONCPU_ABI_VERSION 4
#define STRATA_MAX_STACK_DEPTH 127 /* PERF_MAX_STACK_DEPTH */
#define STRATA_COMM_LEN 16
#define STRATA_BUILD_ID_LEN 20
#define STRATA_STACK_SNAPSHOT_MAX 16384 /* bytes of user stack copied per sample, at most */
#define STRATA_MAX_PY_FRAMES 128
#define STRATA_PY_NO_FIELD 0xffff   /* a field the version does not have */
#define STRATA_PY_FRAME_READ 128    /* bytes of one interpreter frame read at once */
#define STRATA_MAX_URETPROBES 4     /* pending uretprobe returns reported per stack copy */
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
  STRATA_CNT__COUNT,
};

/* What user stack the sampler captures (rodata `user_stack_mode`). */
enum strata_user_stack_mode {
  STRATA_USTACK_FP = 0,        /* frame-pointer walk in the kernel, build id + offset per frame */
  STRATA_USTACK_SNAPSHOT = 1,  /* copy of the stack top + rip/rsp/rbp, unwound on the node */
  STRATA_USTACK_BOTH = 2,      /* both: the kernel's walk is the fallback for processes gone meanwhile */
};

/* sample flags */
#define STRATA_SAMPLE_HAS_REGS 1u  /* regs and the stack snapshot are valid */

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
  __u32 _pad2;
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
