// The agent's flight recorder (agent/flight_recorder.h): bounded rings per process, queries by
// rank / pid and time window, exited processes kept up to a bound, a reused pid starting afresh,
// and the durations `last=` takes.
#include <gtest/gtest.h>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "agent/flight_recorder.h"

using strata::agent::DrilldownQuery;
using strata::agent::FlightRecorder;
using strata::agent::FlightRecorderLimits;
using strata::agent::parse_duration_ns;

namespace {

strata::store::ProcessInfo proc(uint32_t pid, int rank) {
  strata::store::ProcessInfo p;
  p.pid = pid;
  p.rank = rank;
  p.job = "job";
  return p;
}

strata::store::CollectiveRecord coll(uint32_t pid, uint64_t seq, uint64_t enter_ns) {
  strata::store::CollectiveRecord c;
  c.pid = pid;
  c.op = "allreduce";
  c.seq = seq;
  c.enter_ns = enter_ns;
  c.exit_ns = enter_ns + 5;
  return c;
}

google::protobuf::Struct parse(const std::string& json) {
  google::protobuf::Struct s;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(json, &s).ok()) << json;
  return s;
}

// seq of each collective, per pid, as the JSON lists them.
std::map<uint32_t, std::vector<uint64_t>> seqs(const std::string& json) {
  std::map<uint32_t, std::vector<uint64_t>> out;
  auto root = parse(json);
  for (const auto& p : root.fields().at("processes").list_value().values()) {
    const auto& f = p.struct_value().fields();
    auto& v = out[static_cast<uint32_t>(f.at("pid").number_value())];
    for (const auto& c : f.at("collectives").list_value().values())
      v.push_back(static_cast<uint64_t>(c.struct_value().fields().at("seq").number_value()));
  }
  return out;
}

TEST(FlightRecorder, RingIsBoundedAndCountsWhatItEvicts) {
  FlightRecorderLimits lim;
  lim.collectives_per_process = 4;
  FlightRecorder fr(lim);
  fr.note_process(proc(10, 0));
  for (uint64_t i = 1; i <= 10; ++i) fr.add_collective(coll(10, i, i * 100));
  DrilldownQuery q;
  std::string json = fr.query_json(q, "n0", 2000);
  EXPECT_EQ(seqs(json)[10], (std::vector<uint64_t>{7, 8, 9, 10}));
  auto p = parse(json).fields().at("processes").list_value().values(0).struct_value().fields();
  EXPECT_EQ(p.at("collectives_evicted").number_value(), 6);
  EXPECT_EQ(p.at("collectives_in_window").number_value(), 4);
}

// add_devices (the GPU layer's flush hands a window's records at once, moved in) keeps what
// add_device of each record in turn keeps: order, the bound per process, the evicted count, pids
// interleaved in runs.
TEST(FlightRecorder, AddDevicesIsAddDeviceForEach) {
  FlightRecorderLimits lim;
  lim.device_per_process = 5;
  FlightRecorder one(lim), many(lim);
  std::vector<strata::store::DeviceActivity> rows;
  for (uint32_t pid : {10u, 11u}) {
    one.note_process(proc(pid, static_cast<int>(pid - 10)));
    many.note_process(proc(pid, static_cast<int>(pid - 10)));
  }
  for (uint64_t i = 1; i <= 16; ++i) {
    strata::store::DeviceActivity d;
    d.pid = (i / 3) % 2 ? 11 : 10;  // runs of three of one pid, then the other
    d.kind = i % 4 ? "kernel" : "memcpy";
    d.name = "a_kernel_name_longer_than_the_small_string_buffer_" + std::to_string(i);
    d.start_ns = i * 100;
    d.end_ns = i * 100 + 50;
    d.correlation = i;
    one.add_device(d);
    rows.push_back(d);
  }
  many.add_devices(std::move(rows));
  DrilldownQuery q;
  const std::string a = one.query_json(q, "n0", 5000), b = many.query_json(q, "n0", 5000);
  EXPECT_EQ(a, b);
  auto p = parse(b).fields().at("processes").list_value().values(0).struct_value().fields();
  EXPECT_GT(p.at("device_evicted").number_value(), 0);  // the bound acted
}

