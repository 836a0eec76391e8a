#include "agent/capture.h"

#include <zstd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "agent/process_info.h"

namespace strata::agent {

void ByteWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) s_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void ByteWriter::u64(uint64_t v) {
  for (int i = 0; i < 8; ++i) s_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void ByteWriter::f64(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  u64(b);
}
void ByteWriter::str(std::string_view v) {
  u32(static_cast<uint32_t>(v.size()));
  s_.append(v);
}

uint8_t ByteReader::u8() {
  if (!take(1)) return 0;
  return static_cast<uint8_t>(d_[pos_++]);
}
uint32_t ByteReader::u32() {
  if (!take(4)) return 0;
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(d_[pos_ + i])) << (8 * i);
  pos_ += 4;
  return v;
}
uint64_t ByteReader::u64() {
  if (!take(8)) return 0;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(d_[pos_ + i])) << (8 * i);
  pos_ += 8;
  return v;
}
double ByteReader::f64() {
  uint64_t b = u64();
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}
std::string_view ByteReader::bytes(size_t n) {
  if (!take(n)) return {};
  auto v = d_.substr(pos_, n);
  pos_ += n;
  return v;
}
std::string ByteReader::str() { return std::string(bytes(u32())); }
std::string_view ByteReader::str_view() { return bytes(u32()); }

namespace {

std::string encode_header(const CaptureHeader& h) {
  ByteWriter w;
  w.str(h.node);
  w.u32(h.frequency_hz);
  w.f64(h.window_s);
  w.u32(static_cast<uint32_t>(h.layers.size()));
  for (const auto& l : h.layers) w.str(l);
  w.u8(h.raw_device_records ? 1 : 0);
  w.u64(h.unwind_table_bytes);
  return w.take();
}

// Numbers a live run can give; anything else is a corrupt header.
constexpr unsigned kMaxFrequencyHz = 1000;  // the CLI's bound (-F)
constexpr double kMaxWindowS = 24 * 3600;
constexpr uint32_t kMaxLayers = 16;

Result<CaptureHeader> decode_header(std::string_view d) {
  ByteReader r(d);
  CaptureHeader h;
  h.node = r.str();
  h.frequency_hz = r.u32();
  h.window_s = r.f64();
  uint32_t n = r.u32();
  if (n > kMaxLayers) return Error{"corrupt capture header (layers)"};
  for (uint32_t i = 0; i < n && r.ok(); ++i) h.layers.insert(r.str());
  h.raw_device_records = r.u8() != 0;
  h.unwind_table_bytes = r.u64();
  if (!r.ok()) return Error{"truncated capture header"};
  if (h.frequency_hz == 0 || h.frequency_hz > kMaxFrequencyHz || !(h.window_s > 0) || h.window_s > kMaxWindowS)
    return Error{"corrupt capture header (rate or window)"};
  return h;
}

}  // namespace

Result<std::unique_ptr<CaptureWriter>> CaptureWriter::create(const std::string& path, const CaptureHeader& header) {
  std::unique_ptr<CaptureWriter> w(new CaptureWriter());
  w->path_ = path;
  w->f_ = std::fopen(path.c_str(), "wbe");
  if (!w->f_) return Error::from_errno("cannot create the capture " + path, errno);
  std::string head = encode_header(header);
  ByteWriter pre;
  pre.u32(kCaptureVersion);
  pre.u32(static_cast<uint32_t>(head.size()));
  if (std::fwrite(kCaptureMagic, 1, sizeof kCaptureMagic, w->f_) != sizeof kCaptureMagic ||
      std::fwrite(pre.data().data(), 1, pre.data().size(), w->f_) != pre.data().size() ||
      std::fwrite(head.data(), 1, head.size(), w->f_) != head.size())
    return Error::from_errno("cannot write the capture " + path, errno);
  auto* cctx = ZSTD_createCCtx();
  if (!cctx) return Error{"cannot start zstd for the capture"};
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 3);  // zstd's default: fast, and small enough
  // A checksum of the content: a flipped byte is refused by the reader, not replayed as other data.
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  w->zstd_ = cctx;
  return w;
}

CaptureWriter::~CaptureWriter() {
  (void)close();
}

