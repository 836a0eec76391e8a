/* Log-linear histogram buckets shared by the OS-layer programs (agent/os/histogram.h is the user
 * side): values below 4 get their own bucket; above, each power of two is split into
 * STRATA_HIST_SUB = 4 buckets, so a percentile read from it is within 25% of the truth. */
#ifndef STRATA_HIST_BPF_H
#define STRATA_HIST_BPF_H

#include "abi/offcpu.h"

static __always_inline __u32 strata_log2(__u64 v) {
  __u32 r, shift;
  r = (v > 0xFFFFFFFFull) << 5;
  v >>= r;
  shift = (v > 0xFFFF) << 4;
  v >>= shift;
  r |= shift;
  shift = (v > 0xFF) << 3;
  v >>= shift;
  r |= shift;
  shift = (v > 0xF) << 2;
  v >>= shift;
  r |= shift;
  shift = (v > 0x3) << 1;
  v >>= shift;
  r |= shift;
  r |= (v >> 1);
  return r;
}

static __always_inline __u32 strata_hist_bucket(__u64 v) {
  if (v < 4) return (__u32)v;
  __u32 e = strata_log2(v);
  __u32 sub = (__u32)(v >> (e - 2)) & 3;
  __u32 b = 4 + (e - 2) * 4 + sub;
  return b < STRATA_HIST_BUCKETS ? b : STRATA_HIST_BUCKETS - 1;
}

/* Counts one duration of ns nanoseconds in hist, bucketed in microseconds. hist is shared between
 * CPUs (a map value), hence the atomic add. Callers include <bpf/bpf_helpers.h> (barrier_var). */
static __always_inline void strata_hist_add(__u64 hist[STRATA_HIST_BUCKETS], __u64 ns) {
  __u32 b = strata_hist_bucket(ns / 1000);
  barrier_var(b); /* keep the mask: the verifier needs a bound it can see */
  b &= STRATA_HIST_BUCKETS - 1;
  __sync_fetch_and_add(&hist[b], 1);
}

#endif /* STRATA_HIST_BPF_H */
