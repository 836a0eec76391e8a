/* Map helpers shared by the BPF programs. */
#ifndef STRATA_MAPS_BPF_H
#define STRATA_MAPS_BPF_H

/* The value of `key` in hash `map`, created from the zeroes in `zero` (a one-entry per-CPU array of
 * the value type: values like struct strata_sched_stats are too big for the BPF stack) when absent.
 * NULL when the map is full; *full is set then, for the caller's counter. */
static __always_inline void* strata_lookup_or_init(void* map, const void* key, void* zero, bool* full) {
  void* v = bpf_map_lookup_elem(map, key);
  if (v) return v;
  __u32 idx = 0;
  void* z = bpf_map_lookup_elem(zero, &idx);
  if (!z) return 0;
  if (bpf_map_update_elem(map, key, z, BPF_NOEXIST) != 0) *full = true;
  return bpf_map_lookup_elem(map, key);
}

#endif /* STRATA_MAPS_BPF_H */
