/* Pending uretprobe returns of the current thread (abi/oncpu.h, struct strata_uret): a stack copy
 * taken while a uretprobed function runs holds the kernel's trampoline address where its return
 * address was; these let the node put the real one back. Innermost first. */
#ifndef STRATA_URET_BPF_H
#define STRATA_URET_BPF_H

static __always_inline __u32 strata_read_uretprobes(struct strata_uret* out) {
  struct task_struct* t = bpf_get_current_task_btf();
  if (!bpf_core_field_exists(t->utask)) return 0;
  struct uprobe_task* ut = BPF_CORE_READ(t, utask);
  if (!ut) return 0;
  struct return_instance* ri = BPF_CORE_READ(ut, return_instances);
  __u32 n = 0;
  for (int i = 0; i < STRATA_MAX_URETPROBES; i++) {
    if (!ri) break;
    out[i].ret = BPF_CORE_READ(ri, orig_ret_vaddr);
    out[i].slot = BPF_CORE_READ(ri, stack);
    n = i + 1;
    ri = BPF_CORE_READ(ri, next);
  }
  return n;
}

#endif /* STRATA_URET_BPF_H */