TEST(FlightRecorder, WindowRankPidAndLimit) {
  FlightRecorder fr;
  fr.note_process(proc(10, 0));
  fr.note_process(proc(11, 1));
  for (uint64_t i = 1; i <= 10; ++i) {
    fr.add_collective(coll(10, i, i * 100));
    fr.add_collective(coll(11, i, i * 100 + 1));
  }
  DrilldownQuery q;
  q.from_ns = 300;  // starts inside [300, 600]
  q.to_ns = 600;
  auto all = seqs(fr.query_json(q, "n0", 2000));
  EXPECT_EQ(all[10], (std::vector<uint64_t>{3, 4, 5, 6}));
  EXPECT_EQ(all[11], (std::vector<uint64_t>{3, 4, 5}));  // 601 is past the end
  q.rank = 1;
  auto r1 = seqs(fr.query_json(q, "n0", 2000));
  EXPECT_EQ(r1.size(), 1u);
  EXPECT_EQ(r1.count(11), 1u);
  q.rank.reset();
  q.pid = 10;
  q.limit = 2;  // the newest two
  EXPECT_EQ(seqs(fr.query_json(q, "n0", 2000))[10], (std::vector<uint64_t>{5, 6}));
}

TEST(FlightRecorder, ExitedProcessesAreKeptUpToABound) {
  FlightRecorderLimits lim;
  lim.exited_processes = 2;
  FlightRecorder fr(lim);
  for (uint32_t pid = 1; pid <= 4; ++pid) {
    fr.note_process(proc(pid, static_cast<int>(pid)));
    fr.add_collective(coll(pid, 1, 100));
  }
  for (uint32_t pid = 1; pid <= 4; ++pid) fr.note_exit(pid);
  auto s = seqs(fr.query_json(DrilldownQuery{}, "n0", 2000));
  EXPECT_EQ(s.size(), 2u);  // the two that ended last
  EXPECT_EQ(s.count(3), 1u);
  EXPECT_EQ(s.count(4), 1u);
}

TEST(FlightRecorder, ReusedPidStartsAfresh) {
  FlightRecorder fr;
  fr.note_process(proc(10, 0));
  fr.add_collective(coll(10, 1, 100));
  fr.note_exit(10);
  fr.note_process(proc(10, 3));  // another process got the pid
  fr.add_collective(coll(10, 1, 500));
  auto json = fr.query_json(DrilldownQuery{}, "n0", 2000);
  EXPECT_EQ(seqs(json)[10].size(), 1u);
  auto p = parse(json).fields().at("processes").list_value().values(0).struct_value().fields();
  EXPECT_EQ(p.at("rank").number_value(), 3);
  EXPECT_TRUE(p.at("alive").bool_value());
}

TEST(FlightRecorder, Durations) {
  EXPECT_EQ(parse_duration_ns("30s"), 30'000'000'000ull);
  EXPECT_EQ(parse_duration_ns("30"), 30'000'000'000ull);
  EXPECT_EQ(parse_duration_ns("500ms"), 500'000'000ull);
  EXPECT_EQ(parse_duration_ns("2m"), 120'000'000'000ull);
  EXPECT_EQ(parse_duration_ns("1h"), 3'600'000'000'000ull);
  EXPECT_EQ(parse_duration_ns("1.5s"), 1'500'000'000ull);
  for (const char* bad : {"", "s", "soon", "-1s", "1d", "1e3s", "1..2s", "99999999999999999999h"})
    EXPECT_FALSE(parse_duration_ns(bad).has_value()) << bad;
}

}  // namespace
