// /proc/PID/maps, parsed: which file backs which address range of a process.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/result.h"

namespace strata::agent {

struct Mapping {
  uint64_t start = 0;
  uint64_t end = 0;
  uint64_t file_offset = 0;
  uint64_t dev = 0;    // st_dev of the mapped file (makedev of the maps line's major:minor)
  uint64_t inode = 0;  // st_ino of the mapped file
  bool executable = false;
  std::string path;  // empty for anonymous memory; "[vdso]" and the like for special mappings
};

std::vector<Mapping> parse_proc_maps(std::string_view text);
Result<std::vector<Mapping>> read_proc_maps(uint32_t pid);

// A file as an open descriptor knows it: what tells two files of one path apart (two containers'
// builds of /usr/lib/libfoo.so) and a file replaced under its path (new inode, size or time).
struct FileIdentity {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

// A file a process maps, opened for reading and checked to be the mapped file itself: the
// device and inode of the maps line, not whatever the path names now. Closed with the object;
// path() names the open descriptor, for code that opens by path, while this object lives.
class MappedFile {
 public:
  MappedFile(int fd, const FileIdentity& id) : fd_(fd), id_(id) {}
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept : fd_(o.fd_), id_(o.id_) { o.fd_ = -1; }
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;
  int fd() const { return fd_; }
  const FileIdentity& identity() const { return id_; }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
  FileIdentity id_;
};

// Opens the file of mapping `m` of process `pid`: through /proc/PID/root + path (so a file in the
// process's container), else /proc/PID/map_files (the mapped file itself; needs CAP_SYS_ADMIN or
// CAP_CHECKPOINT_RESTORE), else the path in the agent's own root. Refused unless it is a regular file with the mapping's device and inode:
// a file swapped under the path (or a link out of the container) is not read as the mapped one.
Result<MappedFile> open_mapped_file(uint32_t pid, const Mapping& m);

// The mapping containing addr, if any (maps are sorted by start, as the kernel lists them).
const Mapping* find_mapping(const std::vector<Mapping>& maps, uint64_t addr);

// How many frames of a frame-pointer chain (leaf first: the sampled ip, then return addresses) to
// keep: the chain is cut before the first return address that is not in an executable mapping.
// The kernel's walk (bpf_get_stack) follows rbp wherever it points; code built without frame
// pointers keeps data there (gloo's event loop keeps `this`), and the walk then reads heap words
// as return addresses -- the same heap address 127 times, or addresses that are not code. A real
// return address is always in code, so the first one that is not ends what can be trusted. The
// call is one byte before the return address (what is looked up); the leaf is looked up as is.
// A leaf outside any executable mapping keeps only itself (it is where the thread was).
size_t valid_frame_chain(const std::vector<Mapping>& maps, const uint64_t* ips, size_t n);

// When a process's maps may be read again (an address in no known mapping: a library loaded since,
// a heap grown): at a bounded rate per process (kMapsRereadIntervalNs, bursts of kMapsRereadBurst),
// for its whole life -- a count over its life (the old cap of 64) left a long-lived process with
// stale maps for good. Pure (the caller passes the time), so tests drive it without clocks.
class MapsRereadLimiter {
 public:
  // 200 ms: a process that maps something every instant (a JIT, an importing interpreter) costs at
  // most five reads of its maps a second (a few hundred microseconds each for ~300 mappings), and
  // a sample in a new library waits at most that long to be named.
  static constexpr uint64_t kMapsRereadIntervalNs = 200'000'000;
  // Libraries come in bursts (an import dlopens one, then its dependencies, within milliseconds):
  // eight re-reads at once after a quiet spell name each of them in the first samples that meet
  // them, and keep the long-run rate above.
  static constexpr uint64_t kMapsRereadBurst = 8;
  // A re-read that found no new code doubles that process's interval, up to 30 s; one that found
  // code sets it back. A process whose samples carry addresses that no mapping will ever hold
  // (frame-pointer chains through code built without them: every rank of a Debian PyTorch job)
  // would else have its maps read five times a second for ever, and a PyTorch rank's thousands of
  // mappings cost milliseconds a read: most of the agent's CPU on such a job. 30 s: a library
  // loaded after a long quiet spell is named within half a minute.
  static constexpr uint64_t kMapsRereadMaxIntervalNs = 30'000'000'000;
  // True (and noted) when `pid` may be read again at `now_ns`.
  bool allow(uint32_t pid, uint64_t now_ns);
  // What the last re-read of `pid` found: new code or not.
  void note(uint32_t pid, bool learned_code);
  void forget(uint32_t pid) { state_.erase(pid); }
  size_t processes() const { return state_.size(); }
  uint64_t rereads() const { return rereads_; }
  uint64_t refused() const { return refused_; }
  uint64_t interval_ns(uint32_t pid) const {
    auto it = state_.find(pid);
    return it != state_.end() ? it->second.interval : kMapsRereadIntervalNs;
  }

 private:
  struct State {
    uint64_t due = 0;
    uint64_t interval = kMapsRereadIntervalNs;
  };
  std::unordered_map<uint32_t, State> state_;
  uint64_t rereads_ = 0, refused_ = 0;
};

}  // namespace strata::agent