Status CaptureWriter::write_out(const void* data, size_t n, bool end) {
  auto* cctx = static_cast<ZSTD_CCtx*>(zstd_);
  ZSTD_inBuffer in{data, n, 0};
  char buf[64 << 10];
  for (;;) {
    ZSTD_outBuffer out{buf, sizeof buf, 0};
    size_t left = ZSTD_compressStream2(cctx, &out, &in, end ? ZSTD_e_end : ZSTD_e_continue);
    if (ZSTD_isError(left)) return Error{std::string("compressing the capture: ") + ZSTD_getErrorName(left)};
    if (out.pos && std::fwrite(buf, 1, out.pos, f_) != out.pos)
      return Error::from_errno("writing the capture " + path_, errno);
    if (end ? left == 0 : in.pos == in.size) return {};
  }
}

void CaptureWriter::put(CaptureKind kind, std::string_view payload) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!f_ || error_) return;
  uint64_t size = 8 + payload.size();
  if (bytes_ + size > kMaxCaptureBytes || payload.size() > kMaxCaptureRecordBytes) {
    ++dropped_;
    return;
  }
  ByteWriter w;
  w.u32(static_cast<uint32_t>(kind));
  w.u32(static_cast<uint32_t>(payload.size()));
  Status st = write_out(w.data().data(), w.data().size(), false);
  if (st) st = write_out(payload.data(), payload.size(), false);
  if (!st) {
    error_ = st.error();
    return;
  }
  bytes_ += size;
}

Status CaptureWriter::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!f_) return error_ ? Status(*error_) : Status{};
  if (!error_) {
    if (auto st = write_out(nullptr, 0, true); !st) error_ = st.error();
  }
  if (std::fclose(f_) != 0 && !error_) error_ = Error::from_errno("closing the capture " + path_, errno);
  f_ = nullptr;
  ZSTD_freeCCtx(static_cast<ZSTD_CCtx*>(zstd_));
  zstd_ = nullptr;
  if (!error_ && dropped_) error_ = Error{"the capture reached its size limit; " + std::to_string(dropped_) + " records left out"};
  return error_ ? Status(*error_) : Status{};
}

Result<Capture> parse_capture(std::string_view file) {
  constexpr size_t kPre = sizeof kCaptureMagic + 8;
  if (file.size() < kPre || std::memcmp(file.data(), kCaptureMagic, sizeof kCaptureMagic) != 0)
    return Error{"not a strata event capture (no STRATAEV header)"};
  ByteReader pre(file.substr(sizeof kCaptureMagic, 8));
  uint32_t version = pre.u32(), head_len = pre.u32();
  if (version != kCaptureVersion)
    return Error{"capture version " + std::to_string(version) + " (this strata reads version " +
                 std::to_string(kCaptureVersion) + ")"};
  if (head_len > kMaxCaptureHeaderBytes || head_len > file.size() - kPre) return Error{"truncated capture header"};
  auto header = decode_header(file.substr(kPre, head_len));
  if (!header) return header.error();
  Capture c;
  c.header = std::move(*header);

  // The records: decompressed whole (bounded), then split.
  std::string_view z = file.substr(kPre + head_len);
  std::string raw;
  auto* dctx = ZSTD_createDCtx();
  if (!dctx) return Error{"cannot start zstd to read the capture"};
  ZSTD_inBuffer in{z.data(), z.size(), 0};
  size_t last = 0;
  char buf[64 << 10];
  for (;;) {
    ZSTD_outBuffer out{buf, sizeof buf, 0};
    last = ZSTD_decompressStream(dctx, &out, &in);
    if (ZSTD_isError(last)) {
      std::string why = ZSTD_getErrorName(last);
      ZSTD_freeDCtx(dctx);
      return Error{"corrupt capture: " + why};
    }
    if (raw.size() + out.pos > kMaxCaptureBytes) {
      ZSTD_freeDCtx(dctx);
      return Error{"capture larger than " + std::to_string(kMaxCaptureBytes >> 20) + " MiB of records"};
    }
    raw.append(buf, out.pos);
    // Done when the input is used up and the output did not fill the buffer (nothing held back).
    if (in.pos == in.size && out.pos < out.size) break;
  }
  ZSTD_freeDCtx(dctx);
  if (z.empty() || last != 0) return Error{"truncated capture (the compressed stream ends early)"};

  ByteReader r(raw);
  while (r.left() > 0) {
    uint32_t kind = r.u32(), len = r.u32();
    if (!r.ok()) return Error{"truncated capture record"};
    if (kind < 1 || kind > static_cast<uint32_t>(CaptureKind::kLast))
      return Error{"corrupt capture: record kind " + std::to_string(kind)};
    if (len > kMaxCaptureRecordBytes || len > r.left()) return Error{"truncated capture record"};
    c.records.push_back({static_cast<CaptureKind>(kind), std::string(r.bytes(len))});
  }
  return c;
}

