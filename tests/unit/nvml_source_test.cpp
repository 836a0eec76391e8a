// The NVML source against the testbed's libnvidia-ml.so.1 stand-in: healthy GPUs at their maximum
// clocks without slowdown reasons; an injected throttle (gpu-state, as strata-sim writes it) shows
// as lowered SM clocks and throttle reasons in the flushed metrics. And it fails safe without NVML.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <thread>

#include "agent/gpu/nvml_source.h"
#include "store/store.h"
#include "testbed/include/testbed/gpu_state.h"
#include "tests/support/run.h"

namespace strata::agent {
namespace {

// Metrics of one flush, by (label, name).
using Flushed = std::map<std::pair<std::string, std::string>, double>;

double at(const Flushed& m, const std::string& label, const std::string& name) {
  auto it = m.find({label, name});
  return it == m.end() ? -1 : it->second;
}
bool has(const Flushed& m, const std::string& label, const std::string& name) { return m.count({label, name}) > 0; }

std::string nvml_library() {
  const char* lib = std::getenv("STRATA_NVML_LIBRARY");
  if (lib && *lib) return lib;
  const char* build = std::getenv("STRATA_BUILD");
  return std::string(build ? build : "build") + "/testbed/lib/libnvidia-ml.so.1";
}

// One testbed directory for the whole binary: the stand-in maps its gpu-state once per process.
class NvmlSourceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    setenv("STRATA_TESTBED_DIR", dir_->path().c_str(), 1);
    setenv("STRATA_TESTBED_GPUS", "2", 1);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  void SetUp() override {
    auto st = store::Store::open_sqlite(db_.file("s.db"), store::Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    store_ = std::move(*st);
    auto rec = store_->begin_recording({"node", "test", 1, 99, 1});
    ASSERT_TRUE(rec);
    recording_ = *rec;
  }

  // The gpu-state file the stand-in created (after nvmlInit), mapped to inject faults.
  strata_gpu_state* gpu_state() {
    int fd = open((dir_->path() + "/gpu-state").c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return nullptr;
    void* p = mmap(nullptr, sizeof(strata_gpu_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? nullptr : static_cast<strata_gpu_state*>(p);
  }

  Flushed flush(Source& s) {
    uint64_t start = ++window_ * 1000;
    WindowContext w;
    w.recording = recording_;
    w.start_ns = start;
    w.end_ns = start + 1000;
    EXPECT_TRUE(store_->begin());
    auto st = s.flush(*store_, w);
    EXPECT_TRUE(st) << st.error().message;
    EXPECT_TRUE(store_->commit());
    Flushed out;
    auto rows = store_->metrics("gpu.", recording_);
    EXPECT_TRUE(rows) << rows.error().message;
    if (!rows) return out;
    for (const auto& r : *rows) {
      EXPECT_EQ(r.metric.pid, 0u) << "node metrics";
      if (r.start_ns == start) out[{r.metric.label, r.metric.name}] = r.metric.value;
    }
    return out;
  }

  static test::TempDir* dir_;
  test::TempDir db_;
  std::unique_ptr<store::Store> store_;
  int64_t recording_ = 0;
  uint64_t window_ = 0;
};
test::TempDir* NvmlSourceTest::dir_ = nullptr;

TEST_F(NvmlSourceTest, HealthyThenThrottled) {
  NvmlOptions o;
  o.library = nvml_library();
  o.thread = false;
  o.period_s = 0;  // every poll() samples
  auto src = start_nvml_source(o);
  ASSERT_TRUE(src) << src.error().message;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*src)->poll());
  Flushed m = flush(**src);

  for (const std::string gpu : {"gpu0", "gpu1"}) {
    SCOPED_TRACE(gpu);
    EXPECT_EQ(at(m, gpu, "gpu.polls"), 3);
    EXPECT_EQ(at(m, gpu, "gpu.max_sm_clock_mhz"), 1980);
    EXPECT_EQ(at(m, gpu, "gpu.sm_clock_mhz"), 1980) << "a healthy GPU runs at its maximum clock";
    EXPECT_EQ(at(m, gpu, "gpu.sm_clock_min_mhz"), 1980);
    EXPECT_EQ(at(m, gpu, "gpu.throttled"), 0);
    EXPECT_FALSE(has(m, gpu, "gpu.throttle.hw_slowdown"));
    EXPECT_EQ(static_cast<uint64_t>(at(m, gpu, "gpu.throttle_reasons")) & ~1ull, 0u) << "at most gpu_idle";
    EXPECT_LT(at(m, gpu, "gpu.temp_c"), 80);
    EXPECT_GT(at(m, gpu, "gpu.power_w"), 0);
    EXPECT_EQ(at(m, gpu, "gpu.mem_total_mb"), 80 * 1024);
    EXPECT_GE(at(m, gpu, "gpu.mem_used_mb"), 512);
    EXPECT_TRUE(has(m, gpu, "gpu.util_pct"));
  }
  EXPECT_FALSE(has(m, "gpu0", "gpu.pcie_tx_mb_s")) << "the stand-in has no PCIe throughput call: skipped quietly";
  // A healthy board's hardware series: no new errors, the PCIe link at its full width.
  EXPECT_EQ(at(m, "gpu0", "gpu.ecc_uncorrected"), 0);
  EXPECT_EQ(at(m, "gpu0", "gpu.pcie_replays"), 0);
  EXPECT_EQ(at(m, "gpu0", "gpu.nvlink_errors"), 0);
  EXPECT_EQ(at(m, "gpu0", "gpu.pcie_link_width"), at(m, "gpu0", "gpu.pcie_link_max_width"));
  EXPECT_FALSE(has(m, "gpu0", "gpu.lost"));

  strata_gpu_state* gs = gpu_state();
  ASSERT_NE(gs, nullptr);
  ASSERT_EQ(gs->num_devices, 2u);
  gs->dev[1].slowdown = 2.0f;
  gs->dev[1].throttle_reasons = 0x08 | 0x40;  // hw_slowdown | hw_thermal
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*src)->poll());
  m = flush(**src);
  gs->dev[1].slowdown = 1.0f;
  gs->dev[1].throttle_reasons = 0;
  munmap(gs, sizeof(*gs));

