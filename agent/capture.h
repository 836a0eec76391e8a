// Capture and replay of what the node pipeline reads from the machine (issue 15 item 2), so the
// pipeline -- collective decoding, step detection, window closing, stack normalization -- is
// tested without root from a committed file.
//
// The pipeline is deterministic given what it reads. Everything it reads from the world goes
// through a Tape: live it reads (and, when capturing, writes the answer to the file); in replay it
// answers from the file, in the order the live run asked. What is taped:
//   - the shell's calls (begin, watch, announce, step, finish...): the control stream replay drives;
//   - the clocks (monotonic and the run's unix timeline), so windows close at the same moments;
//   - each drain of the on-CPU sampler (the decoded samples and fork/exec/exit events);
//   - each drain of the GPU/comm API ring buffer, as the kernel's raw records (abi/gpu_comm.h);
//   - /proc reads: process identity, CPU time, existence, maps (with the mapped files' build ids);
//   - the GPU device timeline: whether a process has one, and each batch of records read from it;
//   - the names of kernels symbolized from the target's binaries;
//   - each drain of the off-CPU ring buffer (the kernel's raw block records), and each read of the
//     OS layer: its BPF maps (scheduler, IRQ, retransmit counters), /proc and cgroup files, TCP
//     connections, and where __schedule lies in the kernel text.
// Not taped (replay does not run these sources, or leaves them out): NVML, the agent's own CPU
// time (the cost budget: off in replay), Python frame detection and CFI unwinding of stack copies
// (both read the target's binaries: a capture is made with frame pointers only), and
// symbolization (replay stores frames as build id + offset; symbols would come from the capturing
// machine's files).
//
// The file: "STRATAEV" (8 bytes), u32 version, u32 header length, the header; then one zstd
// stream of records, each u32 kind, u32 length, payload. Integers are little-endian (the agent
// runs on x86-64 and arm64). A capture stops growing at kMaxCaptureBytes (counted, said once).
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/proc_maps.h"
#include "common/result.h"
#include "store/store.h"

namespace strata::agent {

inline constexpr char kCaptureMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'E', 'V'};
inline constexpr uint32_t kCaptureVersion = 1;
// Records (uncompressed) a capture holds at most: a few minutes of a small job with stack copies;
// a replay test's capture is far below. Past it the writer stops and says so once.
inline constexpr uint64_t kMaxCaptureBytes = 256ull << 20;
// One record at most: a sampler drain of a full 1 MiB-per-CPU ring buffer is below it.
inline constexpr uint32_t kMaxCaptureRecordBytes = 64u << 20;
// Header at most: a few names and numbers.
inline constexpr uint32_t kMaxCaptureHeaderBytes = 64u << 10;

enum class CaptureKind : uint32_t {
  kControl = 1,       // a call of the shell into the pipeline (CaptureControl)
  kMonoClock = 2,     // CLOCK_MONOTONIC ns
  kUnixClock = 3,     // the run's unix timeline ns (process_info.h)
  kSamplerPoll = 4,   // one drain of the on-CPU sampler: its events
  kApiPoll = 5,       // one drain of the GPU/comm API ring buffer: raw records
  kProcessInfo = 6,   // read_process_info
  kProcessCpu = 7,    // process_cpu_ns
  kProcessExists = 8, // process_exists
  kProcMaps = 9,      // read_proc_maps
  kBuildId = 10,      // a mapped file's identity and build id
  kTimelineOpen = 11, // whether a process's device timeline opened
  kTimelineRead = 12, // records read from a device timeline
  kKernelName = 13,   // a kernel's name from the target's binary
  kOffCpuPoll = 14,   // one drain of the off-CPU ring buffer: raw records (abi/offcpu.h)
  kOsRead = 15,       // one read of the OS layer: a BPF map, a /proc or cgroup file (os_source.cpp)
  kLast = 15,
};

enum class CaptureControl : uint8_t {
  kBegin = 1, kWatch = 2, kAddTarget = 3, kAnnounce = 4, kReapedCpu = 5, kStep = 6, kFinish = 7, kForgetGone = 8,
};

// Little-endian encoding of the records' fields.
class ByteWriter {
 public:
  void u8(uint8_t v) { s_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v);
  void u64(uint64_t v);
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f64(double v);
  void str(std::string_view v);  // u32 length + bytes
  const std::string& data() const { return s_; }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

// Reads what ByteWriter wrote; a read past the end (or a length over what is left) fails and
// every later read fails too: check ok() once at the end.
class ByteReader {
 public:
  explicit ByteReader(std::string_view d) : d_(d) {}
  uint8_t u8();
  uint32_t u32();
  uint64_t u64();
  int64_t i64() { return static_cast<int64_t>(u64()); }
  double f64();
  std::string str();
  std::string_view str_view();  // as str(), viewing the data read (valid while it lives)
  std::string_view bytes(size_t n);
  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && pos_ == d_.size(); }
  size_t left() const { return ok_ ? d_.size() - pos_ : 0; }