Result<Capture> read_capture(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Error::from_errno("cannot open the capture " + path, errno);
  std::ostringstream ss;
  ss << f.rdbuf();
  auto c = parse_capture(ss.str());
  if (!c) return c.error().context(path);
  return c;
}

bool Tape::per_process(CaptureKind kind) {
  switch (kind) {
    case CaptureKind::kProcessInfo: case CaptureKind::kProcessCpu: case CaptureKind::kProcessExists:
    case CaptureKind::kProcMaps: case CaptureKind::kBuildId: case CaptureKind::kTimelineOpen:
    case CaptureKind::kTimelineRead: case CaptureKind::kKernelName:
      return true;
    default:
      return false;
  }
}

Tape::Tape(Capture capture) : replay_(true), header_(std::move(capture.header)) {
  queues_.resize(static_cast<size_t>(CaptureKind::kLast) + 1);
  for (auto& r : capture.records) {
    if (per_process(r.kind)) {
      // Too short to name what it is about: a key no read asks for.
      std::string key = r.payload.size() >= key_bytes(r.kind) ? r.payload.substr(0, key_bytes(r.kind)) : "short";
      by_key_[{r.kind, key}].push_back(std::move(r.payload));
    } else {
      queues_[static_cast<size_t>(r.kind)].push_back(std::move(r.payload));
    }
  }
}

namespace {
std::optional<std::string> pop(std::deque<std::string>& q, Tape& tape, const std::string& what) {
  if (q.empty()) {
    tape.fail("the capture has no more " + what +
              " (it ends early, or this pipeline reads differently from the one that made it)");
    return std::nullopt;
  }
  std::string v = std::move(q.front());
  q.pop_front();
  return v;
}
}  // namespace

std::optional<std::string> Tape::next(CaptureKind kind) {
  return pop(queues_[static_cast<size_t>(kind)], *this,
             "records of kind " + std::to_string(static_cast<uint32_t>(kind)));
}

std::optional<std::string> Tape::next(CaptureKind kind, uint32_t pid) {
  ByteWriter key;
  key.u32(pid);
  return pop(by_key_[{kind, key.data()}], *this,
             "records of kind " + std::to_string(static_cast<uint32_t>(kind)) + " for pid " + std::to_string(pid));
}

std::optional<std::string> Tape::next_build_id(uint32_t pid, uint64_t dev, uint64_t ino) {
  ByteWriter key;
  key.u32(pid);
  key.u64(dev);
  key.u64(ino);
  return pop(by_key_[{CaptureKind::kBuildId, key.data()}], *this,
             "build ids for pid " + std::to_string(pid) + " file " + std::to_string(dev) + ":" + std::to_string(ino));
}

uint64_t Tape::clock(CaptureKind kind, uint64_t (*live)()) {
  if (replay_) {
    auto rec = next(kind);
    if (!rec) return 0;
    ByteReader r(*rec);
    uint64_t v = r.u64();
    if (!r.at_end()) fail("corrupt clock record");
    return v;
  }
  uint64_t v = live();
  if (writer_) {
    ByteWriter w;
    w.u64(v);
    writer_->put(kind, w.data());
  }
  return v;
}

uint64_t Tape::mono_ns() { return clock(CaptureKind::kMonoClock, &monotonic_now_ns); }
uint64_t Tape::unix_ns() { return clock(CaptureKind::kUnixClock, &unix_now_ns); }

namespace {

void encode_process(ByteWriter& w, const store::ProcessInfo& p) {
  w.u32(p.pid);
  w.u32(p.ppid);
  w.u64(p.start_ns);
  for (const auto* s : {&p.node, &p.comm, &p.command, &p.job, &p.pod_uid, &p.container_id, &p.pod_name, &p.pod_namespace})
    w.str(*s);
  w.i64(p.rank);
  w.i64(p.local_rank);
  w.i64(p.world_size);
}

void decode_process(ByteReader& r, store::ProcessInfo& p) {
  p.pid = r.u32();
  p.ppid = r.u32();
  p.start_ns = r.u64();
  for (auto* s : {&p.node, &p.comm, &p.command, &p.job, &p.pod_uid, &p.container_id, &p.pod_name, &p.pod_namespace})
    *s = r.str();
  p.rank = static_cast<int>(r.i64());
  p.local_rank = static_cast<int>(r.i64());
  p.world_size = static_cast<int>(r.i64());
}

}  // namespace

