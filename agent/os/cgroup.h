// CPU throttling of a process's cgroup, cgroup v1 or v2: which cpu.stat file belongs to a process
// (from /proc/PID/cgroup and the mount table), and what it says. Parsers take text so tests need
// no cgroups.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace strata::agent::os {

struct CgroupMount {
  std::string root;         // the subtree of the hierarchy mounted here ("/" usually)
  std::string mount_point;  // "/sys/fs/cgroup/cpu,cpuacct"
  bool v2 = false;
  std::vector<std::string> controllers;  // v1: from the super options ("cpu", "cpuacct", ...)
};

// cgroup and cgroup2 mounts from /proc/self/mountinfo text.
std::vector<CgroupMount> parse_cgroup_mounts(const std::string& mountinfo);

struct ProcCgroup {
  std::string v1_cpu_path;  // path in the v1 hierarchy that has the cpu controller; empty if none
  std::string v2_path;      // path in the unified hierarchy ("0::/x"); empty if none
};

// /proc/PID/cgroup text.
ProcCgroup parse_proc_cgroup(const std::string& text);

// The cpu.stat that accounts throttling for the process: the v1 cpu hierarchy when the cpu controller
// is mounted there, else the unified hierarchy. Empty when neither is mounted.
std::string cpu_stat_path(const ProcCgroup& cg, const std::vector<CgroupMount>& mounts);

struct CpuStat {
  uint64_t nr_periods = 0;
  uint64_t nr_throttled = 0;
  uint64_t throttled_us = 0;  // v1 throttled_time (ns) / 1000, or v2 throttled_usec
  bool has_throttling = false;  // the file had nr_throttled (v2 without the cpu controller has not)
};

CpuStat parse_cpu_stat(const std::string& text);

// Live: reads the files above for a pid. The mount table is read once.
class CgroupReader {
 public:
  CgroupReader();
  // The cpu.stat path of pid's cgroup, or an error saying why there is none.
  Result<std::string> cpu_stat_file(uint32_t pid) const;
  Result<CpuStat> read(const std::string& cpu_stat_file) const;
  // The cgroup path (as in /proc/PID/cgroup) that cpu_stat_file() chose, for labels.
  std::string cgroup_of(uint32_t pid) const;

 private:
  std::vector<CgroupMount> mounts_;
};

}  // namespace strata::agent::os
