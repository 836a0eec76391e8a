#include "agent/gpu/timeline_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <sstream>

#include "common/parse.h"

namespace strata::agent {
namespace {

constexpr size_t kRecordSize = sizeof(strata_timeline_record);
constexpr off_t kWriteIndexOffset = offsetof(strata_timeline_header, write_index);
// A timeline made this long before its process started is an earlier process's: the process start
// is known to a clock tick (10 ms) and read through two clocks; a pid is not reused within a
// second on any real node.
constexpr int64_t kStaleSlackNs = 1'000'000'000;

int64_t clock_ns(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Records copied per pread: 46 KB of buffer, a few syscalls for a busy GPU's poll interval.
constexpr uint64_t kChunkRecords = 256;

// An owned file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) close(fd_);
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_;
};

// Reads exactly `n` bytes at `off`; false on a short read (the file shrank) or an error.
bool pread_all(int fd, void* buf, size_t n, off_t off) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    ssize_t got = pread(fd, p, n, off);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    off += got;
  }
  return true;
}

bool owner_ok(uid_t file_uid, uid_t owner) { return file_uid == 0 || file_uid == owner; }

// Walks `dir` (absolute, or relative to `base`) one directory at a time without following any
// symbolic link, so neither the target nor another user can point the agent elsewhere with one.
Result<Fd> open_dir_nofollow(int base, const std::string& dir) {
  Fd cur(openat(base, dir.starts_with('/') ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (cur.get() < 0) return Error::from_errno("cannot open the root of " + dir, errno);
  std::stringstream parts(dir);
  std::string part;
  while (std::getline(parts, part, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") return Error{dir + ": '..' is not allowed in a timeline directory (refused)"};
    Fd next(openat(cur.get(), part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (next.get() < 0) {
      int e = errno;
      if (e == ENOTDIR || e == ELOOP)
        return Error{dir + ": '" + part + "' is a symbolic link or not a directory (refused)"};
      return Error::from_errno("cannot open " + dir, e);
    }
    cur = std::move(next);
  }
  return cur;
}

// The directory holding a timeline: the target's or root's, and sticky if others may write in it
// (else another user could rename the target's file away and put theirs in its place).
Status check_dir(int dirfd, const std::string& shown, uid_t owner) {
  struct stat st {};
  if (fstat(dirfd, &st) != 0) return Error::from_errno("cannot stat " + shown, errno);
  if (!owner_ok(st.st_uid, owner))
    return Error{shown + ": owned by uid " + std::to_string(st.st_uid) + ", not root or " +
                 std::to_string(owner) + " (refused)"};
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
    return Error{shown + ": writable by others and not sticky (refused)"};
  return {};
}

class FileTimeline final : public GpuTimingSource {
 public:
  FileTimeline(Fd fd, uint32_t capacity, Fd dir, std::string name)
      : fd_(std::move(fd)), capacity_(capacity), dir_(std::move(dir)), name_(std::move(name)) {}

  bool remove_file() override {
    struct stat mine {}, there {};
    if (dir_.get() < 0 || fstat(fd_.get(), &mine) != 0 ||
        fstatat(dir_.get(), name_.c_str(), &there, AT_SYMLINK_NOFOLLOW) != 0)
      return false;
    if (mine.st_dev != there.st_dev || mine.st_ino != there.st_ino) return false;
    return unlinkat(dir_.get(), name_.c_str(), 0) == 0;
  }

  std::vector<TimelineRecord> read_new(uint64_t& lost) override {
    std::vector<TimelineRecord> out;
    uint64_t w = 0;
    if (!read_index(w)) return out;  // shrunk below its header: nothing more to read
    if (w < next_) {
      // The index went back: not what a writer following the protocol does. Follow it from
      // there rather than trust anything about the records in between.
      next_ = w;
      return out;
    }
    uint64_t from = next_;
    uint64_t behind = std::min<uint64_t>(capacity_, kMaxTimelineRecordsPerRead);
    if (w - from > behind) {
      lost += (w - behind) - from;
      from = w - behind;
    }
    out.reserve(w - from);  // at most kMaxTimelineRecordsPerRead
    names_.clear();
    std::vector<strata_timeline_record> buf;
    for (uint64_t a = from; a < w;) {
      // One contiguous run of slots: up to the chunk size, not across the end of the ring.
      uint64_t slot = a % capacity_;
      uint64_t n = std::min({w - a, kChunkRecords, capacity_ - slot});
      buf.resize(n);
      if (!pread_all(fd_.get(), buf.data(), n * kRecordSize,
                     static_cast<off_t>(STRATA_TIMELINE_HEADER_SIZE + slot * kRecordSize))) {
        lost += w - a;  // truncated under us: what is gone is lost, the agent goes on
        break;
      }
      uint64_t w2 = 0;
      if (!read_index(w2)) {
        lost += w - a;
        break;
      }
      for (uint64_t i = 0; i < n; ++i) {
        uint64_t rec = a + i;
        // Keep it only if complete and not reused while we copied (the protocol in the ABI): record
        // rec + capacity takes its slot, and may have been in progress when the index read w2. An
        // index that went back meanwhile is no protocol at all. (rec < w <= w2: no overflow.)
        bool kept_still =
            w2 >= w && (w2 - rec < capacity_ || (w2 - rec == capacity_ && seq_still(slot + i, rec)));
        if (buf[i].seq != rec + 1 || !kept_still || !valid(buf[i])) {
          ++lost;
          continue;
        }
        out.push_back(to_record(buf[i]));
      }
      a += n;
    }
    // The names, end to end in names_ (each ended by a NUL), for the records in order: viewed
    // only now, as names_ may have moved while it grew.
    size_t at = 0;
    for (auto& r : out) {
      r.name = std::string_view(names_.data() + at);
      at += r.name.size() + 1;
    }
    next_ = w;
    return out;
  }

 private:
  bool read_index(uint64_t& w) {
    if (!pread_all(fd_.get(), &w, sizeof w, kWriteIndexOffset)) return false;
    std::atomic_thread_fence(std::memory_order_acquire);  // later copies after this read
    return true;
  }

  // The slot still holds record `rec` (read after the copy): the writer marks a slot it starts
  // rewriting before it touches the rest, so the copy taken before this read is whole.
  bool seq_still(uint64_t slot, uint64_t rec) {
    uint64_t seq = 0;
    off_t off = static_cast<off_t>(STRATA_TIMELINE_HEADER_SIZE + slot * kRecordSize +
                                   offsetof(strata_timeline_record, seq));
    return pread_all(fd_.get(), &seq, sizeof seq, off) && seq == rec + 1;
  }

  static bool valid(const strata_timeline_record& r) {
    return r.kind >= STRATA_TL_KERNEL && r.kind <= STRATA_TL_COLLECTIVE && r.device >= 0 &&
           r.device < kMaxTimelineDevice;
  }

  // The record, its name added to names_ (read_new views it there).
  TimelineRecord to_record(strata_timeline_record& c) {
    TimelineRecord r;
    r.kind = c.kind;
    r.device = c.device;
    r.start_ns = c.start_ns;
    r.end_ns = c.end_ns;
    r.api_ns = c.api_ns;
    r.correlation = c.correlation_id;
    r.func = c.func;
    r.stream = c.stream;
    r.bytes = c.bytes;
    r.api_tid = c.api_tid;
    c.name[STRATA_TIMELINE_NAME_LEN - 1] = '\0';
    names_.append(c.name, std::strlen(c.name) + 1);  // with its NUL
    return r;
  }

  Fd fd_;
  uint64_t capacity_;  // from the header, read once when opened
  uint64_t next_ = 0;
  std::string names_;  // the last read's record names (TimelineRecord::name views them)
  Fd dir_;             // the rendezvous it was opened in, and its name there (remove_file)
  std::string name_;
};

// Opens `name` in `dirfd` as a timeline of a process of uid `owner` (or root's).
// `started_mono_ns` (0: unknown) is when the process started (CLOCK_MONOTONIC): a file whose writer
// made it before that was left by an earlier process that had the same pid.
Result<std::unique_ptr<GpuTimingSource>> open_timeline_at(int dirfd, const std::string& name,
                                                          const std::string& shown, uid_t owner,
                                                          uint32_t expect_pid, int64_t started_mono_ns = 0) {
  // O_NOFOLLOW: a symbolic link (to /etc/shadow, say) is refused; O_NONBLOCK: a FIFO or a device
  // cannot hold the open; both before anything is read.
  Fd fd(openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (fd.get() < 0) {
    int e = errno;
    if (e == ELOOP) return Error{shown + ": a symbolic link (refused)"};
    return Error::from_errno("cannot open GPU timeline " + shown, e);
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return Error::from_errno("cannot stat " + shown, errno);
  if (!S_ISREG(st.st_mode)) return Error{shown + ": not a regular file (refused)"};
  if (!owner_ok(st.st_uid, owner))
    return Error{shown + ": owned by uid " + std::to_string(st.st_uid) + ", not root or " +
                 std::to_string(owner) + " (refused)"};
  // A writer makes its file with one name; a second link is someone else's file linked in.
  if (st.st_nlink != 1) return Error{shown + ": has " + std::to_string(st.st_nlink) + " links (refused)"};
  strata_timeline_header h{};
  if (!pread_all(fd.get(), &h, sizeof h, 0))
    return Error{shown + ": not a GPU timeline (too short; refused)"};
  // The header is checked once, on this copy; the reader keeps what it needs of it.
  if (h.magic != STRATA_TIMELINE_MAGIC || h.version != STRATA_TIMELINE_VERSION ||
      h.header_size != STRATA_TIMELINE_HEADER_SIZE || h.record_size != kRecordSize)
    return Error{shown + ": not a GPU timeline of version " + std::to_string(STRATA_TIMELINE_VERSION) +
                 " (refused)"};
  if (h.capacity == 0 || h.capacity > kMaxTimelineCapacity)
    return Error{shown + ": capacity " + std::to_string(h.capacity) + " out of range 1.." +
                 std::to_string(kMaxTimelineCapacity) + " (refused)"};
  if (STRATA_TIMELINE_HEADER_SIZE + uint64_t{h.capacity} * kRecordSize > static_cast<uint64_t>(st.st_size))
    return Error{shown + ": shorter than its capacity says (refused)"};
  if (expect_pid != 0 && h.pid != static_cast<int32_t>(expect_pid))
    return Error{shown + ": written by pid " + std::to_string(h.pid) + ", not " + std::to_string(expect_pid) +
                 " (refused)"};
  // The writer's own word on when it made the file: only its own data is at stake if it lies.
  if (started_mono_ns != 0 && static_cast<int64_t>(h.start_ns) < started_mono_ns - kStaleSlackNs)
    return Error{shown + ": made before process " + std::to_string(expect_pid) +
                 " started (left by an earlier process with its pid; refused)"};
  // The directory stays open for remove_file(): once the process is gone, /proc/PID/root is too.
  Fd dir(fcntl(dirfd, F_DUPFD_CLOEXEC, 0));
  return std::unique_ptr<GpuTimingSource>(std::make_unique<FileTimeline>(std::move(fd), h.capacity, std::move(dir), name));
}

// "Name:\tvalue..." of /proc/PID/status, the fields after the name.
std::vector<std::string> status_fields(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(key + ":")) continue;
    std::istringstream fields(line.substr(key.size() + 1));
    std::vector<std::string> out;
    for (std::string f; fields >> f;) out.push_back(f);
    return out;
  }
  return {};
}

}  // namespace

bool timeline_refused(const Error& e) { return e.message.find("refused)") != std::string::npos; }

std::string timeline_rendezvous_dir() {
  const char* env = std::getenv(STRATA_TIMELINE_DIR_ENV);
  return (env && *env) ? env : STRATA_TIMELINE_DEFAULT_DIR;
}

Status prepare_timeline_rendezvous() {
  const char* env = std::getenv(STRATA_TIMELINE_DIR_ENV);
  if ((env && *env) || geteuid() != 0) return {};
  const std::string dir = STRATA_TIMELINE_DEFAULT_DIR;
  const std::string parent = dir.substr(0, dir.rfind('/'));
  if (mkdir(parent.c_str(), 0755) != 0 && errno != EEXIST)
    return Error::from_errno("cannot create " + parent, errno);
  if (mkdir(dir.c_str(), 0700) == 0) {
    // Created private, then opened up: the mode is exact whatever the umask.
    if (chmod(dir.c_str(), 01777) != 0) return Error::from_errno("cannot set the mode of " + dir, errno);
    return {};
  }
  if (errno != EEXIST) return Error::from_errno("cannot create " + dir, errno);
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) return Error::from_errno("cannot stat " + dir, errno);
  if (!S_ISDIR(st.st_mode) || st.st_uid != 0)
    return Error{dir + " exists but is not a directory of root's: GPU timelines found there are refused"};
  return {};
}

std::optional<TimelineTarget> timeline_target_of(uint32_t pid) {
  std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream in(proc + "/status");
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  TimelineTarget t;
  t.pid = pid;
  auto uid = status_fields(text.str(), "Uid");
  auto real = uid.empty() ? std::nullopt : parse_int<uid_t>(uid[0]);
  if (!real) return std::nullopt;
  t.uid = *real;
  // NSpid lists the pid in each namespace, innermost last: the name the process gives its file.
  auto ns = status_fields(text.str(), "NSpid");
  auto inner = ns.empty() ? std::nullopt : parse_int<uint32_t>(ns.back());
  t.ns_pid = inner ? *inner : pid;
  struct stat mine {
  }, theirs{};
  // Its start (field 22 of /proc/PID/stat, clock ticks since boot) on CLOCK_MONOTONIC, the clock of
  // the header's start_ns (not the wall clock: a step of it must not make a file look old).
  // Read through the stream, not an istreambuf_iterator: a process that exits between the open and
  // the read makes read(2) fail (ESRCH), which the iterator throws out of (an "internal error" that
  // ended `strata record` under a job whose helpers exit fast) and the stream only marks as failed.
  std::ifstream stat_in(proc + "/stat");
  std::stringstream stat_buf;
  stat_buf << stat_in.rdbuf();
  const std::string stat_text = stat_buf.str();
  if (auto close = stat_text.rfind(')'); close != std::string::npos) {
    std::istringstream fields(stat_text.substr(close + 1));
    std::string f;
    for (int i = 3; i <= 22 && fields >> f; ++i) {
      if (i != 22) continue;
      static const long hz = sysconf(_SC_CLK_TCK);
      if (auto ticks = parse_int<uint64_t>(f); ticks && hz > 0) {
        int64_t since_boot = static_cast<int64_t>(*ticks * 1'000'000'000ull / static_cast<uint64_t>(hz));
        t.started_mono_ns = clock_ns(CLOCK_MONOTONIC) - (clock_ns(CLOCK_BOOTTIME) - since_boot);
      }
    }
  }
  t.host_root = stat("/", &mine) == 0 && stat((proc + "/root").c_str(), &theirs) == 0 &&
                mine.st_dev == theirs.st_dev && mine.st_ino == theirs.st_ino;
  return t;
}

Result<std::unique_ptr<GpuTimingSource>> open_timeline_for(const TimelineTarget& t, const std::string& dir) {
  if (!dir.starts_with('/')) return Error{"the GPU timeline directory must be absolute: " + dir};
  std::string name = std::to_string(t.ns_pid) + ".timeline";
  std::string proc_root = "/proc/" + std::to_string(t.pid) + "/root";
  // Through the process's root: a process in a container writes inside its own file system.
  Fd root(open(proc_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  std::string shown = proc_root + dir + "/" + name;
  if (root.get() < 0) {
    // Gone already; its file is still where the agent can see it only if it shared our root.
    if (!t.host_root)
      return Error{"no GPU timeline for process " + std::to_string(t.pid) + " (it has exited)"};
    root = Fd(open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
    shown = dir + "/" + name;
  }
  auto d = open_dir_nofollow(root.get(), dir.substr(1));
  if (!d) return d.error();
  if (auto st = check_dir(d->get(), shown.substr(0, shown.rfind('/')), t.uid); !st) return st.error();
  return open_timeline_at(d->get(), name, shown, t.uid, t.ns_pid, t.started_mono_ns);
}

Result<std::unique_ptr<GpuTimingSource>> open_timeline_for(const TimelineTarget& t) {
  return open_timeline_for(t, timeline_rendezvous_dir());
}

Result<std::unique_ptr<GpuTimingSource>> open_timeline_file(const std::string& path, uid_t owner,
                                                            uint32_t expect_pid) {
  auto slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  auto d = open_dir_nofollow(AT_FDCWD, dir);
  if (!d) return d.error();
  if (auto st = check_dir(d->get(), dir, owner); !st) return st.error();
  return open_timeline_at(d->get(), name, path, owner, expect_pid);
}

Result<std::unique_ptr<GpuTimingSource>> open_timeline_file(const std::string& path) {
  return open_timeline_file(path, geteuid());
}

}  // namespace strata::agent
