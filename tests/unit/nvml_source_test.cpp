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
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500)) << "joins its thread";
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
