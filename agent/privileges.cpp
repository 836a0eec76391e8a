#include "agent/privileges.h"

#include <linux/capability.h>
#include <sys/prctl.h>

#include <cstdlib>

#include "common/capabilities.h"

namespace strata::agent {

std::vector<int> runtime_capabilities() {
  // CAP_SYSLOG: /proc/kallsyms shows kernel addresses only with it (unless perf_event_paranoid <= 1),
  // and kernel frames are symbolized after start-up.
  std::vector<int> keep = {CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_SYSLOG};
  if (caps::last_cap() >= 39) {  // CAP_PERFMON (38) and CAP_BPF (39) exist since Linux 5.8
    keep.push_back(38);
    keep.push_back(39);
  } else {
    keep.push_back(CAP_SYS_ADMIN);
  }
  return keep;
}

std::string capability_names(uint64_t bits) { return caps::names(bits); }

std::string effective_capability_names() {
  auto c = caps::get();
  return c ? caps::names(c->effective) : "unknown";
}

Result<PrivilegeDrop> drop_to_runtime_capabilities() {
  auto now = caps::get();
  if (!now) return now.error();
  PrivilegeDrop out;
  const char* keep_all = std::getenv("STRATA_KEEP_CAPABILITIES");
  if (now->permitted == 0 || (keep_all && std::string(keep_all) == "1")) {
    out.kept = now->effective;
    return out;
  }
  uint64_t want = 0;
  for (int c : runtime_capabilities()) want |= uint64_t{1} << c;
  // The bounding set first: dropping from it needs CAP_SETPCAP, which the capset below gives up.
  if (auto st = caps::drop_bounding_except(want); !st) return st.error();
  (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
  caps::Sets next;
  next.permitted = now->permitted & want;
  next.effective = now->effective & want;
  if (auto st = caps::set(next); !st) return st.error();
  out.kept = next.effective;
  out.dropped = now->effective & ~next.effective;
  return out;
}

}  // namespace strata::agent
