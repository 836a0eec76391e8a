#include "agent/os/cgroup.h"

#include <fstream>
#include <sstream>

namespace strata::agent::os {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::stringstream ss(s);
  while (std::getline(ss, part, sep)) out.push_back(part);
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The mount-relative form of a cgroup path: "/a/b" under a mount of root "/a" is "/b".
std::string under_root(const std::string& path, const std::string& root) {
  if (root.empty() || root == "/") return path;
  if (path.rfind(root, 0) != 0) return path;
  std::string rest = path.substr(root.size());
  return rest.empty() ? "/" : rest;
}

}  // namespace

std::vector<CgroupMount> parse_cgroup_mounts(const std::string& mountinfo) {
  std::vector<CgroupMount> out;
  std::istringstream in(mountinfo);
  std::string line;
  while (std::getline(in, line)) {
    // id parent major:minor root mount_point options [optional fields...] - fstype source super_options
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream head(line.substr(0, dash));
    std::string id, parent, dev, root, mp;
    head >> id >> parent >> dev >> root >> mp;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype, source, super;
    tail >> fstype >> source >> super;
    if (fstype != "cgroup" && fstype != "cgroup2") continue;
    CgroupMount m;
    m.root = root;
    m.mount_point = mp;
    m.v2 = fstype == "cgroup2";
    if (!m.v2) {
      for (const auto& opt : split(super, ',')) {
        if (opt == "rw" || opt == "ro" || opt.find('=') != std::string::npos) continue;
        m.controllers.push_back(opt);
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

ProcCgroup parse_proc_cgroup(const std::string& text) {
  ProcCgroup cg;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto c1 = line.find(':');
    auto c2 = c1 == std::string::npos ? std::string::npos : line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    std::string hier = line.substr(0, c1);
    std::string ctrls = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    if (hier == "0" && ctrls.empty()) {
      cg.v2_path = path;
      continue;
    }
    for (const auto& c : split(ctrls, ',')) {
      if (c == "cpu") cg.v1_cpu_path = path;
    }
  }
  return cg;
}

std::string cpu_stat_path(const ProcCgroup& cg, const std::vector<CgroupMount>& mounts) {
  if (!cg.v1_cpu_path.empty()) {
    for (const auto& m : mounts) {
      if (m.v2) continue;
      for (const auto& c : m.controllers) {
        if (c == "cpu") {
          std::string rel = under_root(cg.v1_cpu_path, m.root);
          return m.mount_point + (rel == "/" ? "" : rel) + "/cpu.stat";
        }
      }
    }
  }
  if (!cg.v2_path.empty()) {
    for (const auto& m : mounts) {
      if (!m.v2) continue;
      std::string rel = under_root(cg.v2_path, m.root);
      return m.mount_point + (rel == "/" ? "" : rel) + "/cpu.stat";
    }
  }
  return {};
}

CpuStat parse_cpu_stat(const std::string& text) {
  CpuStat s;
  std::istringstream in(text);
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value) {
    if (key == "nr_periods") {
      s.nr_periods = value;
    } else if (key == "nr_throttled") {
      s.nr_throttled = value;
      s.has_throttling = true;
    } else if (key == "throttled_time") {  // v1: nanoseconds
      s.throttled_us = value / 1000;
    } else if (key == "throttled_usec") {  // v2
      s.throttled_us = value;
    }
  }
  return s;
}

CgroupReader::CgroupReader() : mounts_(parse_cgroup_mounts(slurp("/proc/self/mountinfo"))) {}

Result<std::string> CgroupReader::cpu_stat_file(uint32_t pid) const {
  std::string text = slurp("/proc/" + std::to_string(pid) + "/cgroup");
  if (text.empty()) return Error{"cannot read /proc/" + std::to_string(pid) + "/cgroup (process gone?)"};
  std::string path = cpu_stat_path(parse_proc_cgroup(text), mounts_);
  if (path.empty()) return Error{"no cgroup cpu hierarchy is mounted (v1 cpu controller or cgroup2)"};
  return path;
}

Result<CpuStat> CgroupReader::read(const std::string& file) const {
  std::string text = slurp(file);
  if (text.empty()) return Error{"cannot read " + file};
  return parse_cpu_stat(text);
}

std::string CgroupReader::cgroup_of(uint32_t pid) const {
  auto cg = parse_proc_cgroup(slurp("/proc/" + std::to_string(pid) + "/cgroup"));
  for (const auto& m : mounts_) {
    if (m.v2) continue;
    for (const auto& c : m.controllers)
      if (c == "cpu" && !cg.v1_cpu_path.empty()) return cg.v1_cpu_path;
  }
  return cg.v2_path;
}

}  // namespace strata::agent::os
