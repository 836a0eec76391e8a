#include "agent/process_info.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "agent/container_identity.h"
#include "common/parse.h"

namespace strata::agent {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Fields of /proc/PID/stat after the comm, which may itself hold spaces and parentheses.
std::vector<std::string> stat_fields(uint32_t pid) {
  std::string s = read_file("/proc/" + std::to_string(pid) + "/stat");
  auto close = s.rfind(')');
  std::vector<std::string> f;
  if (close == std::string::npos) return f;
  std::istringstream ss(s.substr(close + 2));
  std::string tok;
  while (ss >> tok) f.push_back(tok);
  return f;  // f[0] is field 3 (state)
}

uint64_t clock_ns(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The moment of boot on the agent's timeline (unix_now_ns): /proc/PID/stat's start times count
// from it, on CLOCK_BOOTTIME. Not /proc/stat's btime: the kernel moves that with every step of
// the wall clock, and it has whole seconds only.
uint64_t boot_time_unix_ns() { return unix_now_ns() - clock_ns(CLOCK_BOOTTIME); }

}  // namespace

std::string process_env(uint32_t pid, const std::string& key) {
  std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
  std::string prefix = key + "=";
  size_t pos = 0;
  while (pos < env.size()) {
    size_t end = env.find('\0', pos);
    if (end == std::string::npos) end = env.size();
    if (env.compare(pos, prefix.size(), prefix) == 0) return env.substr(pos + prefix.size(), end - pos - prefix.size());
    pos = end + 1;
  }
  return "";
}

std::string process_comm(uint32_t pid) {
  std::string comm = read_file("/proc/" + std::to_string(pid) + "/comm");
  while (!comm.empty() && comm.back() == '\n') comm.pop_back();
  return comm;
}

bool process_exists(uint32_t pid) { return pid > 0 && (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

// CLOCK_REALTIME once, then CLOCK_MONOTONIC: see process_info.h.
uint64_t unix_now_ns() {
  static const uint64_t offset = clock_ns(CLOCK_REALTIME) - clock_ns(CLOCK_MONOTONIC);
  return clock_ns(CLOCK_MONOTONIC) + offset;
}

uint64_t monotonic_now_ns() { return clock_ns(CLOCK_MONOTONIC); }

int64_t wall_clock_step_ns() {
  uint64_t timeline = unix_now_ns();
  return static_cast<int64_t>(clock_ns(CLOCK_REALTIME) - timeline);
}

bool WallClockWatch::look() {
  int64_t now = wall_clock_step_ns();
  int64_t moved = now - offset_ns;
  offset_ns = now;
  if (moved > -1'000'000'000 && moved < 1'000'000'000) return false;  // NTP slews; it does not step
  steps++;
  return true;
}

std::string node_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

std::optional<uint64_t> process_cpu_ns(uint32_t pid) {
  auto f = stat_fields(pid);
  if (f.size() < 13) return std::nullopt;
  // utime and stime are fields 14 and 15 (f[11], f[12]), in clock ticks.
  static const long hz = sysconf(_SC_CLK_TCK);
  auto utime = parse_int<uint64_t>(f[11]), stime = parse_int<uint64_t>(f[12]);
  if (!utime || !stime) return std::nullopt;
  return (*utime + *stime) * 1'000'000'000ull / static_cast<uint64_t>(hz);
}

Result<store::ProcessInfo> read_process_info(uint32_t pid, const std::string& node) {
  auto f = stat_fields(pid);
  if (f.size() < 20) return Error{"process " + std::to_string(pid) + " does not exist"};
  store::ProcessInfo p;
  p.pid = pid;
  p.node = node;
  auto ppid = parse_int<uint32_t>(f[1]);
  auto start_ticks = parse_int<uint64_t>(f[19]);
  if (!ppid || !start_ticks) return Error{"process " + std::to_string(pid) + ": unreadable /proc/PID/stat"};
  p.ppid = *ppid;
  static const long hz = sysconf(_SC_CLK_TCK);
  static const uint64_t btime = boot_time_unix_ns();
  p.start_ns = btime + *start_ticks * 1'000'000'000ull / static_cast<uint64_t>(hz);
  std::string base = "/proc/" + std::to_string(pid);
  p.comm = process_comm(pid);
  std::string cmdline = read_file(base + "/cmdline");
  for (char& c : cmdline) if (c == '\0') c = ' ';
  while (!cmdline.empty() && cmdline.back() == ' ') cmdline.pop_back();
  p.command = cmdline.empty() ? "[" + p.comm + "]" : cmdline;

  std::map<std::string, std::string> env;
  std::string environ = read_file(base + "/environ");
  size_t pos = 0;
  while (pos < environ.size()) {
    size_t end = environ.find('\0', pos);
    if (end == std::string::npos) end = environ.size();
    std::string kv = environ.substr(pos, end - pos);
    pos = end + 1;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  auto num = [&](const char* key) {
    auto it = env.find(key);
    if (it == env.end()) return -1;
    auto v = parse_int<int>(it->second);
    return (v && *v >= 0 && *v < (1 << 30)) ? *v : -1;
  };
  p.rank = num("RANK");
  p.local_rank = num("LOCAL_RANK");
  p.world_size = num("WORLD_SIZE");
  if (env.count("STRATA_JOB")) {
    p.job = env["STRATA_JOB"];
  } else if (env.count("TORCHELASTIC_RUN_ID")) {
    p.job = env["TORCHELASTIC_RUN_ID"];
  } else if (p.rank >= 0 && env.count("MASTER_ADDR")) {
    p.job = env["MASTER_ADDR"] + ":" + env["MASTER_PORT"];
  }
  ContainerIdentity id = parse_cgroup_identity(read_file(base + "/cgroup"));
  add_env_identity(env, id);
  p.pod_uid = id.pod_uid;
  p.container_id = id.container_id;
  p.pod_name = id.pod_name;
  p.pod_namespace = id.pod_namespace;
  return p;
}

}  // namespace strata::agent
