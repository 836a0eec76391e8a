// Linux capabilities of this process, through the raw capget/capset syscalls (no libcap): what the
// agent narrows to after start-up and what `strata serve` gives up entirely.
#pragma once

#include <cstdint>
#include <string>

#include "common/result.h"

namespace strata::caps {

struct Sets {
  uint64_t effective = 0, permitted = 0, inheritable = 0;  // bit N: capability N
};

Result<Sets> get();
Status set(const Sets& s);
// The highest capability number this kernel knows (/proc/sys/kernel/cap_last_cap).
int last_cap();
// Drops every capability outside `keep` from the bounding set (needs CAP_SETPCAP: call before set()).
Status drop_bounding_except(uint64_t keep);
// "cap_bpf,cap_perfmon" (or "none").
std::string names(uint64_t bits);

// For processes that need no privilege at all (`strata serve`): with `user`, switch to that user
// (groups, gid, uid); in every case clear all capabilities and set no_new_privs, so nothing this
// process runs later can gain any. Returns what was done, for the log.
Result<std::string> drop_all_privileges(const std::string& user);

}  // namespace strata::caps