 private:
  bool take(size_t n) {
    if (!ok_ || d_.size() - pos_ < n) return ok_ = false;
    return true;
  }
  std::string_view d_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// What replay needs to rebuild the pipeline as the live run had it.
struct CaptureHeader {
  std::string node;
  unsigned frequency_hz = 99;
  double window_s = 10;
  std::set<std::string> layers;
  bool raw_device_records = true;
  uint64_t unwind_table_bytes = 0;
};

class CaptureWriter {
 public:
  static Result<std::unique_ptr<CaptureWriter>> create(const std::string& path, const CaptureHeader& header);
  ~CaptureWriter();
  // Appends one record (any thread). Past kMaxCaptureBytes records are dropped, counted.
  void put(CaptureKind kind, std::string_view payload);
  // Ends the zstd stream and closes the file; the first write error is the result.
  Status close();
  uint64_t bytes() const { return bytes_; }
  uint64_t dropped() const { return dropped_; }

 private:
  CaptureWriter() = default;
  Status write_out(const void* data, size_t n, bool end);
  std::mutex mu_;
  FILE* f_ = nullptr;
  void* zstd_ = nullptr;  // ZSTD_CCtx
  std::string path_;
  uint64_t bytes_ = 0, dropped_ = 0;
  std::optional<Error> error_;
};

struct CaptureRecord {
  CaptureKind kind;
  std::string payload;
};

struct Capture {
  CaptureHeader header;
  std::vector<CaptureRecord> records;
};

// A whole capture file, checked: a bad magic, another version, a truncated or corrupt stream or
// record is an Error of one line, never a crash.
Result<Capture> parse_capture(std::string_view file);
Result<Capture> read_capture(const std::string& path);

// Where the pipeline reads the world (see the top of this file).
class Tape {
 public:
  Tape() = default;                              // live
  explicit Tape(CaptureWriter* writer) : writer_(writer) {}  // live, writing what it reads
  explicit Tape(Capture capture);                // replaying
  bool replaying() const { return replay_; }
  bool capturing() const { return writer_ != nullptr; }

  // The next answer of `kind` in replay (nullopt when the capture has no more: error() says so).
  // Answers about one process (per_process(): their payload begins with its pid) are taken per
  // pid, so a change in the order processes are looked at shows as a different result, not as
  // every later answer going to the wrong process.
  std::optional<std::string> next(CaptureKind kind);
  std::optional<std::string> next(CaptureKind kind, uint32_t pid);
  // ... and a mapped file's build id by the process and the mapping's device and inode (the
  // order files are first looked at depends on the order stacks are normalized).
  std::optional<std::string> next_build_id(uint32_t pid, uint64_t dev, uint64_t ino);
  static bool per_process(CaptureKind kind);
  // How many leading payload bytes name what a per_process() answer is about.
  static size_t key_bytes(CaptureKind kind) { return kind == CaptureKind::kBuildId ? 20 : 4; }
  void put(CaptureKind kind, std::string_view payload) {
    if (writer_) writer_->put(kind, payload);
  }
  // The first inconsistency replay met (an answer missing or malformed), for its one-line error.
  const std::optional<std::string>& error() const { return error_; }
  void fail(const std::string& why) {
    if (!error_) error_ = why;
  }
  const CaptureHeader& header() const { return header_; }

  // The reads every layer shares.
  uint64_t mono_ns();
  uint64_t unix_ns();
  Result<store::ProcessInfo> process_info(uint32_t pid, const std::string& node);
  std::optional<uint64_t> process_cpu_ns(uint32_t pid);
  bool process_exists(uint32_t pid);
  Result<std::vector<Mapping>> proc_maps(uint32_t pid);

 private:
  uint64_t clock(CaptureKind kind, uint64_t (*live)());
  CaptureWriter* writer_ = nullptr;
  bool replay_ = false;
  CaptureHeader header_;
  std::vector<std::deque<std::string>> queues_;  // by kind
  std::map<std::pair<CaptureKind, std::string>, std::deque<std::string>> by_key_;  // per_process() kinds
  std::optional<std::string> error_;
};

// A Tape that is live and writes nothing: the pipeline's default.
Tape& live_tape();

}  // namespace strata::agent