Result<store::ProcessInfo> Tape::process_info(uint32_t pid, const std::string& node) {
  if (replay_) {
    auto rec = next(CaptureKind::kProcessInfo, pid);
    if (!rec) return Error{"not in the capture"};
    ByteReader r(*rec);
    (void)r.u32();  // the pid, as asked
    bool ok = r.u8() != 0;
    if (!ok) {
      std::string why = r.str();
      if (!r.at_end()) fail("corrupt process record");
      return Error{why};
    }
    store::ProcessInfo p;
    decode_process(r, p);
    if (!r.at_end() || p.pid != pid) fail("corrupt process record, or one for another pid");
    p.node = node;  // the replay's node name, as the live run used its own
    return p;
  }
  auto p = read_process_info(pid, node);
  if (writer_) {
    ByteWriter w;
    w.u32(pid);
    w.u8(p ? 1 : 0);
    if (p) encode_process(w, *p);
    else w.str(p.error().message);
    writer_->put(CaptureKind::kProcessInfo, w.data());
  }
  return p;
}

std::optional<uint64_t> Tape::process_cpu_ns(uint32_t pid) {
  if (replay_) {
    auto rec = next(CaptureKind::kProcessCpu, pid);
    if (!rec) return std::nullopt;
    ByteReader r(*rec);
    uint32_t p = r.u32();
    bool has = r.u8() != 0;
    uint64_t v = r.u64();
    if (!r.at_end() || p != pid) fail("corrupt CPU record, or one for another pid");
    return has ? std::optional<uint64_t>(v) : std::nullopt;
  }
  auto v = agent::process_cpu_ns(pid);
  if (writer_) {
    ByteWriter w;
    w.u32(pid);
    w.u8(v ? 1 : 0);
    w.u64(v.value_or(0));
    writer_->put(CaptureKind::kProcessCpu, w.data());
  }
  return v;
}

bool Tape::process_exists(uint32_t pid) {
  if (replay_) {
    auto rec = next(CaptureKind::kProcessExists, pid);
    if (!rec) return false;
    ByteReader r(*rec);
    uint32_t p = r.u32();
    bool v = r.u8() != 0;
    if (!r.at_end() || p != pid) fail("corrupt process-exists record, or one for another pid");
    return v;
  }
  bool v = agent::process_exists(pid);
  if (writer_) {
    ByteWriter w;
    w.u32(pid);
    w.u8(v ? 1 : 0);
    writer_->put(CaptureKind::kProcessExists, w.data());
  }
  return v;
}

// A process's maps: bounded like /proc's (the kernel's default vm.max_map_count is 65530).
constexpr uint32_t kMaxCapturedMappings = 1u << 20;

Result<std::vector<Mapping>> Tape::proc_maps(uint32_t pid) {
  if (replay_) {
    auto rec = next(CaptureKind::kProcMaps, pid);
    if (!rec) return Error{"not in the capture"};
    ByteReader r(*rec);
    uint32_t p = r.u32();
    bool ok = r.u8() != 0;
    if (!ok) {
      std::string why = r.str();
      if (!r.at_end() || p != pid) fail("corrupt maps record, or one for another pid");
      return Error{why};
    }
    uint32_t n = r.u32();
    if (n > kMaxCapturedMappings || n > r.left()) {
      fail("corrupt maps record");
      return Error{"corrupt maps record"};
    }
    std::vector<Mapping> maps(n);
    for (auto& m : maps) {
      m.start = r.u64();
      m.end = r.u64();
      m.file_offset = r.u64();
      m.dev = r.u64();
      m.inode = r.u64();
      m.executable = r.u8() != 0;
      m.path = r.str();
    }
    if (!r.at_end() || p != pid) fail("corrupt maps record, or one for another pid");
    return maps;
  }
  auto maps = read_proc_maps(pid);
  if (writer_) {
    ByteWriter w;
    w.u32(pid);
    w.u8(maps ? 1 : 0);
    if (!maps) {
      w.str(maps.error().message);
    } else {
      w.u32(static_cast<uint32_t>(maps->size()));
      for (const auto& m : *maps) {
        w.u64(m.start);
        w.u64(m.end);
        w.u64(m.file_offset);
        w.u64(m.dev);
        w.u64(m.inode);
        w.u8(m.executable ? 1 : 0);
        w.str(m.path);
      }
    }
    writer_->put(CaptureKind::kProcMaps, w.data());
  }
  return maps;
}

Tape& live_tape() {
  static Tape tape;
  return tape;
}

}  // namespace strata::agent
