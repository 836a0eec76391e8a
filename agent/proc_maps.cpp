#include "agent/proc_maps.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace strata::agent {

std::vector<Mapping> parse_proc_maps(std::string_view text) {
  std::vector<Mapping> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string line(text.substr(pos, eol - pos));
    pos = eol + 1;
    // start-end perms offset dev inode [path]
    std::istringstream ss(line);
    std::string range, perms, offset, dev;
    uint64_t inode = 0;
    if (!(ss >> range >> perms >> offset >> dev >> inode)) continue;
    auto dash = range.find('-');
    if (dash == std::string::npos || perms.size() < 4) continue;
    Mapping m;
    char* end = nullptr;
    m.start = std::strtoull(range.c_str(), &end, 16);
    m.end = std::strtoull(range.c_str() + dash + 1, &end, 16);
    m.file_offset = std::strtoull(offset.c_str(), &end, 16);
    m.inode = inode;
    m.executable = perms[2] == 'x';
    std::string rest;
    std::getline(ss, rest);
    auto first = rest.find_first_not_of(' ');
    if (first != std::string::npos) m.path = rest.substr(first);
    if (m.end > m.start) out.push_back(std::move(m));
  }
  return out;
}

Result<std::vector<Mapping>> read_proc_maps(uint32_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  if (!in) return Error{"cannot read /proc/" + std::to_string(pid) + "/maps (process gone?)"};
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_proc_maps(ss.str());
}

const Mapping* find_mapping(const std::vector<Mapping>& maps, uint64_t addr) {
  auto it = std::upper_bound(maps.begin(), maps.end(), addr,
                             [](uint64_t a, const Mapping& m) { return a < m.start; });
  if (it == maps.begin()) return nullptr;
  --it;
  return addr < it->end ? &*it : nullptr;
}

}  // namespace strata::agent
