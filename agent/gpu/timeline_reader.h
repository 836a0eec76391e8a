// The GPU timing source: device work (kernels, copies, collectives' kernels) with start and end on
// the device. One interface, two producers of the same timeline file format (abi/gpu_timeline.h):
// strata's CUPTI injection library on real GPUs, the testbed's libcudart stand-in in tests.
//
// The file is written by the watched process, so everything in it is untrusted: the reader opens
// it without following links or blocking, accepts only a regular file of the expected owner,
// copies the ring out with pread (a truncated file ends a read, it cannot fault the agent), reads
// the header once and checks every record it copies.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "abi/gpu_timeline.h"
#include "common/result.h"

namespace strata::agent {

// Largest capacity (record slots) a timeline may declare: 64x the writers' default of 16384, room
// for a writer that buffers minutes of work; beyond it the header is refused as garbage.
inline constexpr uint32_t kMaxTimelineCapacity = 1u << 20;
// Most records copied from one timeline per read_new: a whole default ring four times over, so a
// real writer never loses to it, while a hostile write_index cannot make one call copy gigabytes.
inline constexpr uint64_t kMaxTimelineRecordsPerRead = 1u << 16;
// Largest device ordinal a record may name (NVML and CUDA number devices from 0 on one node).
inline constexpr int kMaxTimelineDevice = 1024;

struct TimelineRecord {
  uint32_t kind = 0;  // enum strata_timeline_kind
  int device = 0;
  uint64_t start_ns = 0, end_ns = 0, api_ns = 0;  // CLOCK_MONOTONIC
  uint64_t correlation = 0;
  uint64_t func = 0;
  uint64_t stream = 0;
  uint64_t bytes = 0;
  int32_t api_tid = 0;
  // Into the source's own buffer: valid until its next read_new (a record kept longer keeps a copy,
  // or no name). No string per record: kernel names are longer than a std::string holds inline,
  // and a rank runs 10k-100k kernels a second.
  std::string_view name;
};

class GpuTimingSource {
 public:
  virtual ~GpuTimingSource() = default;
  // New records since the last call; `lost` counts records the writer overwrote before we read
  // them, and records that failed the checks. Their names are valid until the next call.
  virtual std::vector<TimelineRecord> read_new(uint64_t& lost) = 0;
  // The writer has exited and its last records were read: removes its file from the rendezvous,
  // when the name still holds the file this reader opened (a new process with the same pid may
  // have made its own). Without it every GPU process ever run leaves its ring (3 MB by default) in
  // /run, which is memory. True when it removed one; sources that are not files remove nothing.
  virtual bool remove_file() { return false; }
};

// Where the agent looks for timelines: its own $STRATA_TIMELINE_DIR, else
// STRATA_TIMELINE_DEFAULT_DIR (a path inside each target's mount namespace).
std::string timeline_rendezvous_dir();
// Creates STRATA_TIMELINE_DEFAULT_DIR (root:root 0755 /run/strata, 01777 timeline) when this
// process is root and it is missing; a root process calls it before its targets start writing.
// Nothing when $STRATA_TIMELINE_DIR moves the rendezvous (whoever chose the directory made it).
Status prepare_timeline_rendezvous();

// What the reader needs of a target, read while it lives (an exited process has no /proc entry).
struct TimelineTarget {
  uint32_t pid = 0;        // as the agent sees it
  uint32_t ns_pid = 0;     // as the process sees itself: the name of its file
  uid_t uid = 0;           // its real uid: the file must be its own or root's
  bool host_root = false;  // shares the agent's root directory: the file can be found without /proc
  int64_t started_mono_ns = 0;  // when it started, CLOCK_MONOTONIC (0: unknown): a file made
                                // before is an earlier process's with the same pid
};
std::optional<TimelineTarget> timeline_target_of(uint32_t pid);

// Opens the timeline of `t` in the rendezvous directory `dir`, through /proc/PID/root (or the
// agent's own root when the process is gone and shared it). Error with the reason when it has
// none (no GPU work seen yet, or no timing source) or the file is refused.
Result<std::unique_ptr<GpuTimingSource>> open_timeline_for(const TimelineTarget& t, const std::string& dir);
Result<std::unique_ptr<GpuTimingSource>> open_timeline_for(const TimelineTarget& t);

// Whether `e` (from the openers above and below) says a file was there and was refused as not a
// timeline of the expected writer, rather than that there was none (yet).
bool timeline_refused(const Error& e);

// Opens one timeline file by path. Every directory of `path` is walked without following links;
// the file must be owned by root or `owner`; `expect_pid` (0: any) is the pid its header must name.
Result<std::unique_ptr<GpuTimingSource>> open_timeline_file(const std::string& path, uid_t owner,
                                                            uint32_t expect_pid = 0);
// The same for a file owned by this process's effective uid (or root).
Result<std::unique_ptr<GpuTimingSource>> open_timeline_file(const std::string& path);

}  // namespace strata::agent
