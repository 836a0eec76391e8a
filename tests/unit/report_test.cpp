// Exporters on a made-up profile: folded lines, the pprof file (read back with the generated class
// and with the real protoc CLI), and the top table.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/json.h"
#include "profile.pb.h"
#include "report/chrome_trace.h"
#include "report/exporters.h"

namespace strata::report {
namespace {

namespace fs = std::filesystem;
namespace pb = perftools::profiles;

constexpr char kAppBuildId[] = "aa11bb22cc33";
constexpr char kLibcBuildId[] = "dd44ee55";
constexpr char kFooBuildId[] = "ff66";

Frame native(std::string function, std::string module, std::string build_id, uint64_t offset) {
  Frame f;
  f.kind = FrameKind::kNative;
  f.function = std::move(function);
  f.module = std::move(module);
  f.build_id = std::move(build_id);
  f.offset = offset;
  return f;
}

Frame kernel(std::string function, uint64_t address) {
  Frame f;
  f.kind = FrameKind::kKernel;
  f.function = std::move(function);
  f.module = "[kernel]";
  f.offset = address;
  return f;
}

Frame app(std::string function, uint64_t offset) {
  return native(std::move(function), "/opt/bin/app", kAppBuildId, offset);
}

// Stacks are leaf first, as the kernel gives them.
Profile sample_profile() {
  Profile p;
  p.period_ns = 10'101'010;  // 99 Hz
  p.start_ns = 1'700'000'000'000'000'000;
  p.duration_ns = 5'000'000'000;
  p.stacks = {
      {app("work", 0x1100), app("main", 0x1000)},
      {kernel("vfs_read", 0xffffffff81234567), native("read", "/usr/lib/libc.so.6", kLibcBuildId, 0x10f0),
       app("main", 0x1010)},
      // Unresolved code in a known module keeps its place as module+0xoffset.
      {native("", "/usr/lib/libfoo.so", kFooBuildId, 0x1a2b), app("main", 0x1020)},
      // The same stack as #0 stored twice (e.g. from two windows): lines must merge.
      {app("work", 0x1100), app("main", 0x1000)},
  };
  p.samples = {
      {0, 10, 10, "app", 5},
      {3, 10, 11, "worker", 2},
      {1, 10, 10, "app", 3},
      {2, 10, 11, "worker", 1},
  };
  return p;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

uint64_t folded_total(const std::string& text) {
  uint64_t total = 0;
  for (const auto& line : lines_of(text)) total += std::stoull(line.substr(line.rfind(' ') + 1));
  return total;
}

std::string folded(const Profile& p, bool by_thread = false) {
  std::ostringstream out;
  write_folded(p, out, by_thread);
  return out.str();
}

// A scratch directory per test, removed afterwards.
class ScratchDir {
 public:
  ScratchDir() {
    path_ = fs::temp_directory_path() / ("strata_report_test_" + std::to_string(getpid()) + "_" +
                                         testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string gunzip(const fs::path& path) {
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) return "";
  std::string data;
  char buf[4096];
  int n = 0;
  while ((n = gzread(gz, buf, sizeof buf)) > 0) data.append(buf, static_cast<size_t>(n));
  gzclose(gz);
  return data;
}

TEST(Folded, RootFirstMergedAndSorted) {
  EXPECT_EQ(folded(sample_profile()),
            "main;libfoo.so+0x1a2b 1\n"
            "main;read;vfs_read_[k] 3\n"
            "main;work 7\n");
}

TEST(Folded, ByThreadPutsTheThreadAtTheRoot) {
  EXPECT_EQ(folded(sample_profile(), true),
            "app-10/10;main;read;vfs_read_[k] 3\n"
            "app-10/10;main;work 5\n"
            "worker-10/11;main;libfoo.so+0x1a2b 1\n"
            "worker-10/11;main;work 2\n");
}

TEST(Folded, OutputDoesNotDependOnSampleOrder) {
  Profile p = sample_profile();
  const std::string before = folded(p);
  std::reverse(p.samples.begin(), p.samples.end());
  EXPECT_EQ(folded(p), before);
}

TEST(Folded, NamesAreSanitizedAndMarkedByKind) {
  Frame py;
  py.kind = FrameKind::kPython;
  py.function = "train_step";
  py.file = "train.py";
  py.line = 42;
  Frame py_no_line = py;
  py_no_line.line = 0;
  Frame unknown;  // nothing known at all
  unknown.module = "[unknown]";
  unknown.offset = 0x10;

  EXPECT_EQ(folded_frame_name(py), "train_step (train.py:42)");
  EXPECT_EQ(folded_frame_name(py_no_line), "train_step (train.py)");
  EXPECT_EQ(folded_frame_name(kernel("do_sys_open", 1)), "do_sys_open_[k]");
  EXPECT_EQ(folded_frame_name(unknown), "[unknown]+0x10");
  EXPECT_EQ(folded_frame_name(app("a;b\nc\rd", 0)), "a:b c d");

  Profile p;
  p.stacks = {{app("x;y", 0)}};
  p.samples = {{0, 1, 1, "bad;name\n", 2}};
  EXPECT_EQ(folded(p, true), "bad:name -1/1;x:y 2\n");
}

TEST(Folded, EmptyOrMissingStacksKeepTheirSamples) {
  Profile p;
  p.stacks = {{}};
  p.samples = {{0, 1, 1, "", 2}, {7, 1, 1, "", 3}, {0, 1, 1, "", 0}};
  EXPECT_EQ(folded(p), "[no stack] 5\n");
  EXPECT_EQ(folded_total(folded(p)), p.total());
}

// Windows at a lowered rate weigh more than one sample each (issue 19 item 3), and their lines are
// still whole numbers: speedscope's folded importer matches /^(.*) (\d+)$/ and skips any other line.
// Largest-remainder rounding keeps the total; each line is within one sample of its weight.
TEST(Folded, WeighedCountsAreWholeNumbers) {
  Profile p = sample_profile();                // 99 Hz
  constexpr uint64_t k49Hz = 20'408'163;       // 1e9 / 49
  constexpr uint64_t k24Hz = 41'666'666;       // 1e9 / 24
  p.samples = {
      {0, 10, 10, "app", 3, "", k49Hz},     // main;work           3 x 99/49 = 6.06
      {3, 10, 10, "app", 1, "", k24Hz},     // main;work (again)   1 x 99/24 = 4.13 -> 10.19
      {1, 10, 10, "app", 1, "", k49Hz},     // main;read;vfs_read  2.02
      {2, 10, 11, "worker", 5, "", 0},      // main;libfoo         5 at the profile's rate
  };
  const std::string text = folded(p);
  EXPECT_EQ(text,
            "main;libfoo.so+0x1a2b 5\n"
            "main;read;vfs_read_[k] 2\n"
            "main;work 10\n")
      << text;
  const std::regex speedscope("^(.*) (\\d+)$");
  for (const auto& line : lines_of(text)) EXPECT_TRUE(std::regex_match(line, speedscope)) << line;
  EXPECT_EQ(folded_total(text), static_cast<uint64_t>(std::llround(p.weighted_total())));

  // Lines of 2.6, 3.6 and 1.8 samples: 8 in all. Rounding each line would make 3 + 4 + 2 = 9; the
  // largest remainders get the two samples over the floors (2 + 3 + 1).
  p.samples = {
      {0, 10, 10, "app", 1, "", 26'262'626},
      {1, 10, 10, "app", 1, "", 36'363'636},
      {2, 10, 11, "worker", 1, "", 18'181'818},
  };
  const std::string t2 = folded(p);
  EXPECT_EQ(folded_total(t2), 8u) << t2;
  std::map<std::string, double> weight = {
      {"main;work", 2.6}, {"main;read;vfs_read_[k]", 3.6}, {"main;libfoo.so+0x1a2b", 1.8}};
  for (const auto& line : lines_of(t2)) {
    ASSERT_TRUE(std::regex_match(line, speedscope)) << line;
    const std::string stack = line.substr(0, line.rfind(' '));
    const double n = std::stod(line.substr(line.rfind(' ') + 1));
    ASSERT_TRUE(weight.count(stack)) << line;
    EXPECT_LT(std::fabs(n - weight[stack]), 1.0) << line;
  }
  EXPECT_NE(t2.find("main;libfoo.so+0x1a2b 2\n"), std::string::npos) << t2;

  // A line whose weight is under one sample (taken at a higher rate than the profile's) is 1, not 0:
  // its stack stays in the graph.
  p.samples = {{0, 10, 10, "app", 1, "", 3'000'000}};  // 0.30 of a 99 Hz sample
  EXPECT_EQ(folded(p), "main;work 1\n");
}

TEST(Json, StringsAreEscapedAndValidUtf8) {
  EXPECT_EQ(json_str("a\"b\\c\n\x01"), "\"a\\\"b\\\\c\\n\\u0001\"");
  EXPECT_EQ(json_str("GPU \xc3\xa9t\xc3\xa9"), "\"GPU \xc3\xa9t\xc3\xa9\"") << "UTF-8 passes as it is";
  // A thread name cut inside a character, and a stray byte: each becomes U+FFFD.
  EXPECT_EQ(json_str("x\xc3"), "\"x\xef\xbf\xbd\"");
  EXPECT_EQ(json_str("\xff!"), "\"\xef\xbf\xbd!\"");
}

class Pprof : public testing::Test {
 protected:
  // Writes the profile and reads it back as raw protobuf bytes.
  std::string write_and_gunzip(const Profile& p) {
    const fs::path gz = dir_.path() / "profile.pb.gz";
    Status st = write_pprof(p, gz.string());
    EXPECT_TRUE(st.ok()) << st.error().message;
    const std::string compressed = read_file(gz);
    // gzip magic: pprof and `go tool pprof` expect a gzip stream, not a bare zlib one.
    EXPECT_GE(compressed.size(), 2u);
    if (compressed.size() >= 2) {
      EXPECT_EQ(static_cast<unsigned char>(compressed[0]), 0x1f);
      EXPECT_EQ(static_cast<unsigned char>(compressed[1]), 0x8b);
    }
    return gunzip(gz);
  }

  ScratchDir dir_;
};

TEST_F(Pprof, RoundTripWithTheGeneratedClass) {
  const Profile p = sample_profile();
  pb::Profile out;
  ASSERT_TRUE(out.ParseFromString(write_and_gunzip(p)));
  auto str = [&](int64_t i) -> std::string {
    EXPECT_GE(i, 0);
    EXPECT_LT(i, out.string_table_size());
    return i >= 0 && i < out.string_table_size() ? out.string_table(static_cast<int>(i)) : "";
  };

  ASSERT_GT(out.string_table_size(), 0);
  EXPECT_EQ(out.string_table(0), "");
  // Samples, and their CPU time (the default): count times the period (issue 19).
  ASSERT_EQ(out.sample_type_size(), 2);
  EXPECT_EQ(str(out.sample_type(0).type()), "samples");
  EXPECT_EQ(str(out.sample_type(0).unit()), "count");
  EXPECT_EQ(str(out.sample_type(1).type()), "cpu");
  EXPECT_EQ(str(out.sample_type(1).unit()), "nanoseconds");
  EXPECT_EQ(str(out.default_sample_type()), "cpu");
  EXPECT_EQ(str(out.period_type().type()), "cpu");
  EXPECT_EQ(str(out.period_type().unit()), "nanoseconds");
  EXPECT_EQ(out.period(), 10'101'010);
  EXPECT_EQ(out.time_nanos(), 1'700'000'000'000'000'000);
  EXPECT_EQ(out.duration_nanos(), 5'000'000'000);

  // Totals: equal to the profile's and to the folded output's.
  int64_t total = 0;
  for (const auto& s : out.sample()) {
    ASSERT_EQ(s.value_size(), 2);
    total += s.value(0);
    EXPECT_EQ(s.value(1), s.value(0) * 10'101'010);
  }
  EXPECT_EQ(static_cast<uint64_t>(total), p.total());
  EXPECT_EQ(static_cast<uint64_t>(total), folded_total(folded(p)));

  // One mapping per (module, build id), each with its file name and build id.
  std::map<std::string, std::string> build_ids;  // filename -> build id
  std::map<uint64_t, std::string> mapping_file;  // id -> filename
  for (const auto& m : out.mapping()) {
    EXPECT_NE(m.id(), 0u);
    build_ids[str(m.filename())] = str(m.build_id());
    mapping_file[m.id()] = str(m.filename());
    EXPECT_TRUE(m.has_functions());
  }
  EXPECT_EQ(out.mapping_size(), 4);
  EXPECT_EQ(build_ids, (std::map<std::string, std::string>{{"/opt/bin/app", kAppBuildId},
                                                           {"/usr/lib/libc.so.6", kLibcBuildId},
                                                           {"/usr/lib/libfoo.so", kFooBuildId},
                                                           {"[kernel]", ""}}));

  // One function per distinct name; the unresolved frame is named as in the folded output.
  std::map<uint64_t, std::string> function_name;
  for (const auto& f : out.function()) function_name[f.id()] = str(f.name());
  EXPECT_EQ(out.function_size(), 5);

  // One location per distinct frame: main appears at three offsets, work once though stored twice.
  struct Loc {
    std::string function, file;
    uint64_t address;
  };
  std::map<uint64_t, Loc> locations;
  for (const auto& l : out.location()) {
    ASSERT_EQ(l.line_size(), 1);
    locations[l.id()] = {function_name[l.line(0).function_id()], mapping_file[l.mapping_id()], l.address()};
  }
  EXPECT_EQ(out.location_size(), 7);

  // Samples: leaf first, with pid/tid/thread labels.
  ASSERT_EQ(out.sample_size(), 4);
  std::vector<std::string> stack;
  for (uint64_t id : out.sample(2).location_id()) stack.push_back(locations[id].function);
  EXPECT_EQ(stack, (std::vector<std::string>{"vfs_read", "read", "main"}));
  EXPECT_EQ(locations[out.sample(2).location_id(0)].address, 0xffffffff81234567u);
  EXPECT_EQ(locations[out.sample(2).location_id(0)].file, "[kernel]");
  EXPECT_EQ(locations[out.sample(3).location_id(0)].function, "libfoo.so+0x1a2b");
  EXPECT_EQ(locations[out.sample(3).location_id(0)].address, 0x1a2bu);
  EXPECT_EQ(locations[out.sample(3).location_id(0)].file, "/usr/lib/libfoo.so");

  std::map<std::string, std::string> labels;
  for (const auto& l : out.sample(1).label()) {
    labels[str(l.key())] = l.str() != 0 ? str(l.str()) : std::to_string(l.num());
  }
  EXPECT_EQ(labels, (std::map<std::string, std::string>{{"pid", "10"}, {"tid", "11"}, {"thread", "worker"}}));
}

// Issue 19: windows at a lowered rate. One sample at 24 Hz is ~41.7 ms of CPU, one at 99 Hz ~10.1
// ms: each pprof sample's CPU time uses its own period and says it; the period field stays the
// profile's (configured) one.
TEST_F(Pprof, EachSampleIsWeighedByItsOwnPeriod) {
  Profile p;
  p.period_ns = 10'101'010;  // 99 Hz
  p.stacks = {{app("work", 0x1100), app("main", 0x1000)}};
  p.samples = {{0, 10, 10, "app", 99, "", 10'101'010}, {0, 10, 10, "app", 24, "", 41'666'666}};
  pb::Profile out;
  ASSERT_TRUE(out.ParseFromString(write_and_gunzip(p)));
  auto str = [&](int64_t i) { return out.string_table(static_cast<int>(i)); };
  EXPECT_EQ(out.period(), 10'101'010);
  ASSERT_EQ(out.sample_size(), 2);
  EXPECT_EQ(out.sample(0).value(0), 99);
  EXPECT_EQ(out.sample(0).value(1), 99 * 10'101'010LL);
  EXPECT_EQ(out.sample(1).value(0), 24);
  EXPECT_EQ(out.sample(1).value(1), 24 * 41'666'666LL);  // ~1 s, as the 99 samples at 99 Hz
  auto period_label = [&](const pb::Sample& s) -> int64_t {
    for (const auto& l : s.label())
      if (str(l.key()) == "sample_period") {
        EXPECT_EQ(str(l.num_unit()), "nanoseconds");
        return l.num();
      }
    return -1;
  };
  EXPECT_EQ(period_label(out.sample(0)), -1) << "the profile's own period is not repeated per sample";
  EXPECT_EQ(period_label(out.sample(1)), 41'666'666);
}

TEST_F(Pprof, SamplesCarryRankNodeAndJob) {
  Profile p = sample_profile();
  p.samples.push_back({0, 20, 20, "other", 1});  // a process the store knows nothing about
  p.processes[10] = {3, "node-a", "job-7"};
  pb::Profile out;
  ASSERT_TRUE(out.ParseFromString(write_and_gunzip(p)));
  auto labels_of = [&](int i) {
    std::map<std::string, std::string> m;
    for (const auto& l : out.sample(i).label()) {
      m[out.string_table(static_cast<int>(l.key()))] =
          l.str() != 0 ? out.string_table(static_cast<int>(l.str())) : std::to_string(l.num());
    }
    return m;
  };
  ASSERT_EQ(out.sample_size(), 5);
  EXPECT_EQ(labels_of(1), (std::map<std::string, std::string>{{"pid", "10"}, {"tid", "11"}, {"thread", "worker"},
                                                              {"rank", "3"}, {"node", "node-a"}, {"job", "job-7"}}));
  EXPECT_EQ(labels_of(4), (std::map<std::string, std::string>{{"pid", "20"}, {"tid", "20"}, {"thread", "other"}}));
}

TEST_F(Pprof, OffCpuUsesItsUnitAndKind) {
  Profile p = sample_profile();
  p.kind = "offcpu";
  p.value_unit = "microseconds";
  p.period_ns = 0;
  pb::Profile out;
  ASSERT_TRUE(out.ParseFromString(write_and_gunzip(p)));
  ASSERT_EQ(out.sample_type_size(), 1);
  EXPECT_EQ(out.string_table(static_cast<int>(out.sample_type(0).type())), "offcpu");
  EXPECT_EQ(out.string_table(static_cast<int>(out.sample_type(0).unit())), "microseconds");
  EXPECT_FALSE(out.has_period_type());
}

TEST_F(Pprof, DecodesWithTheProtocCli) {
  const char* source = std::getenv("STRATA_SOURCE");
  ASSERT_NE(source, nullptr) << "STRATA_SOURCE is set by strata_test; run through ctest";
  const fs::path raw = dir_.path() / "profile.pb";
  const fs::path decoded = dir_.path() / "decoded.txt";
  {
    std::ofstream out(raw, std::ios::binary);
    out << write_and_gunzip(sample_profile());
  }
  const std::string proto_dir = std::string(source) + "/proto";
  const std::string cmd = std::string(STRATA_PROTOC) + " --decode perftools.profiles.Profile -I '" +
                          proto_dir + "' '" + proto_dir + "/profile.proto' < '" + raw.string() + "' > '" +
                          decoded.string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string text = read_file(decoded);
  ASSERT_EQ(rc, 0) << cmd << "\n" << text;
  // Spot checks that protoc saw the same fields: names, build ids, the period.
  EXPECT_NE(text.find("string_table: \"vfs_read\""), std::string::npos) << text;
  EXPECT_NE(text.find(std::string("string_table: \"") + kAppBuildId + "\""), std::string::npos);
  EXPECT_NE(text.find("period: 10101010"), std::string::npos);
}

TEST_F(Pprof, UnwritablePathIsAnError) {
  Status st = write_pprof(sample_profile(), (dir_.path() / "no/such/dir/p.pb.gz").string());
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("no/such/dir/p.pb.gz"), std::string::npos) << st.error().message;
}

// name -> {self, total} from one section of the top table.
std::map<std::string, std::pair<uint64_t, uint64_t>> top_section(const std::string& text,
                                                                 const std::string& title) {
  std::map<std::string, std::pair<uint64_t, uint64_t>> rows;
  bool in_section = false;
  for (const auto& line : lines_of(text)) {
    if (line.empty()) {
      in_section = false;
      continue;
    }
    if (line == title) {
      in_section = true;
      continue;
    }
    if (!in_section || line.find("self%") != std::string::npos) continue;
    std::istringstream in(line);
    uint64_t self = 0, total = 0;
    std::string self_pct, total_pct, name;
    in >> self >> self_pct >> total >> total_pct;
    std::getline(in >> std::ws, name);
    rows[name] = {self, total};
  }
  return rows;
}

// A trace of a collector's store: two nodes whose processes have the same pid stay two processes,
// each named with its node; a pid on one node only keeps its number.
TEST(ChromeTrace, TheSamePidOnTwoNodesIsTwoProcesses) {
  TimelineData d;
  for (int k = 0; k < 2; ++k) {
    const std::string node = k == 0 ? "node-a" : "node-b";
    store::ProcessInfo p;
    p.pid = 42;
    p.node = node;
    p.comm = "app";
    p.rank = k;
    d.processes.push_back(p);
    store::StepRecord s;
    s.pid = 42;
    s.node = node;
    s.step = 1;
    s.start_ns = 1000;
    s.end_ns = 2000 + static_cast<uint64_t>(k) * 1000;
    d.steps.push_back(s);
  }
  store::ProcessInfo alone;
  alone.pid = 7;
  alone.node = "node-a";
  alone.comm = "loader";
  d.processes.push_back(alone);
  store::StepRecord s7;
  s7.pid = 7;
  s7.node = "node-a";
  s7.step = 1;
  s7.start_ns = 1000;
  s7.end_ns = 1500;
  d.steps.push_back(s7);
  std::ostringstream out;
  write_chrome_trace(d, out);
  const std::string t = out.str();
  EXPECT_NE(t.find("rank 0 (node-a, pid 42, app)"), std::string::npos) << t;
  EXPECT_NE(t.find("rank 1 (node-b, pid 42, app)"), std::string::npos) << t;
  EXPECT_NE(t.find("loader (pid 7)"), std::string::npos) << t;
  // Each node's step on a process of its own.
  std::regex step("\\{\"ph\":\"X\",\"pid\":([0-9]+),[^}]*\"name\":\"step 1\"");
  std::set<std::string> pids;
  for (std::sregex_iterator it(t.begin(), t.end(), step), end; it != end; ++it) pids.insert((*it)[1]);
  EXPECT_EQ(pids.size(), 3u) << t;
  EXPECT_EQ(pids.count("7"), 1u);
}

TEST(Top, SelfAndTotalWithRecursionCountedOnce) {
  Profile p;
  p.stacks = {
      {app("f", 0x20), app("f", 0x24), app("main", 0x10)},  // f recursing into itself
      {app("g", 0x30), app("f", 0x24), app("main", 0x10)},
      {kernel("vfs_read", 0xffffffff81000000), app("main", 0x14)},
  };
  p.samples = {{0, 1, 1, "app", 4}, {1, 1, 1, "app", 6}, {2, 1, 2, "app", 2}};
  std::ostringstream out;
  write_top(p, out);
  const std::string text = out.str();

  EXPECT_EQ(lines_of(text).at(0), "oncpu: 12 samples in total") << text;
  using Rows = std::map<std::string, std::pair<uint64_t, uint64_t>>;
  const Rows expected = {
      {"g [app]", {6, 6}}, {"f [app]", {4, 10}}, {"vfs_read [kernel]", {2, 2}}, {"main [app]", {0, 12}}};
  // "by self" leaves out functions that are never the leaf.
  Rows expected_self = expected;
  expected_self.erase("main [app]");
  EXPECT_EQ(top_section(text, "by self:"), expected_self) << text;
  EXPECT_EQ(top_section(text, "by total:"), expected) << text;
  EXPECT_NE(text.find(" 83.33%  f [app]"), std::string::npos) << text;  // 10 of 12

  // Ordered: by self, g (6) before f (4); by total, main (12) before f (10).
  EXPECT_LT(text.find("g [app]"), text.find("f [app]"));
  const auto by_total = text.find("by total:");
  EXPECT_LT(text.find("main [app]", by_total), text.find("f [app]", by_total));
}

// Issue 19: two windows of one stack, 99 samples at 99 Hz and 24 at 24 Hz, are one second of CPU
// each: summed, they are time (198 samples at 99 Hz), not counts (123).
TEST(Weighting, WindowsAtDifferentRatesSumToTime) {
  Profile p;
  p.period_ns = 10'101'010;  // 99 Hz: the recording's configured rate
  p.stacks = {{app("work", 0x1100), app("main", 0x1000)}, {app("idle", 0x1200), app("main", 0x1000)}};
  const uint64_t k24Hz = 1'000'000'000ull / 24;
  p.samples = {{0, 10, 10, "app", 99, "", 10'101'010}, {0, 10, 10, "app", 24, "", k24Hz},
               {1, 10, 10, "app", 1, "", k24Hz}};
  EXPECT_EQ(p.total(), 124u);
  EXPECT_TRUE(p.mixed_periods());
  EXPECT_NEAR(p.weighted_total(), 99 + 25 * (1e9 / 24) / 10'101'010, 0.01);  // 99 + 25 x 99/24
  EXPECT_NEAR(p.weighted(p.samples[1]), 24.0 * static_cast<double>(k24Hz) / 10'101'010, 1e-9);
  // CPU time: count x own period.
  double cpu_s = 0;
  for (const auto& s : p.samples) cpu_s += static_cast<double>(s.count * p.period_of(s)) / 1e9;
  EXPECT_NEAR(cpu_s, 2.0 + 1.0 / 24, 1e-3);

  // Folded: the two windows of "main;work" weigh the same (one second each): 99 + 99. Whole numbers
  // (Folded.WeighedCountsAreWholeNumbers): 1 sample at 24 Hz is 99/24 = 4.12 samples at 99 Hz, 4.
  const auto lines = lines_of(folded(p));
  ASSERT_EQ(lines.size(), 2u) << folded(p);
  EXPECT_EQ(lines[0], "main;idle 4") << "1 sample at 24 Hz = 99/24 samples at 99 Hz";
  EXPECT_EQ(lines[1], "main;work 198");

  // The table says the columns are weighed, and ranks by time: work (2 s) far above idle (41 ms).
  std::ostringstream top;
  write_top(p, top);
  EXPECT_NE(lines_of(top.str()).at(0).find("124 samples in total, taken at several rates"), std::string::npos) << top.str();
  EXPECT_NE(top.str().find(" 97.96%  work [app]"), std::string::npos) << top.str();  // 198 of 202.12

  // A profile of one rate is unchanged: whole counts.
  Profile one = sample_profile();
  EXPECT_FALSE(one.mixed_periods());
  EXPECT_EQ(one.weighted_total(), static_cast<double>(one.total()));
}

// Issue 19 item 10: threads are named by their comm, and a histogram is one counter track whose
// series are its buckets (every bucket in every window, 0 where a window had none).
TEST(ChromeTrace, ThreadNamesAndOneCounterPerHistogram) {
  TimelineData d;
  store::ProcessInfo p;
  p.pid = 42;
  p.comm = "python";
  p.rank = 0;
  d.processes.push_back(p);
  d.threads.push_back({1'000'000, 2'000'000, 42, 43, "pt_main_thread", 5, "", 24});
  store::CollectiveRecord c;
  c.pid = 42;
  c.tid = 43;
  c.library = "nccl";
  c.op = "allreduce";
  c.enter_ns = 1'100'000;
  c.exit_ns = 1'200'000;
  d.collectives.push_back(c);
  c.tid = 44;  // a thread no sample names
  d.collectives.push_back(c);
  auto hist = [&](uint64_t start, const char* le, double v) {
    store::Store::MetricRow m;
    m.start_ns = start;
    m.end_ns = start + 1'000'000;
    m.metric = {42, "os.runq_latency_us.hist", le, v};
    d.counters.push_back(m);
  };
  hist(1'000'000, "le=8", 3);
  hist(1'000'000, "le=128", 1);
  hist(2'000'000, "le=16", 2);
  std::ostringstream out;
  write_chrome_trace(d, out);
  const std::string t = out.str();
  EXPECT_NE(t.find("\"name\":\"thread_name\",\"pid\":42,\"tid\":43,\"args\":{\"name\":\"pt_main_thread (43)\"}"),
            std::string::npos) << t;
  EXPECT_NE(t.find("\"tid\":44,\"args\":{\"name\":\"thread 44\"}"), std::string::npos) << t;
  // One track named after the histogram, its buckets as series in numeric order, zeros filled in.
  EXPECT_EQ(t.find("os.runq_latency_us.hist le="), std::string::npos) << "no track per bucket\n" << t;
  EXPECT_NE(t.find("\"name\":\"os.runq_latency_us.hist\",\"ts\":0.000,\"args\":{\"le=8\":3,\"le=16\":0,\"le=128\":1}"),
            std::string::npos) << t;
  EXPECT_NE(t.find("\"name\":\"os.runq_latency_us.hist\",\"ts\":1000.000,\"args\":{\"le=8\":0,\"le=16\":2,\"le=128\":0}"),
            std::string::npos) << t;
  // The thread's on-CPU share uses its window's own rate: 5 samples in 1 ms at 24 Hz.
  EXPECT_NE(t.find("\"name\":\"on-CPU pt_main_thread (43)\",\"ts\":0.000,\"args\":{\"cpu\":208.333}"), std::string::npos) << t;
}

TEST(Top, LimitAndEmptyProfile) {
  std::ostringstream out;
  write_top(sample_profile(), out, 1);
  EXPECT_EQ(top_section(out.str(), "by self:").size(), 1u) << out.str();
  EXPECT_EQ(top_section(out.str(), "by total:").size(), 1u) << out.str();

  // Unresolved code is named by module and offset alone.
  std::ostringstream all;
  write_top(sample_profile(), all);
  EXPECT_EQ(top_section(all.str(), "by self:").count("libfoo.so+0x1a2b"), 1u) << all.str();

  std::ostringstream empty;
  write_top(Profile{}, empty);
  EXPECT_EQ(empty.str(), "oncpu: 0 samples in total\n");
}

}  // namespace
}  // namespace strata::report
