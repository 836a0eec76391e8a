// Replay (issue 15 item 2; no root): a committed capture of a short 2-rank sim job, made by
// `strata record --save-events` (tests/data/replay/make_capture.sh), runs through the node
// pipeline into a new SQLite store, which must hold what the live run stored
// (tests/data/replay/sim.expected.txt, dumped from the live store by strata-replay-dump):
// windows (window closing), on-CPU stacks per window (normalization, as build id + offset),
// communicators and collectives with their sequence numbers (the API records' decoding), steps
// (step detection), device activity (the device timeline), off-CPU stacks (the off-CPU program's
// records), and the GPU/comm and OS layers' metrics (the OS layer's map and /proc reads).
// The capture's clocks and /proc reads are taped, so the result does not depend on this
// machine, its binaries or the time: the comparison is exact.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "abi/gpu_comm.h"
#include "abi/offcpu.h"
#include "agent/capture.h"
#include "agent/engine.h"
#include "store/store.h"
#include "tests/unit/replay_dump.h"

namespace fs = std::filesystem;
using namespace strata;
using namespace strata::agent;

namespace {

const std::string kData = std::string(STRATA_SOURCE_DIR) + "/tests/data/replay";
const std::string kCapture = kData + "/sim.cap";
const std::string kExpected = kData + "/sim.expected.txt";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/strata-replay-XXXXXX";
    path_ = mkdtemp(t);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Replays `capture` into a new store and dumps it.
Result<std::string> replay_to_dump(const std::string& capture, const TempDir& dir, std::string& log_text) {
  std::string db = dir / "replay.db";
  fs::remove(db);
  {
    auto store = store::Store::open_sqlite(db, store::Store::Mode::kCreateOrAppend);
    if (!store) return store.error();
    std::ostringstream log;
    auto r = replay_capture(capture, **store, log);
    log_text = log.str();
    if (!r) return r.error();
  }
  return test::replay_dump(db);
}

// The lines of one section ("# name N" then "name|..." lines).
std::vector<std::string> section(const std::string& dump, const std::string& name) {
  std::vector<std::string> out;
  std::istringstream in(dump);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + "|", 0) == 0) out.push_back(line);
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) out.push_back(part);
  return out;
}

// Writes `c` as a capture file again (the tests change it first).
void write_capture(const Capture& c, const std::string& path) {
  auto w = CaptureWriter::create(path, c.header);
  ASSERT_TRUE(w) << w.error().message;
  for (const auto& r : c.records) (*w)->put(r.kind, r.payload);
  ASSERT_TRUE((*w)->close());
}

const char* kSections[] = {"recording", "process", "window", "stack_count", "communicator",
                           "collective", "step", "device", "launch", "metric"};

}  // namespace

TEST(Replay, SimJobGivesWhatTheLiveRunStored) {
  TempDir dir;
  std::string log;
  auto got = replay_to_dump(kCapture, dir, log);
  ASSERT_TRUE(got) << got.error().message << "\n" << log;
  std::string want = slurp(kExpected);
  ASSERT_FALSE(want.empty()) << kExpected;
  for (const char* s : kSections) EXPECT_EQ(section(*got, s), section(want, s)) << "section " << s;
  EXPECT_EQ(*got, want);
}

// The expectation is not empty or trivial: the capture has several windows, stacks in them, both
// ranks' collectives numbered 1, 2, 3... per communicator, steps and device records.
TEST(Replay, TheExpectationCoversEveryLayerReplayed) {
  std::string want = slurp(kExpected);
  EXPECT_GE(section(want, "window").size(), 3u);
  EXPECT_GE(section(want, "stack_count").size(), 10u);
  EXPECT_GE(section(want, "step").size(), 4u);
  EXPECT_GE(section(want, "device").size(), 10u);
  EXPECT_GE(section(want, "communicator").size(), 2u);
  auto colls = section(want, "collective");
  ASSERT_GE(colls.size(), 10u);
  // collective|pid|tid|library|op|comm_id|comm_handle|seq|...|enter_ns(13)...
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> by_comm;  // -> (enter, seq)
  std::set<std::string> pids;
  for (const auto& line : colls) {
    auto f = split(line, '|');
    ASSERT_GE(f.size(), 20u) << line;
    pids.insert(f[1]);
    std::string key = f[1] + "/" + f[3] + "/" + (f[3] == "gloo" ? f[4] : f[6]);
    by_comm[key].emplace_back(std::stoull(f[14]), std::stoull(f[7]));
  }
  EXPECT_EQ(pids.size(), 2u) << "both ranks' collectives";
  for (auto& [key, v] : by_comm) {
    std::sort(v.begin(), v.end());
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i].second, i + 1) << key << ": sequence numbers in call order";
  }
  // The off-CPU layer (stack_count|window|kind 1|...) and the OS layer's metrics of both ranks.
  size_t offcpu = 0;
  for (const auto& line : section(want, "stack_count")) offcpu += split(line, '|').at(2) == "1";
  EXPECT_GE(offcpu, 10u) << "off-CPU stacks";
  std::map<std::string, std::set<std::string>> os_pids;  // metric -> pids
  for (const auto& line : section(want, "metric")) {
    auto f = split(line, '|');
    ASSERT_GE(f.size(), 7u) << line;
    if (f[4].rfind("os.", 0) == 0) os_pids[f[4]].insert(f[3]);
  }
  for (const char* m : {"os.cpu_time_us", "os.runq_wait_us", "os.voluntary_switches", "os.blocked_us"})
    EXPECT_GE(os_pids[m].size(), 2u) << m << " of both ranks";
}

