// Least privilege for the agent: once its BPF programs are loaded, perf events opened and the store
// open, and before any thread starts, `strata record` and `strata agent` give up every capability
// they no longer need.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace strata::agent {

// What is kept, and why (tried on Linux 6.x: recording, late uprobe attach, Python frames):
//  CAP_BPF          map updates (targets, Python offsets), uprobe links made while recording
//  CAP_PERFMON      perf events and uprobes attached while recording (a library dlopen'ed late)
//  CAP_SYS_PTRACE   /proc/PID/mem, maps, environ of processes of other users or with more
//                   capabilities than the agent (Python code objects, GPU timelines)
//  CAP_DAC_READ_SEARCH  reading mapped files through /proc/PID/root (containers, 0700 dirs)
//  CAP_SYSLOG       kernel addresses in /proc/kallsyms (kernel frames are symbolized at the end)
// Kernels older than 5.8 have no CAP_BPF / CAP_PERFMON: CAP_SYS_ADMIN is kept there instead.
std::vector<int> runtime_capabilities();

struct PrivilegeDrop {
  uint64_t kept = 0;     // effective set after the drop (bit per capability)
  uint64_t dropped = 0;  // what was effective before and is gone now
};

// Reduces the permitted, effective and bounding sets to runtime_capabilities() (those held now),
// clears the inheritable and ambient sets, so nothing executed later regains them. Capabilities
// belong to a thread: this changes the calling thread's, and threads it starts afterwards inherit
// them, so call it before the process starts any thread (NodePipeline does; `strata record` forks
// its command before, which then runs as it would without strata). Does nothing (kept = 0) when
// the process holds no capabilities. STRATA_KEEP_CAPABILITIES=1 skips the drop (debugging a kernel
// that needs more).
Result<PrivilegeDrop> drop_to_runtime_capabilities();

// The effective capabilities of this process, as names ("cap_bpf,cap_perfmon,...").
std::string effective_capability_names();
std::string capability_names(uint64_t bits);

}  // namespace strata::agent