  EXPECT_EQ(at(m, "gpu1", "gpu.polls"), 4);
  EXPECT_EQ(at(m, "gpu1", "gpu.sm_clock_mhz"), 990);
  EXPECT_EQ(at(m, "gpu1", "gpu.sm_clock_min_mhz"), 990);
  EXPECT_EQ(at(m, "gpu1", "gpu.max_sm_clock_mhz"), 1980);
  EXPECT_EQ(static_cast<uint64_t>(at(m, "gpu1", "gpu.throttle_reasons")), 0x48u);
  EXPECT_EQ(at(m, "gpu1", "gpu.throttle.hw_slowdown"), 1);
  EXPECT_EQ(at(m, "gpu1", "gpu.throttle.hw_thermal"), 1);
  EXPECT_EQ(at(m, "gpu1", "gpu.throttled"), 1);
  EXPECT_GE(at(m, "gpu1", "gpu.temp_max_c"), 85);
  // The other GPU is untouched.
  EXPECT_EQ(at(m, "gpu0", "gpu.sm_clock_mhz"), 1980);
  EXPECT_EQ(at(m, "gpu0", "gpu.throttled"), 0);

  std::vector<std::pair<std::string, double>> stats;
  (*src)->stats(stats);
  std::map<std::string, double> sm(stats.begin(), stats.end());
  EXPECT_EQ(sm["nvml.devices"], 2);
  EXPECT_EQ(sm["nvml.polls"], 7);
  EXPECT_EQ(sm["nvml.errors"], 0);
}

// The stand-in's hardware faults (strata-sim's gpu-ecc, pcie-degraded, nvlink-errors, gpu-xid:code=79)
// reach the stored series the diagnosis reads: counters new in the window, the link's width, a lost GPU.
TEST_F(NvmlSourceTest, HardwareFaultsReachTheSeries) {
  NvmlOptions o;
  o.library = nvml_library();
  o.thread = false;
  o.period_s = 0;
  auto src = start_nvml_source(o);
  ASSERT_TRUE(src) << src.error().message;
  ASSERT_TRUE((*src)->poll());
  Flushed m = flush(**src);  // the counters' baselines
  EXPECT_EQ(at(m, "gpu1", "gpu.ecc_uncorrected"), 0);

  strata_gpu_state* gs = gpu_state();
  ASSERT_NE(gs, nullptr);
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  gs->dev[1].hw_since_ns = static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(now.tv_nsec) - 10'000'000'000ull;
  gs->dev[1].hw_faults = STRATA_HW_ECC | STRATA_HW_PCIE | STRATA_HW_NVLINK;
  ASSERT_TRUE((*src)->poll());
  m = flush(**src);
  EXPECT_GE(at(m, "gpu1", "gpu.ecc_uncorrected"), 1);
  EXPECT_GE(at(m, "gpu1", "gpu.pcie_replays"), 10);
  EXPECT_GE(at(m, "gpu1", "gpu.nvlink_errors"), 10);
  EXPECT_LT(at(m, "gpu1", "gpu.pcie_link_width"), at(m, "gpu1", "gpu.pcie_link_max_width"));
  EXPECT_EQ(at(m, "gpu0", "gpu.ecc_uncorrected"), 0) << "the other GPU is untouched";

  gs->dev[1].hw_faults = STRATA_HW_LOST;
  ASSERT_TRUE((*src)->poll());
  m = flush(**src);
  gs->dev[1].hw_faults = 0;
  munmap(gs, sizeof(*gs));
  EXPECT_EQ(at(m, "gpu1", "gpu.lost"), 1);
  EXPECT_FALSE(has(m, "gpu0", "gpu.lost"));
}

uint64_t mono_now_ns() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(now.tv_nsec);
}