// Off-CPU decoding: one block record's blocked time changed changes the off-CPU stack counts and
// nothing else; an OS-layer read changed (a process's page faults) changes only the metrics.
TEST(Replay, AChangedOffCpuRecordOrOsReadIsSeen) {
  TempDir dir;
  auto c = read_capture(kCapture);
  ASSERT_TRUE(c) << c.error().message;
  bool block_changed = false;
  for (auto& r : c->records) {
    if (r.kind != CaptureKind::kOffCpuPoll || block_changed) continue;
    ByteReader in(r.payload);
    ByteWriter out;
    while (in.left() > 0) {
      std::string raw = in.str();
      ASSERT_TRUE(in.ok());
      strata_offcpu_event e;
      if (!block_changed && raw.size() >= sizeof e) {
        std::memcpy(&e, raw.data(), sizeof e);
        if (e.type == STRATA_OFFCPU_EV_BLOCK) {
          e.blocked_ns += 7'000'000;  // 7 ms more: a whole number of stored microseconds
          std::memcpy(raw.data(), &e, sizeof e);
          block_changed = true;
        }
      }
      out.str(raw);
    }
    r.payload = out.take();
  }
  ASSERT_TRUE(block_changed) << "the capture has an off-CPU block";
  write_capture(*c, dir / "block.cap");
  std::string log;
  auto got = replay_to_dump(dir / "block.cap", dir, log);
  ASSERT_TRUE(got) << got.error().message << "\n" << log;
  std::string want = slurp(kExpected);
  EXPECT_NE(section(*got, "stack_count"), section(want, "stack_count"));
  EXPECT_EQ(section(*got, "metric"), section(want, "metric"));
  EXPECT_EQ(section(*got, "window"), section(want, "window"));

  // kOsRead records: u8 read kind, u32 pid, then the answer; kind 2 is a process's page faults
  // (os_source.cpp's OsRead::kFaults): u8 present, u64 minor, u64 major.
  c = read_capture(kCapture);
  ASSERT_TRUE(c) << c.error().message;
  size_t faults_seen = 0;
  for (auto& r : c->records) {
    if (r.kind != CaptureKind::kOsRead || r.payload.size() != 1 + 4 + 1 + 16 || r.payload[0] != 2 || r.payload[5] != 1)
      continue;
    // The second reading (the first is where counting starts): a window's delta changes.
    if (++faults_seen == 2) r.payload[6] = static_cast<char>(r.payload[6] + 1);
  }
  ASSERT_GE(faults_seen, 2u) << "the capture reads page faults";
  write_capture(*c, dir / "faults.cap");
  got = replay_to_dump(dir / "faults.cap", dir, log);
  ASSERT_TRUE(got) << got.error().message << "\n" << log;
  EXPECT_NE(section(*got, "metric"), section(want, "metric"));
  EXPECT_EQ(section(*got, "stack_count"), section(want, "stack_count"));
}

// Windowing: the same events with another window length close other windows, and the replay no
// longer gives what the live run stored: either other rows, or -- when the pipeline then asks the
// capture for reads the live run did not make (a device timeline looked at in a window flush that
// did not happen live) -- an error saying so. Either way the test above fails when the window
// clock breaks.
TEST(Replay, AChangedWindowIsSeen) {
  TempDir dir;
  auto c = read_capture(kCapture);
  ASSERT_TRUE(c) << c.error().message;
  c->header.window_s *= 2;
  write_capture(*c, dir / "wide.cap");
  std::string log;
  auto got = replay_to_dump(dir / "wide.cap", dir, log);
  if (!got) {
    EXPECT_NE(got.error().message.find("reads differently"), std::string::npos) << got.error().message;
    return;
  }
  std::string want = slurp(kExpected);
  EXPECT_LT(section(*got, "window").size(), section(want, "window").size());
  EXPECT_NE(section(*got, "stack_count"), section(want, "stack_count"));
  EXPECT_NE(section(*got, "metric"), section(want, "metric"));
}

