#include "agent/gpu/timeline_reader.h"

#include "agent/process_info.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace strata::agent {
namespace {

class MappedTimeline final : public GpuTimingSource {
 public:
  MappedTimeline(void* base, size_t size) : base_(static_cast<uint8_t*>(base)), size_(size) {}
  ~MappedTimeline() override { munmap(base_, size_); }

  const strata_timeline_header* header() const { return reinterpret_cast<const strata_timeline_header*>(base_); }

  std::vector<TimelineRecord> read_new(uint64_t& lost) override {
    std::vector<TimelineRecord> out;
    const auto* h = header();
    uint64_t w = std::atomic_ref<const uint64_t>(h->write_index).load(std::memory_order_acquire);
    uint64_t cap = h->capacity;
    uint64_t from = next_;
    if (w > cap && from < w - cap) {
      lost += (w - cap) - from;
      from = w - cap;
    }
    for (uint64_t n = from; n < w; ++n) {
      const auto* slot = reinterpret_cast<const strata_timeline_record*>(
          base_ + STRATA_TIMELINE_HEADER_SIZE + (n % cap) * h->record_size);
      uint64_t s1 = std::atomic_ref<const uint64_t>(slot->seq).load(std::memory_order_acquire);
      strata_timeline_record copy;
      std::memcpy(&copy, slot, sizeof copy);
      uint64_t s2 = std::atomic_ref<const uint64_t>(slot->seq).load(std::memory_order_acquire);
      if (s1 != n + 1 || s2 != n + 1) {  // lapped by the writer while we read
        ++lost;
        continue;
      }
      TimelineRecord r;
      r.kind = copy.kind;
      r.device = copy.device;
      r.start_ns = copy.start_ns;
      r.end_ns = copy.end_ns;
      r.api_ns = copy.api_ns;
      r.correlation = copy.correlation_id;
      r.func = copy.func;
      r.stream = copy.stream;
      r.bytes = copy.bytes;
      r.api_tid = copy.api_tid;
      copy.name[STRATA_TIMELINE_NAME_LEN - 1] = '\0';
      r.name = copy.name;
      out.push_back(std::move(r));
    }
    next_ = w;
    return out;
  }

 private:
  uint8_t* base_;
  size_t size_;
  uint64_t next_ = 0;
};

}  // namespace

Result<std::unique_ptr<GpuTimingSource>> open_timeline_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error::from_errno("cannot open GPU timeline " + path, errno);
  struct stat st{};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < STRATA_TIMELINE_HEADER_SIZE) {
    close(fd);
    return Error{path + ": not a GPU timeline (too short)"};
  }
  void* base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return Error::from_errno("cannot map " + path, errno);
  auto t = std::make_unique<MappedTimeline>(base, static_cast<size_t>(st.st_size));
  const auto* h = t->header();
  // Check the layout before trusting any index in it.
  if (h->magic != STRATA_TIMELINE_MAGIC || h->version != STRATA_TIMELINE_VERSION ||
      h->header_size != STRATA_TIMELINE_HEADER_SIZE || h->record_size != sizeof(strata_timeline_record) ||
      h->capacity == 0 ||
      STRATA_TIMELINE_HEADER_SIZE + static_cast<uint64_t>(h->capacity) * h->record_size >
          static_cast<uint64_t>(st.st_size)) {
    return Error{path + ": not a GPU timeline of version " + std::to_string(STRATA_TIMELINE_VERSION)};
  }
  return std::unique_ptr<GpuTimingSource>(std::move(t));
}

std::vector<std::string> timeline_dirs_of(uint32_t pid) {
  std::vector<std::string> dirs;
  for (const char* key : {"STRATA_TIMELINE_DIR", "STRATA_TESTBED_DIR"}) {
    std::string d = process_env(pid, key);
    if (!d.empty()) dirs.push_back(d);
  }
  return dirs;
}

Result<std::unique_ptr<GpuTimingSource>> open_timeline_for(uint32_t pid) {
  return open_timeline_for(pid, timeline_dirs_of(pid));
}

Result<std::unique_ptr<GpuTimingSource>> open_timeline_for(uint32_t pid, const std::vector<std::string>& env_dirs) {
  std::vector<std::string> dirs = env_dirs;
  dirs.push_back("/tmp/strata-timeline");
  dirs.push_back("/tmp/strata-testbed");
  // Through the process's root: a process in a container writes inside its own /tmp.
  for (const auto& d : dirs) {
    for (const std::string& prefix : {"/proc/" + std::to_string(pid) + "/root", std::string()}) {
      std::string path = prefix + d + "/" + std::to_string(pid) + ".timeline";
      if (access(path.c_str(), R_OK) == 0) return open_timeline_file(path);
    }
  }
  return Error{"no GPU timeline for process " + std::to_string(pid)};
}

}  // namespace strata::agent