// strata-sim's gpu-xid fault as the injector writes it: when and which Xid, then the fault bits.
void raise_xid(strata_gpu_state* gs, unsigned dev, uint32_t xid, uint32_t bits) {
  gs->dev[dev].hw_since_ns = mono_now_ns();
  gs->dev[dev].xid = xid;
  __atomic_store_n(&gs->dev[dev].hw_faults, bits, __ATOMIC_RELEASE);
}
void clear_xid(strata_gpu_state* gs, unsigned dev) {
  gs->dev[dev].hw_faults = 0;
  gs->dev[dev].xid = 0;
}

std::map<std::string, double> stats_of(Source& s) {
  std::vector<std::pair<std::string, double>> stats;
  s.stats(stats);
  return {stats.begin(), stats.end()};
}

// NVML's event API (the stand-in's, from the shared GPU state): an Xid raised on one GPU is a
// gpu.xid row of that GPU in the window it arrived in, once.
TEST_F(NvmlSourceTest, XidEventsReachTheirGpuOnce) {
  NvmlOptions o;
  o.library = nvml_library();
  o.thread = false;
  o.period_s = 0;
  o.kernel_log.clear();
  auto src = start_nvml_source(o);
  ASSERT_TRUE(src) << src.error().message;
  auto st = stats_of(**src);
  EXPECT_EQ(st["nvml.xid_event_devices"], 2) << "both GPUs take the Xid registration";
  EXPECT_EQ(st["nvml.xid_kernel_log"], 0);
  ASSERT_TRUE((*src)->poll());
  Flushed m = flush(**src);
  EXPECT_FALSE(has(m, "gpu0", "gpu.xid"));
  EXPECT_FALSE(has(m, "gpu1", "gpu.xid"));

  strata_gpu_state* gs = gpu_state();
  ASSERT_NE(gs, nullptr);
  raise_xid(gs, 1, 79, STRATA_HW_LOST);
  ASSERT_TRUE((*src)->poll());
  m = flush(**src);
  EXPECT_EQ(at(m, "gpu1", "gpu.xid"), 79);
  EXPECT_EQ(at(m, "gpu1", "gpu.lost"), 1);
  EXPECT_FALSE(has(m, "gpu0", "gpu.xid")) << "the other GPU raised nothing";
  ASSERT_TRUE((*src)->poll());
  m = flush(**src);
  EXPECT_FALSE(has(m, "gpu1", "gpu.xid")) << "an Xid is one event, not a state";
  clear_xid(gs, 1);

  raise_xid(gs, 0, 48, STRATA_HW_ECC);
  ASSERT_TRUE((*src)->poll());
  m = flush(**src);
  clear_xid(gs, 0);
  munmap(gs, sizeof(*gs));
  EXPECT_EQ(at(m, "gpu0", "gpu.xid"), 48);
  EXPECT_FALSE(has(m, "gpu1", "gpu.xid"));
  EXPECT_EQ(stats_of(**src)["nvml.xids"], 2);
}

