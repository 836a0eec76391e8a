#include "agent/gpu/cupti/timeline_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace strata::agent::cupti {

std::string TimelineWriter::default_path(pid_t pid) {
  const char* env = std::getenv(STRATA_TIMELINE_DIR_ENV);
  std::string dir = (env && *env) ? env : STRATA_TIMELINE_DEFAULT_DIR;
  if (!(env && *env)) {
    // The agent (root) normally made it; a root job makes it itself. Its parent is root's alone.
    std::string parent = dir.substr(0, dir.rfind('/'));
    mkdir(parent.c_str(), 0755);
  }
  // Shared by every user's jobs on the node, like /tmp itself: world-writable and sticky, so no
  // user can remove or replace another's timeline. Only the creator sets the mode.
  if (mkdir(dir.c_str(), 0700) == 0) chmod(dir.c_str(), 01777);
  return dir + "/" + std::to_string(pid) + ".timeline";
}

Result<std::unique_ptr<TimelineWriter>> TimelineWriter::create(const std::string& path, uint32_t capacity,
                                                               uint64_t start_ns) {
  if (capacity == 0) return Error{"timeline capacity must be > 0"};
  size_t size = STRATA_TIMELINE_HEADER_SIZE + static_cast<size_t>(capacity) * sizeof(strata_timeline_record);
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Error::from_errno("cannot create GPU timeline " + tmp, errno);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;
    close(fd);
    unlink(tmp.c_str());
    return Error::from_errno("cannot size GPU timeline " + tmp, e);
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (base == MAP_FAILED) {
    unlink(tmp.c_str());
    return Error::from_errno("cannot map GPU timeline " + tmp, e);
  }
  // A fresh file reads as zeros: every slot has seq 0 ("not written"), as the protocol needs.
  auto* h = static_cast<strata_timeline_header*>(base);
  h->version = STRATA_TIMELINE_VERSION;
  h->header_size = STRATA_TIMELINE_HEADER_SIZE;
  h->record_size = sizeof(strata_timeline_record);
  h->capacity = capacity;
  h->pid = static_cast<int32_t>(getpid());
  h->clock_id = CLOCK_MONOTONIC;
  h->write_index = 0;
  h->start_ns = start_ns;
  std::atomic_ref<uint64_t>(h->magic).store(STRATA_TIMELINE_MAGIC, std::memory_order_release);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int re = errno;
    munmap(base, size);
    unlink(tmp.c_str());
    return Error::from_errno("cannot publish GPU timeline " + path, re);
  }
  return std::unique_ptr<TimelineWriter>(new TimelineWriter(path, base, size));
}

TimelineWriter::~TimelineWriter() { munmap(base_, size_); }

void TimelineWriter::append(const strata_timeline_record& r) {
  strata_timeline_header* h = header();
  uint64_t n = next_++;
  auto* slot = reinterpret_cast<strata_timeline_record*>(base_ + STRATA_TIMELINE_HEADER_SIZE +
                                                         (n % h->capacity) * sizeof(strata_timeline_record));
  // The protocol of abi/gpu_timeline.h: mark the slot in progress, fill it, mark it complete,
  // then publish the index.
  std::atomic_ref<uint64_t>(slot->seq).store(0, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_release);
  strata_timeline_record copy = r;
  copy.name[STRATA_TIMELINE_NAME_LEN - 1] = '\0';
  std::memcpy(reinterpret_cast<uint8_t*>(slot) + sizeof(uint64_t), reinterpret_cast<const uint8_t*>(&copy) + sizeof(uint64_t),
              sizeof(copy) - sizeof(uint64_t));
  std::atomic_ref<uint64_t>(slot->seq).store(n + 1, std::memory_order_release);
  std::atomic_ref<uint64_t>(h->write_index).store(n + 1, std::memory_order_release);
}

}  // namespace strata::agent::cupti
