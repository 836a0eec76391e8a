// The writing side of the GPU timeline file (abi/gpu_timeline.h): one writer per process appends
// device-work records to a shared-mapped ring that the agent follows. Used by libstrata_cupti.so;
// kept free of CUPTI so it is tested on machines without a GPU.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "abi/gpu_timeline.h"
#include "common/result.h"

namespace strata::agent::cupti {

class TimelineWriter {
 public:
  // Creates the file at `path` (replacing an old one, e.g. of a recycled pid) with `capacity`
  // record slots. The file appears complete: it is built under a temporary name and renamed, so a
  // reader never maps a half-written header.
  static Result<std::unique_ptr<TimelineWriter>> create(const std::string& path, uint32_t capacity,
                                                        uint64_t start_ns);
  ~TimelineWriter();
  TimelineWriter(const TimelineWriter&) = delete;
  TimelineWriter& operator=(const TimelineWriter&) = delete;

  // Appends one record; `seq` is set here. Not thread safe: callers serialize (one writer per file).
  void append(const strata_timeline_record& r);
  uint64_t written() const { return next_; }
  const std::string& path() const { return path_; }

  // $STRATA_TIMELINE_DIR (else /run/strata/timeline) + "/<pid>.timeline"; creates the directory
  // when it can (the rendezvous of abi/gpu_timeline.h).
  static std::string default_path(pid_t pid);

 private:
  TimelineWriter(std::string path, void* base, size_t size)
      : path_(std::move(path)), base_(static_cast<uint8_t*>(base)), size_(size) {}
  strata_timeline_header* header() { return reinterpret_cast<strata_timeline_header*>(base_); }

  std::string path_;
  uint8_t* base_;
  size_t size_;
  uint64_t next_ = 0;
};

}  // namespace strata::agent::cupti
