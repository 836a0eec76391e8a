#include "agent/os/proc_readers.h"

#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

namespace strata::agent::os {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::optional<Faults> parse_proc_stat_faults(const std::string& text) {
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream in(text.substr(close + 1));
  std::vector<std::string> f;  // f[0] is field 3 (state)
  std::string tok;
  while (f.size() < 10 && in >> tok) f.push_back(tok);
  if (f.size() < 10) return std::nullopt;
  try {
    return Faults{std::stoull(f[7]), std::stoull(f[9])};  // fields 10 and 12
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<Faults> read_faults(uint32_t pid) {
  std::string text = slurp("/proc/" + std::to_string(pid) + "/stat");
  if (text.empty()) return std::nullopt;
  return parse_proc_stat_faults(text);
}

std::set<uint64_t> socket_inodes(uint32_t pid) {
  std::set<uint64_t> out;
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char buf[64];
    ssize_t n = readlink((dir + "/" + e->d_name).c_str(), buf, sizeof(buf) - 1);
    if (n <= 0) continue;
    buf[n] = 0;
    std::string link(buf);
    if (link.rfind("socket:[", 0) == 0) out.insert(std::strtoull(link.c_str() + 8, nullptr, 10));
  }
  closedir(d);
  return out;
}

std::map<unsigned, std::string> parse_irq_names(const std::string& text) {
  std::map<unsigned, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string num = line.substr(0, colon);
    num.erase(0, num.find_first_not_of(' '));
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) continue;  // NMI, LOC, ...
    std::istringstream rest(line.substr(colon + 1));
    std::string tok, last;
    while (rest >> tok) last = tok;
    out[static_cast<unsigned>(std::stoul(num))] = last;
  }
  return out;
}

std::map<unsigned, std::string> read_irq_names() { return parse_irq_names(slurp("/proc/interrupts")); }

std::string softirq_name(unsigned vector) {
  static const char* names[] = {"HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"};
  if (vector < sizeof(names) / sizeof(names[0])) return names[vector];
  return "VEC" + std::to_string(vector);
}

}  // namespace strata::agent::os