// An Xid raised before the source started is not this run's.
TEST_F(NvmlSourceTest, XidRaisedBeforeStartIsNotReported) {
  strata_gpu_state* gs = nullptr;
  {
    NvmlOptions o;
    o.library = nvml_library();
    o.thread = false;
    auto first = start_nvml_source(o);  // creates the gpu-state file
    ASSERT_TRUE(first) << first.error().message;
    gs = gpu_state();
  }
  ASSERT_NE(gs, nullptr);
  raise_xid(gs, 1, 48, STRATA_HW_ECC);
  NvmlOptions o;
  o.library = nvml_library();
  o.thread = false;
  o.period_s = 0;
  o.kernel_log.clear();
  auto src = start_nvml_source(o);
  ASSERT_TRUE(src) << src.error().message;
  ASSERT_TRUE((*src)->poll());
  Flushed m = flush(**src);
  clear_xid(gs, 1);
  munmap(gs, sizeof(*gs));
  EXPECT_FALSE(has(m, "gpu1", "gpu.xid"));
}

// On its own thread, the Xid reaches the window without poll() (the record loop never waits on it).
TEST_F(NvmlSourceTest, XidEventsOnTheSourcesThread) {
  NvmlOptions o;
  o.library = nvml_library();
  o.period_s = 0.05;
  o.kernel_log.clear();
  auto src = start_nvml_source(o);
  ASSERT_TRUE(src) << src.error().message;
  (*src)->start_threads();
  strata_gpu_state* gs = gpu_state();
  ASSERT_NE(gs, nullptr);
  raise_xid(gs, 0, 74, STRATA_HW_NVLINK);
  bool seen = false;
  // Generous: a loaded machine may take long to schedule the thread; the test asserts arrival only.
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
       !seen && std::chrono::steady_clock::now() < deadline;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    seen = at(flush(**src), "gpu0", "gpu.xid") == 74;
  }
  clear_xid(gs, 0);
  munmap(gs, sizeof(*gs));
  EXPECT_TRUE(seen);
}

