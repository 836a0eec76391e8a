/* The watched processes as a bitmap by tgid, beside the `targets` hash: sched_switch asks "is this
 * thread watched?" twice per context switch on every CPU, and an array word is a load where a hash
 * lookup is a hash and a bucket walk (most switches on a busy node are not the job's). The hash stays
 * the list the agent reads and sizes; this is its fast mirror. Bits are set and cleared only by BPF,
 * atomically: by fork/exit tracking and by set_target (a "syscall" program the agent runs), so a
 * word two writers share never loses a bit. */
#ifndef STRATA_TARGETS_BPF_H
#define STRATA_TARGETS_BPF_H

#include "abi/oncpu.h" /* STRATA_TARGET_BITMAP_WORDS */

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, STRATA_TARGET_BITMAP_WORDS);
  __type(key, __u32);
  __type(value, __u64);
} target_bits SEC(".maps");

static __always_inline bool strata_is_target(__u32 tgid) {
  __u32 w = tgid >> 6;
  __u64* word = bpf_map_lookup_elem(&target_bits, &w);
  return word && ((*word >> (tgid & 63)) & 1);
}

static __always_inline void strata_mark_target(__u32 tgid, bool on) {
  __u32 w = tgid >> 6;
  __u64* word = bpf_map_lookup_elem(&target_bits, &w);
  if (!word) return;
  __u64 bit = 1ull << (tgid & 63);
  if (on)
    __sync_fetch_and_or(word, bit);
  else
    __sync_fetch_and_and(word, ~bit);
}

#endif /* STRATA_TARGETS_BPF_H */
