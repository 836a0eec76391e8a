// What /proc says about a process: identity (pid, start time), command, and its place in a training
// job (RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID / STRATA_JOB from its environment).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/result.h"
#include "store/store.h"

namespace strata::agent {

Result<store::ProcessInfo> read_process_info(uint32_t pid, const std::string& node);

// user + system CPU time of a process so far, in nanoseconds (all its threads).
std::optional<uint64_t> process_cpu_ns(uint32_t pid);

bool process_exists(uint32_t pid);

// One variable of the process's environment ("" when unset or unreadable).
std::string process_env(uint32_t pid, const std::string& key);

// Wall clock (unix ns) and CLOCK_MONOTONIC (ns), for converting BPF timestamps.
uint64_t unix_now_ns();
uint64_t monotonic_now_ns();

std::string node_name();

}  // namespace strata::agent
