/* Ring-buffer wake-ups in batches: a sample does not wake the agent (it drains a few times a
 * second), unless the buffer is filling up. One wake-up per sample cost more agent CPU than the
 * samples themselves. */
#ifndef STRATA_RINGBUF_BPF_H
#define STRATA_RINGBUF_BPF_H

static __always_inline __u64 strata_rb_flags(void* ringbuf) {
  __u64 avail = bpf_ringbuf_query(ringbuf, BPF_RB_AVAIL_DATA);
  __u64 size = bpf_ringbuf_query(ringbuf, BPF_RB_RING_SIZE);
  return avail > size / 4 ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP;
}

#endif /* STRATA_RINGBUF_BPF_H */
