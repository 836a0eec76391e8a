// What a loaded BPF object's programs have cost so far, from the kernel's BPF statistics (run time
// and run count per program; counted while some process holds bpf_enable_stats(BPF_STATS_RUN_TIME),
// as every live source does).
#pragma once

#include <cstdint>

struct bpf_object;

namespace strata::agent {

struct BpfRunTime {
  uint64_t ns = 0;
  uint64_t runs = 0;
};

// Summed over the object's loaded programs; a program the kernel cannot describe counts 0.
BpfRunTime bpf_run_time(const bpf_object* obj);

}  // namespace strata::agent