// Recorded kernel log lines: /dev/kmsg records and dmesg text, Xids of several drivers' formats,
// and lines that are not (or no longer) an Xid.
TEST(KernelXid, ParsesRecordedLines) {
  struct Ok {
    const char* line;
    unsigned domain, bus, device, code;
  };
  const Ok good[] = {
      {"6,2207,123456789,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", 0, 0x3b, 0, 79},
      {"[ 1234.567890] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception", 0,
       0xcb, 0, 13},
      {"4,881,9,-;NVRM: Xid (0000:18:00): 48, An uncorrectable double bit error (DBE) has been detected", 0, 0x18, 0, 48},
      {"NVRM: Xid (PCI:0001:a4:1f.0): 74, pid=99, NVLink: fatal error detected on link 3", 1, 0xa4, 0x1f, 74},
      {"Dec  2 01:02:03 node kernel: NVRM: Xid (PCI:0000:5d:00): 999, Unknown", 0, 0x5d, 0, 999},
      {"NVRM: Xid (PCI:0000:9a:00): 94", 0, 0x9a, 0, 94},
  };
  for (const auto& g : good) {
    SCOPED_TRACE(g.line);
    auto x = parse_kernel_xid(g.line);
    ASSERT_TRUE(x.has_value());
    EXPECT_EQ(x->domain, g.domain);
    EXPECT_EQ(x->bus, g.bus);
    EXPECT_EQ(x->device, g.device);
    EXPECT_EQ(x->code, g.code);
  }
  const char* bad[] = {
      "",
      "6,2208,123456790,-;NVRM: GPU at PCI:0000:3b:00: GPU-5747b5a1-7e57-4bed-8000-000000000000",
      "6,2209,123456791,-;NVRM: GPU Board Serial Number: 1234",
      " SUBSYSTEM=pci",                                  // a /dev/kmsg record's continuation line
      "NVRM: Xid (PCI:0000:3b:00)",                      // cut before the code
      "NVRM: Xid (PCI:0000:3b:00): ",                    // no code
      "NVRM: Xid (PCI:0000:3b:00): abc, pid=1",          // not a number
      "NVRM: Xid (PCI:0000:3b:00): 0, pid=1",            // no Xid is 0
      "NVRM: Xid (PCI:0000:3b:00): 79x, pid=1",          // trailing garbage in the code
      "NVRM: Xid (PCI:0000:3b:00): 99999999999, pid=1",  // out of range
      "NVRM: Xid (PCI:0000:3b): 79, pid=1",              // no device
      "NVRM: Xid (PCI:0000:3b:20): 79, pid=1",           // a PCI device number is at most 0x1f
      "NVRM: Xid (PCI:0000:13b:00): 79, pid=1",          // a bus number is one byte
      "NVRM: Xid (PCI:zzzz:3b:00): 79, pid=1",
      "NVRM: Xid PCI:0000:3b:00: 79",
      "\x01\xff\xfeNVRM: Xid (\x80",
  };
  for (const char* b : bad) EXPECT_FALSE(parse_kernel_xid(b).has_value()) << b;
}

