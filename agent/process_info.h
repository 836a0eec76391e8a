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

// The process's name now (/proc/PID/comm: its main thread's, as prctl(PR_SET_NAME) last set it);
// "" when it is gone.
std::string process_comm(uint32_t pid);

// One variable of the process's environment ("" when unset or unreadable).
std::string process_env(uint32_t pid, const std::string& key);

// The agent's timeline in unix ns: CLOCK_REALTIME read once (the first call), then advanced by
// CLOCK_MONOTONIC. Every window, event and process start of a run is placed on it, so a step of
// the wall clock (NTP, `date -s`, a VM resumed) cannot bend a run: no negative or hour-long
// windows, times stay monotone, and BPF's monotonic timestamps convert with one fixed offset.
// Steps are measured (wall_clock_step_ns) and reported, not followed; a new run takes the wall
// clock again.
uint64_t unix_now_ns();
uint64_t monotonic_now_ns();
// How far CLOCK_REALTIME has moved away from the timeline since it was taken (+: ahead).
int64_t wall_clock_step_ns();
// Notices steps of the wall clock (more than 1 s away from where it was at the last look),
// looked at once per window: counted, for the run's stats and /metrics.
struct WallClockWatch {
  uint64_t steps = 0;
  int64_t offset_ns = 0;  // CLOCK_REALTIME minus the timeline at the last look
  // True when the wall clock stepped since the last look.
  bool look();
};

std::string node_name();

}  // namespace strata::agent
