#include "agent/bpf_stats.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>

namespace strata::agent {

BpfRunTime bpf_run_time(const bpf_object* obj) {
  BpfRunTime t;
  if (!obj) return t;
  for (bpf_program* p = bpf_object__next_program(obj, nullptr); p; p = bpf_object__next_program(obj, p)) {
    int fd = bpf_program__fd(p);
    if (fd < 0) continue;  // not loaded (a tracepoint this kernel lacks)
    bpf_prog_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) continue;
    t.ns += info.run_time_ns;
    t.runs += info.run_cnt;
  }
  return t;
}

}  // namespace strata::agent
