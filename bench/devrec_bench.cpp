// strata-devrec-bench [--capture PATH] [--times K] [--runs N] [--no-flight-recorder]:
// the node pipeline's CPU per GPU device record (issue 15, "the agent's own CPU"), without root.
//
// A capture (default: the replay test's, tests/data/replay/sim.cap: a 2-rank strata-sim job with
// a device timeline) is replayed twice per run through the pipeline as `strata agent` runs it
// (flight recorder on), into a sink that keeps nothing: once as it is, once with every kernel,
// memcpy and memset record of its device timeline reads repeated K times (collectives once, so
// the API-to-device matching stays as it was). The extra CPU divided by the extra device records
// is the cost of one device record: the timeline read, the per-window flush (summary by name,
// the cap, to unix time), the flight recorder and handing the rows to the sink. Reading and
// decompressing the capture file is timed alone and taken out; decoding a replayed timeline
// batch (each name viewed in the batch, as the live reader views it in its copy out of the ring) stays in.
// The per-window cap (20,000 raw records per process, the rest summarized) applies as in the
// agent. Prints each run and the median; CPU is the process's (every thread).
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "abi/gpu_timeline.h"
#include "agent/capture.h"
#include "agent/engine.h"
#include "store/store.h"

using namespace strata;
using namespace strata::agent;

namespace {

// Keeps nothing; counts the device rows it was handed.
class NullWriter final : public store::Writer {
 public:
  Result<int64_t> begin_recording(const store::RecordingInfo&) override { return 1; }
  Status end_recording(int64_t, uint64_t) override { return {}; }
  Status put_process(int64_t, const store::ProcessInfo&) override { return {}; }
  Result<int64_t> intern_stack(const Stack&, store::UnwindMethod) override { return ++stacks_; }
  Status put_window(int64_t, uint64_t, uint64_t, store::CountKind, const std::vector<store::StackCount>&,
                    const store::WindowFidelity&) override {
    return {};
  }
  Status put_stat(int64_t, const std::string&, double) override { return {}; }
  Status put_metrics(int64_t, uint64_t, uint64_t, const std::vector<store::Metric>&) override { return {}; }
  Status put_communicators(int64_t, const std::vector<store::CommunicatorRecord>&) override { return {}; }
  Status put_collectives(int64_t, const std::vector<store::CollectiveRecord>&) override { return {}; }
  Status put_device_activity(int64_t, const std::vector<store::DeviceActivity>& r) override {
    device_rows += r.size();
    return {};
  }
  Status put_steps(int64_t, const std::vector<store::StepRecord>&) override { return {}; }
  Status put_launch_samples(int64_t, uint64_t, uint64_t, const std::vector<store::LaunchSample>&) override {
    return {};
  }
  Result<std::vector<store::FrameRow>> unsymbolized_frames() override { return std::vector<store::FrameRow>{}; }
  Status update_frame_symbols(const std::vector<store::FrameRow>&) override { return {}; }
  Status begin() override { return {}; }
  Status commit() override { return {}; }
  uint64_t device_rows = 0;

 private:
  int64_t stacks_ = 0;
};

uint64_t cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(t.tv_nsec);
}

// One kTimelineRead payload (gpu_comm_source.cpp's encode_timeline) with its non-collective
// records repeated `times` times; `records` counts the records it holds.
std::string amplify(const std::string& payload, int times, uint64_t& records) {
  ByteReader r(payload);
  ByteWriter w;
  w.u32(r.u32());  // pid
  w.u64(r.u64());  // lost
  const uint32_t n = r.u32();
  std::vector<std::string> out;
  for (uint32_t i = 0; i < n; ++i) {
    ByteWriter one;
    const uint32_t kind = r.u32();
    one.u32(kind);
    one.i64(r.i64());
    for (int k = 0; k < 7; ++k) one.u64(r.u64());
    one.i64(r.i64());
    one.str(r.str());
    const int copies = kind == STRATA_TL_COLLECTIVE ? 1 : times;
    for (int c = 0; c < copies; ++c) out.push_back(one.data());
  }
  if (!r.at_end()) {
    std::cerr << "strata-devrec-bench: a timeline record does not decode\n";
    std::exit(2);
  }
  w.u32(static_cast<uint32_t>(out.size()));
  records += out.size();
  std::string s = w.take();
  for (const auto& o : out) s += o;
  return s;
}

