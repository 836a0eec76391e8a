#include "agent/proc_maps.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/parse.h"

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
    auto start = parse_int<uint64_t>(std::string_view(range).substr(0, dash), 16);
    auto end = parse_int<uint64_t>(std::string_view(range).substr(dash + 1), 16);
    auto off = parse_int<uint64_t>(offset, 16);
    auto colon = dev.find(':');
    auto dev_major = parse_int<unsigned>(std::string_view(dev).substr(0, colon), 16);
    auto dev_minor = colon == std::string::npos ? std::nullopt : parse_int<unsigned>(std::string_view(dev).substr(colon + 1), 16);
    if (!start || !end || !off || !dev_major || !dev_minor) continue;
    Mapping m;
    m.start = *start;
    m.end = *end;
    m.file_offset = *off;
    m.dev = makedev(*dev_major, *dev_minor);
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

MappedFile::~MappedFile() {
  if (fd_ >= 0) close(fd_);
}

namespace {
// Opens `path` when it is a regular file with the mapping's device and inode.
std::optional<MappedFile> open_if_same(const std::string& path, const Mapping& m) {
  // O_NONBLOCK: a FIFO put at the path cannot hold the open.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return std::nullopt;
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != m.dev || st.st_ino != m.inode) {
    close(fd);
    return std::nullopt;
  }
  FileIdentity id{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
                  static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
  return std::optional<MappedFile>(std::in_place, fd, id);
}
}  // namespace

Result<MappedFile> open_mapped_file(uint32_t pid, const Mapping& m) {
  if (m.path.empty() || m.path[0] != '/') return Error{"mapping has no file"};
  std::string proc = "/proc/" + std::to_string(pid);
  if (auto f = open_if_same(proc + "/root" + m.path, m)) return std::move(*f);
  char range[64];
  std::snprintf(range, sizeof range, "/map_files/%llx-%llx", static_cast<unsigned long long>(m.start),
                static_cast<unsigned long long>(m.end));
  if (auto f = open_if_same(proc + range, m)) return std::move(*f);
  // The process is gone (no /proc entry): the path as the agent sees it, if it is the same file.
  if (auto f = open_if_same(m.path, m)) return std::move(*f);
  return Error{proc + "/root" + m.path + ": not the file process " + std::to_string(pid) +
               " maps there (replaced, gone, or out of reach)"};
}

const Mapping* find_mapping(const std::vector<Mapping>& maps, uint64_t addr) {
  auto it = std::upper_bound(maps.begin(), maps.end(), addr,
                             [](uint64_t a, const Mapping& m) { return a < m.start; });
  if (it == maps.begin()) return nullptr;
  --it;
  return addr < it->end ? &*it : nullptr;
}

}  // namespace strata::agent
