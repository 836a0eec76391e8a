/* strata's GPU timeline: device work records (what CUPTI activity records give on a real GPU),
 * written by strata's CUPTI injection library on real GPUs and by the testbed's libcudart stand-in.
 *
 * Where (the rendezvous): each writing process creates <dir>/<pid>.timeline, <pid> as the process
 * itself sees it (getpid(), so inside its own pid namespace), <dir> being $STRATA_TIMELINE_DIR
 * of the writer, else STRATA_TIMELINE_DEFAULT_DIR (/run/strata/timeline), inside the writer's own
 * mount namespace. The agent looks in the same <dir> (its own $STRATA_TIMELINE_DIR, else the
 * default: the target's environment never names where a root process reads), through
 * /proc/<pid>/root. /run/strata/timeline is created by root (the agent at start, `strata record`,
 * or a root writer) with mode 01777 like /tmp: anyone may create a file, nobody may replace
 * another user's. The agent accepts a file only when (it refuses everything else, and says why):
 *   - no component of the path is a symbolic link, and the directory is owned by root or the
 *     target's uid and, when others may write into it, sticky;
 *   - the file is a regular file owned by root or the target's uid (fstat of the opened file);
 *   - its header is valid (below), names the expected pid, and its start_ns is not before that
 *     process started (else an earlier process with the same pid left it).
 * A container gets the rendezvous by mounting the host's /run/strata/timeline (or any directory,
 * named to both sides by STRATA_TIMELINE_DIR) at the same path.
 * The file outlives its writer (its last records may not have been read yet): the reader that
 * watched the process removes it after its last read, if the name still holds the file it read.
 *
 * One file per process; the writer appends one record per piece of device work when it finishes
 * (kernels, memcpy, memset, NCCL collectives). The agent follows the ring by copying it out with
 * pread (never a shared mapping: a writer that truncates its file cannot fault the reader).
 *
 * Plain C, no logic beyond inline helpers: the agent includes this header as is.
 *
 * Layout (little endian, all offsets fixed):
 *   [0, 4096)                   struct strata_timeline_header
 *   [4096 + i * record_size)    struct strata_timeline_record, slot i of `capacity` slots
 *
 * Protocol: one writer per file (the process serializes its stream workers), any number of readers.
 *   writer, for record number n (0-based):  slot = n % capacity
 *     1. store slot.seq = 0                   (release)  -- record being rewritten
 *     2. write every other field of the slot
 *     3. store slot.seq = n + 1               (release)  -- record complete
 *     4. store header.write_index = n + 1     (release)
 *   reader: the header is read and checked once, when the file is opened; afterwards only
 *   write_index is read again, and it is not trusted (it may jump or go back). w = write_index;
 *   copy slots of records [max(last, w - capacity), w); w2 = write_index again; keep the copy of
 *   record n only if its seq == n + 1 and either n + capacity > w2 (the writer had not reached
 *   record n + capacity, which reuses the slot, while we copied) or n + capacity == w2 and the
 *   slot's seq, read again after the copy, is still n + 1 (record w2 not begun); every other one
 *   is counted lost.
 * A reader that falls more than `capacity` records behind loses the oldest ones, like a CUPTI
 * buffer overflow; it can tell how many from the indices.
 */
#ifndef STRATA_ABI_GPU_TIMELINE_H
#define STRATA_ABI_GPU_TIMELINE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STRATA_TIMELINE_MAGIC 0x454e494c454d4954ull /* "TIMELINE" */
#define STRATA_TIMELINE_VERSION 1u
#define STRATA_TIMELINE_HEADER_SIZE 4096u
#define STRATA_TIMELINE_DEFAULT_CAPACITY 16384u /* records; 4 MiB per process */
#define STRATA_TIMELINE_NAME_LEN 96u
#define STRATA_TIMELINE_DIR_ENV "STRATA_TIMELINE_DIR"         /* moves the rendezvous, both sides */
#define STRATA_TIMELINE_DEFAULT_DIR "/run/strata/timeline"   /* the rendezvous otherwise */

/* What kind of device work a record describes (CUPTI_ACTIVITY_KIND_* analogues). */
enum strata_timeline_kind {
  STRATA_TL_KERNEL = 1,     /* cudaLaunchKernel */
  STRATA_TL_MEMCPY = 2,     /* cudaMemcpy[Async]; `bytes` set, `copy_kind` = cudaMemcpyKind */
  STRATA_TL_MEMSET = 3,     /* cudaMemset[Async]; `bytes` set */
  STRATA_TL_COLLECTIVE = 4, /* an NCCL kernel (collective or p2p); `bytes` = payload of the call */
};

struct strata_timeline_header {
  uint64_t magic;          /* STRATA_TIMELINE_MAGIC */
  uint32_t version;        /* STRATA_TIMELINE_VERSION; readers refuse other versions */
  uint32_t header_size;    /* STRATA_TIMELINE_HEADER_SIZE */
  uint32_t record_size;    /* sizeof(struct strata_timeline_record) */
  uint32_t capacity;       /* number of record slots */
  int32_t pid;             /* writer process */
  uint32_t clock_id;       /* CLOCK_MONOTONIC (1): every *_ns field uses it */
  uint64_t write_index;    /* records ever written; see protocol above */
  uint64_t start_ns;       /* when the writer created the file */
  uint8_t reserved[STRATA_TIMELINE_HEADER_SIZE - 48];
};

struct strata_timeline_record {
  uint64_t seq;            /* n + 1 when slot holds record n; 0 while being written */
  uint32_t kind;           /* enum strata_timeline_kind */
  int32_t device;          /* device ordinal (cudaSetDevice) */
  uint64_t start_ns;       /* work started on the device */
  uint64_t end_ns;         /* work finished on the device */
  uint64_t api_ns;         /* host thread called the API (cudaLaunchKernel, ncclAllReduce, ...) */
  uint64_t correlation_id; /* per-process counter, increasing in API call order, starts at 1 */
  uint64_t func;           /* kernels: the host stub address passed as `func` (symbolize it through
                              the owning module's .dynsym); collectives: the ncclDevKernel_* stub */
  uint64_t stream;         /* the cudaStream_t value the API got (0 = legacy default stream) */
  uint64_t bytes;          /* memcpy/memset/collective payload bytes; 0 for kernels */
  uint64_t grid_threads;   /* kernels: gridDim * blockDim thread count */
  int32_t api_tid;         /* host thread id that called the API */
  uint32_t copy_kind;      /* memcpy: enum cudaMemcpyKind value */
  char name[STRATA_TIMELINE_NAME_LEN]; /* short display name, NUL-terminated (may be truncated);
                                          the exact name is the symbol of `func` */
};

#ifdef __cplusplus
static_assert(sizeof(struct strata_timeline_header) == STRATA_TIMELINE_HEADER_SIZE, "header layout");
static_assert(sizeof(struct strata_timeline_record) == 184, "record layout");
}
#endif

#endif /* STRATA_ABI_GPU_TIMELINE_H */