// Writes `c` with its timeline reads amplified `times` times to `path`; returns the device records.
uint64_t write_amplified(const Capture& c, int times, const std::string& path) {
  auto w = CaptureWriter::create(path, c.header);
  if (!w) {
    std::cerr << "strata-devrec-bench: " << w.error().message << "\n";
    std::exit(2);
  }
  uint64_t records = 0;
  for (const auto& rec : c.records) {
    if (rec.kind == CaptureKind::kTimelineRead) (*w)->put(rec.kind, amplify(rec.payload, times, records));
    else (*w)->put(rec.kind, rec.payload);
  }
  if (auto st = (*w)->close(); !st) {
    std::cerr << "strata-devrec-bench: " << st.error().message << "\n";
    std::exit(2);
  }
  return records;
}

struct RunCost {
  uint64_t pipeline_ns = 0;  // replay minus reading the file
  uint64_t rows = 0;
};

RunCost replay_once(const std::string& path, bool flight) {
  RunCost c;
  uint64_t t0 = cpu_ns();
  { auto cap = read_capture(path); }
  uint64_t read_ns = cpu_ns() - t0;
  NullWriter sink;
  std::ostringstream log;
  t0 = cpu_ns();
  auto r = replay_capture(path, sink, log, ReplayOptions{.flight_recorder = flight});
  uint64_t all = cpu_ns() - t0;
  if (!r) {
    std::cerr << "strata-devrec-bench: " << r.error().message << "\n" << log.str();
    std::exit(3);
  }
  c.pipeline_ns = all > read_ns ? all - read_ns : 0;
  c.rows = sink.device_rows;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  std::string capture = std::string(STRATA_SOURCE_DIR) + "/tests/data/replay/sim.cap";
  int times = 200, runs = 3;
  bool flight = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--capture" && i + 1 < argc) capture = argv[++i];
    else if (a == "--times" && i + 1 < argc) times = std::atoi(argv[++i]);
    else if (a == "--runs" && i + 1 < argc) runs = std::atoi(argv[++i]);
    else if (a == "--no-flight-recorder") flight = false;
    else {
      std::cerr << "usage: strata-devrec-bench [--capture PATH] [--times K] [--runs N] [--no-flight-recorder]\n";
      return 1;
    }
  }
  if (times < 2 || runs < 1) {
    std::cerr << "strata-devrec-bench: --times must be >= 2, --runs >= 1\n";
    return 1;
  }
  auto c = read_capture(capture);
  if (!c) {
    std::cerr << "strata-devrec-bench: " << c.error().message << "\n";
    return 2;
  }
  const std::string base = "/tmp/strata-devrec-bench-" + std::to_string(getpid()) + "-1.cap";
  const std::string big = "/tmp/strata-devrec-bench-" + std::to_string(getpid()) + "-k.cap";
  const uint64_t n1 = write_amplified(*c, 1, base);
  const uint64_t nk = write_amplified(*c, times, big);
  std::printf("capture %s: %llu device records; x%d (kernels, copies, memsets): %llu; flight recorder %s\n",
              capture.c_str(), static_cast<unsigned long long>(n1), times, static_cast<unsigned long long>(nk),
              flight ? "on" : "off");
  std::vector<double> per;
  for (int i = 0; i < runs; ++i) {
    RunCost a = replay_once(base, flight);
    RunCost b = replay_once(big, flight);
    double ns = (static_cast<double>(b.pipeline_ns) - static_cast<double>(a.pipeline_ns)) /
                static_cast<double>(nk - n1);
    per.push_back(ns);
    std::printf("run %d: base %.1f ms (%llu rows stored), x%d %.1f ms (%llu rows stored): %.0f CPU ns per device record\n",
                i + 1, a.pipeline_ns / 1e6, static_cast<unsigned long long>(a.rows), times, b.pipeline_ns / 1e6,
                static_cast<unsigned long long>(b.rows), ns);
  }
  std::sort(per.begin(), per.end());
  std::printf("median: %.0f CPU ns per device record (%d runs)\n", per[per.size() / 2], runs);
  unlink(base.c_str());
  unlink(big.c_str());
  return 0;
}
