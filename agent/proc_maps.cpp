#include "agent/proc_maps.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/parse.h"

namespace strata::agent {

namespace {
// The next space-separated field of `line` from `pos` (spaces before it skipped).
std::string_view next_field(std::string_view line, size_t& pos) {
  while (pos < line.size() && line[pos] == ' ') ++pos;
  size_t b = pos;
  while (pos < line.size() && line[pos] != ' ') ++pos;
  return line.substr(b, pos - b);
}
}  // namespace

// Split by hand, without streams: a PyTorch rank's maps are thousands of lines, read again when it
// maps something new.
std::vector<Mapping> parse_proc_maps(std::string_view text) {
  std::vector<Mapping> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    // start-end perms offset dev inode [path]
    size_t at = 0;
    std::string_view range = next_field(line, at), perms = next_field(line, at), offset = next_field(line, at),
                     dev = next_field(line, at), ino = next_field(line, at);
    auto dash = range.find('-');
    if (dash == std::string_view::npos || perms.size() < 4) continue;
    auto start = parse_int<uint64_t>(range.substr(0, dash), 16);
    auto end = parse_int<uint64_t>(range.substr(dash + 1), 16);
    auto off = parse_int<uint64_t>(offset, 16);
    auto colon = dev.find(':');
    auto dev_major = parse_int<unsigned>(dev.substr(0, colon), 16);
    auto dev_minor = colon == std::string_view::npos ? std::nullopt : parse_int<unsigned>(dev.substr(colon + 1), 16);
    auto inode = parse_int<uint64_t>(ino);
    if (!start || !end || !off || !dev_major || !dev_minor || !inode) continue;
    Mapping m;
    m.start = *start;
    m.end = *end;
    m.file_offset = *off;
    m.dev = makedev(*dev_major, *dev_minor);
    m.inode = *inode;
    m.executable = perms[2] == 'x';
    while (at < line.size() && line[at] == ' ') ++at;
    if (at < line.size()) m.path = std::string(line.substr(at));
    if (m.end > m.start) out.push_back(std::move(m));
  }
  return out;
}

Result<std::vector<Mapping>> read_proc_maps(uint32_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/maps";
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error{"cannot read " + path + " (process gone?)"};
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t r = read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    text.append(buf, static_cast<size_t>(r));
  }
  close(fd);
  return parse_proc_maps(text);
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

size_t valid_frame_chain(const std::vector<Mapping>& maps, const uint64_t* ips, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint64_t lookup = i == 0 ? ips[i] : ips[i] - 1;
    const Mapping* m = ips[i] ? find_mapping(maps, lookup) : nullptr;
    if (!m || !m->executable) return i == 0 ? 1 : i;
  }
  return n;
}

// A token bucket kept as one time per process (GCRA): `due` holds when the process's next re-read
// would be due at its rate; up to kMapsRereadBurst may come at once after a quiet spell.
bool MapsRereadLimiter::allow(uint32_t pid, uint64_t now_ns) {
  auto [it, first] = state_.try_emplace(pid, State{now_ns, kMapsRereadIntervalNs});
  uint64_t due = std::max(it->second.due, now_ns);
  // The burst's slack is in base intervals whatever the process's own interval is now.
  if (due - now_ns > (kMapsRereadBurst - 1) * kMapsRereadIntervalNs) {
    refused_++;
    return false;
  }
  it->second.due = due + it->second.interval;
  rereads_++;
  return true;
}

void MapsRereadLimiter::note(uint32_t pid, bool learned_code) {
  auto it = state_.find(pid);
  if (it == state_.end()) return;
  it->second.interval = learned_code ? kMapsRereadIntervalNs
                                     : std::min(2 * it->second.interval, kMapsRereadMaxIntervalNs);
}

}  // namespace strata::agent