// Where NVML refuses Xid events, the kernel log is read (here a file of log lines, as /dev/kmsg
// gives them): a line naming a GPU's PCI address is that GPU's Xid; other lines, other buses and
// lines from before the start are not.
TEST_F(NvmlSourceTest, KernelLogXidsWithoutEvents) {
  setenv("STRATA_TESTBED_NVML_EVENTS", "0", 1);
  test::TempDir logdir;
  std::string log = logdir.file("kmsg");
  FILE* f = fopen(log.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("6,1,1,-;NVRM: Xid (PCI:0000:24:00): 48, from before the agent started\n", f);
  fflush(f);
  NvmlOptions o;
  o.library = nvml_library();
  o.thread = false;
  o.period_s = 0;
  o.kernel_log = log;
  auto src = start_nvml_source(o);
  unsetenv("STRATA_TESTBED_NVML_EVENTS");
  ASSERT_TRUE(src) << src.error().message;
  auto st = stats_of(**src);
  EXPECT_EQ(st["nvml.xid_event_devices"], 0);
  EXPECT_EQ(st["nvml.xid_kernel_log"], 1);
  // The stand-in's GPU 1 sits on bus 0x24 (nvmlDeviceGetPciInfo_v3).
  fputs("6,2,2,-;NVRM: GPU at PCI:0000:24:00: GPU-5747b5a1\n"
        "garbage \x01\x02 line\n"
        "6,3,3,-;NVRM: Xid (PCI:0000:77:00): 13, pid=1, a GPU of another node's log\n"
        "6,4,4,-;NVRM: Xid (PCI:0000:24:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
        " SUBSYSTEM=pci\n"
        "6,5,5,-;NVRM: Xid (PCI:0000:24:00): 4",  // the rest of this line comes later
        f);
  fflush(f);
  ASSERT_TRUE((*src)->poll());
  Flushed m = flush(**src);
  EXPECT_EQ(at(m, "gpu1", "gpu.xid"), 79);
  EXPECT_FALSE(has(m, "gpu0", "gpu.xid"));
  fputs("8, pid=1, the line completed\n", f);
  fclose(f);
  ASSERT_TRUE((*src)->poll());
  m = flush(**src);
  EXPECT_EQ(at(m, "gpu1", "gpu.xid"), 48) << "a line split across reads is one line";
  EXPECT_EQ(stats_of(**src)["nvml.xids"], 2);
}

// The live kernel log: /dev/kmsg opened from its end (nothing from before counts) and read on the
// Xid thread without blocking it; where it cannot be opened (no CAP_SYSLOG, no /dev/kmsg) the source
// runs without it. Either way it stops.
TEST_F(NvmlSourceTest, LiveKernelLogOpensOrFailsSafe) {
  setenv("STRATA_TESTBED_NVML_EVENTS", "0", 1);
  NvmlOptions o;
  o.library = nvml_library();
  o.period_s = 0.05;
  auto src = start_nvml_source(o);  // kernel_log: /dev/kmsg
  unsetenv("STRATA_TESTBED_NVML_EVENTS");
  ASSERT_TRUE(src) << src.error().message;
  int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  const bool readable = fd >= 0;
  if (fd >= 0) close(fd);
  EXPECT_EQ(stats_of(**src)["nvml.xid_kernel_log"], readable ? 1 : 0);
  (*src)->start_threads();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Flushed m = flush(**src);
  EXPECT_GE(at(m, "gpu0", "gpu.polls"), 1);
  // The stand-in's GPUs raise no Xid, and none from before the start counts: this machine's log
  // holds no Xid for their PCI addresses from now on (no NVIDIA driver here).
  EXPECT_FALSE(has(m, "gpu0", "gpu.xid"));
  src->reset();  // joins its threads (a thread blocked on the log would hang here)
}

TEST_F(NvmlSourceTest, PollsOnItsOwnThreadAndStopsPromptly) {
  NvmlOptions o;
  o.library = nvml_library();
  o.period_s = 0.02;
  auto src = start_nvml_source(o);
  ASSERT_TRUE(src) << src.error().message;
  (*src)->start_threads();  // the agent starts it once its privileges are dropped
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ASSERT_TRUE((*src)->poll());
  Flushed m = flush(**src);
  EXPECT_GE(at(m, "gpu0", "gpu.polls"), 2);
  EXPECT_EQ(at(m, "gpu0", "gpu.sm_clock_mhz"), 1980);
  auto t0 = std::chrono::steady_clock::now();
  src->reset();
  // The Xid thread stops after its round: NVML's event wait (1 s a round) cannot be interrupted.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(2500)) << "joins its thread";
}

TEST_F(NvmlSourceTest, FailsSafeWithoutNvml) {
  NvmlOptions o;
  o.library = "/nonexistent/libnvidia-ml.so.1";
  auto src = start_nvml_source(o);
  ASSERT_FALSE(src);
  EXPECT_NE(src.error().message.find("cannot load"), std::string::npos) << src.error().message;

  o.library = "libc.so.6";  // loads, but is no NVML
  src = start_nvml_source(o);
  ASSERT_FALSE(src);
  EXPECT_NE(src.error().message.find("not an NVML library"), std::string::npos) << src.error().message;

  // The default path honours STRATA_NVML_LIBRARY.
  const char* saved = std::getenv("STRATA_NVML_LIBRARY");
  std::string keep = saved ? saved : "";
  setenv("STRATA_NVML_LIBRARY", "/nonexistent/nvml.so", 1);
  src = start_nvml_source(NvmlOptions{});
  ASSERT_FALSE(src);
  EXPECT_NE(src.error().message.find("/nonexistent/nvml.so"), std::string::npos);
  if (saved) setenv("STRATA_NVML_LIBRARY", keep.c_str(), 1);
  else unsetenv("STRATA_NVML_LIBRARY");
}

}  // namespace
}  // namespace strata::agent
