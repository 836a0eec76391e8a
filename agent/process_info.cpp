#include "agent/process_info.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

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

uint64_t boot_time_unix_ns() {
  std::ifstream in("/proc/stat");
  std::string key;
  uint64_t value = 0;
  while (in >> key) {
    if (key == "btime") {
      in >> value;
      return value * 1'000'000'000ull;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

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

bool process_exists(uint32_t pid) { return pid > 0 && (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

uint64_t unix_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t monotonic_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
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
  uint64_t ticks = std::stoull(f[11]) + std::stoull(f[12]);
  return ticks * 1'000'000'000ull / static_cast<uint64_t>(hz);
}

Result<store::ProcessInfo> read_process_info(uint32_t pid, const std::string& node) {
  auto f = stat_fields(pid);
  if (f.size() < 20) return Error{"process " + std::to_string(pid) + " does not exist"};
  store::ProcessInfo p;
  p.pid = pid;
  p.node = node;
  p.ppid = static_cast<uint32_t>(std::stoul(f[1]));
  static const long hz = sysconf(_SC_CLK_TCK);
  static const uint64_t btime = boot_time_unix_ns();
  p.start_ns = btime + std::stoull(f[19]) * 1'000'000'000ull / static_cast<uint64_t>(hz);
  std::string base = "/proc/" + std::to_string(pid);
  p.comm = read_file(base + "/comm");
  while (!p.comm.empty() && p.comm.back() == '\n') p.comm.pop_back();
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
    char* end = nullptr;
    long v = std::strtol(it->second.c_str(), &end, 10);
    return (end && *end == '\0' && v >= 0 && v < (1L << 30)) ? static_cast<int>(v) : -1;
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
  return p;
}

}  // namespace strata::agent