// Decoding: one API record's count one higher changes that collective's stored row, and nothing
// is decoded from anywhere else.
TEST(Replay, AChangedApiRecordIsSeen) {
  TempDir dir;
  auto c = read_capture(kCapture);
  ASSERT_TRUE(c) << c.error().message;
  bool changed = false;
  for (auto& r : c->records) {
    if (r.kind != CaptureKind::kApiPoll || changed) continue;
    ByteReader in(r.payload);
    ByteWriter out;
    while (in.left() > 0) {
      std::string raw = in.str();
      ASSERT_TRUE(in.ok());
      strata_api_event e;
      if (!changed && raw.size() >= sizeof e) {
        std::memcpy(&e, raw.data(), sizeof e);
        if (e.api == STRATA_API_NCCL_ALLREDUCE) {
          e.args[2] += 1;  // count
          std::memcpy(raw.data(), &e, sizeof e);
          changed = true;
        }
      }
      out.str(raw);
    }
    r.payload = out.take();
  }
  ASSERT_TRUE(changed) << "the capture has an allreduce";
  write_capture(*c, dir / "changed.cap");
  std::string log;
  auto got = replay_to_dump(dir / "changed.cap", dir, log);
  ASSERT_TRUE(got) << got.error().message;
  std::string want = slurp(kExpected);
  auto a = section(*got, "collective"), b = section(want, "collective");
  ASSERT_EQ(a.size(), b.size());
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
  EXPECT_EQ(differ, 1u);
  EXPECT_EQ(section(*got, "window"), section(want, "window"));
}

// A truncated or corrupt capture is a one-line error, never a crash; nothing is half-replayed
// into a store as a success.
TEST(Replay, TruncatedOrCorruptCapturesAreOneLineErrors) {
  std::string file = slurp(kCapture);
  ASSERT_GT(file.size(), 100u);
  auto one_line = [](const std::string& m) { return !m.empty() && m.find('\n') == std::string::npos; };
  for (size_t cut : {size_t{0}, size_t{4}, size_t{8}, size_t{15}, size_t{40}, file.size() / 3, file.size() / 2,
                     file.size() - 1}) {
    auto c = parse_capture(std::string_view(file).substr(0, cut));
    ASSERT_FALSE(c) << "cut at " << cut;
    EXPECT_TRUE(one_line(c.error().message)) << c.error().message;
  }
  std::string bad = file;
  bad[0] = 'X';
  EXPECT_FALSE(parse_capture(bad));
  bad = file;
  bad[8] = 99;  // version
  auto v = parse_capture(bad);
  ASSERT_FALSE(v);
  EXPECT_NE(v.error().message.find("version"), std::string::npos) << v.error().message;
  EXPECT_FALSE(read_capture("/nonexistent/sim.cap"));

  // Bytes flipped in the compressed stream: zstd's checks or the record layout refuse it, or it
  // still parses and then replays to an error or a result, never a crash.
  TempDir dir;
  for (size_t i = 0; i < 16; ++i) {
    std::string f = file;
    size_t at = 40 + (f.size() - 41) * i / 16;
    f[at] = static_cast<char>(f[at] ^ 0x5a);
    auto c = parse_capture(f);
    if (!c) {
      EXPECT_TRUE(one_line(c.error().message)) << c.error().message;
      continue;
    }
    std::ofstream(dir / "flipped.cap", std::ios::binary) << f;
    std::string log;
    auto got = replay_to_dump(dir / "flipped.cap", dir, log);
    if (!got) {
      EXPECT_TRUE(one_line(got.error().message)) << got.error().message;
    }
  }

  // A capture cut after a whole number of records (a recorder killed mid-run, with the stream
  // ended properly): replay stops with an error, not a partial success.
  auto c = read_capture(kCapture);
  ASSERT_TRUE(c);
  c->records.resize(c->records.size() / 2);
  write_capture(*c, dir / "half.cap");
  std::string log;
  auto got = replay_to_dump(dir / "half.cap", dir, log);
  ASSERT_FALSE(got);
  EXPECT_TRUE(one_line(got.error().message)) << got.error().message;
}
