// Where a rank makes its device-memory calls: the agent's sampled launch rows of the memory calls
// ("[cudaMemcpy]" with the call's stack) read back through the store, summarized by the loader per
// rank as API and call site (the innermost resolved frame outside the CUDA runtime), and named by the
// memory-call causes' culprit and evidence with the site's share of the sampled calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>

#include "diagnose/engine.h"
#include "diagnose/loader.h"
#include "diagnose/render.h"
#include "diagnose/synthetic.h"
#include "store/store.h"
#include "tests/support/run.h"

namespace strata::diagnose {
namespace {

Frame native(const std::string& fn, const std::string& module = "/opt/job/bin/train") {
  Frame f;
  f.kind = FrameKind::kNative;
  f.build_id = "ab12";
  f.module = module;
  f.offset = 0x100 + fn.size();
  f.function = fn;
  return f;
}

Frame python(const std::string& fn, const std::string& file) {
  Frame f;
  f.kind = FrameKind::kPython;
  f.function = fn;
  f.file = file;
  f.line = 7;
  return f;
}

// The calls a rank's sampled memory calls name, "API|site=count ..." sorted by name.
std::string sites(const JobWindow& job, const RankWindow& r) {
  std::vector<std::string> all;
  for (const auto& v : r.memory_call_sites) all.push_back(job.names.name(v.name) + "=" + std::to_string(static_cast<int>(v.ms_per_step)));
  std::sort(all.begin(), all.end());
  std::string o;
  for (const auto& s : all) o += s + " ";
  return o;
}

constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;
constexpr uint64_t kMs = 1'000'000;

// A 4-rank job on one node, 60 steps of 100 ms on every rank, metric and launch windows of 1 s from
// the first step on. The window diagnosed starts after the 2 warm-up steps (0.2 s in), so the first
// window straddles its start. Rank 1 makes synchronous copies from `copy_stacks` in the windows after
// it; every rank makes one readback per window from `main`.
struct MemoryJob {
  test::TempDir dir;
  std::unique_ptr<store::Store> st;

  // `oncpu`: rank 1's on-CPU stacks, 5 samples of each in every window.
  explicit MemoryJob(const std::vector<Stack>& copy_stacks, const std::vector<Stack>& oncpu = {}) {
    auto s = store::Store::open_sqlite(dir.file("s.db"), store::Store::Mode::kCreateOrAppend);
    EXPECT_TRUE(s) << s.error().message;
    st = std::move(*s);
    store::Store& w = *st;
    EXPECT_TRUE(w.begin());
    auto rec = w.begin_recording({"node-1", "train", kT0, 99, 1});
    EXPECT_TRUE(rec);
    Frame runtime = native("cudaMemcpy", "/usr/local/cuda/lib64/libcudart.so.13");
    auto readback = w.intern_stack({runtime, native("main"), native("__libc_start_call_main", "/usr/lib/x86_64-linux-gnu/libc.so.6")});
    EXPECT_TRUE(readback);
    std::vector<int64_t> copy_ids;
    for (const auto& stack : copy_stacks) {
      auto id = w.intern_stack(stack);
      EXPECT_TRUE(id);
      copy_ids.push_back(*id);
    }
    std::vector<store::StackCount> counts;
    for (const auto& stack : oncpu) {
      auto id = w.intern_stack(stack);
      EXPECT_TRUE(id);
      counts.push_back({101, 101, "train", *id, 5});
    }
    for (int rank = 0; rank < 4; ++rank) {
      store::ProcessInfo p;
      p.pid = 100 + static_cast<uint32_t>(rank);
      p.node = "node-1";
      p.comm = "train";
      p.job = "memjob";
      p.rank = rank;
      p.world_size = 4;
      p.start_ns = kT0;
      EXPECT_TRUE(w.put_process(*rec, p));
      std::vector<store::StepRecord> steps;
      uint64_t t = kT0;
      for (uint64_t i = 1; i <= 60; ++i) {
        store::StepRecord s;
        s.pid = p.pid;
        s.step = i;
        s.start_ns = t;
        t += 100 * kMs;
        s.end_ns = t;
        s.collective_ns = 10 * kMs;
        steps.push_back(s);
      }
      EXPECT_TRUE(w.put_steps(*rec, steps));
    }
    const uint64_t end = kT0 + 6000 * kMs;
    for (uint64_t ws = kT0; ws < end; ws += 1000 * kMs) {
      const uint64_t we = ws + 1000 * kMs;
      std::vector<store::Metric> metrics;
      std::vector<store::LaunchSample> launches;
      for (int rank = 0; rank < 4; ++rank) {
        const uint32_t pid = 100 + static_cast<uint32_t>(rank);
        metrics.push_back({pid, "api.calls", "cudaMemcpy", 10});
        metrics.push_back({pid, "api.time_us", "cudaMemcpy", 500});
        launches.push_back({pid, pid, "[cudaMemcpy]", *readback, 1});
        launches.push_back({pid, pid, "gemm_kernel", *readback, 50});  // a launch, not a memory call
        if (rank != 1) continue;
        // The straddling window's copies are of a site of their own (so that counting them shows);
        // the later windows' `copy_stacks`, 30 of the first, 10 of each other.
        if (ws == kT0) {
          auto before = w.intern_stack({runtime, native("warmup_check"), native("main")});
          launches.push_back({pid, pid, "[cudaMemcpy]", *before, 40});
        } else {
          for (size_t i = 0; i < copy_ids.size(); ++i) launches.push_back({pid, pid, "[cudaMemcpy]", copy_ids[i], i == 0 ? 30u : 10u});
          launches.push_back({pid, pid, "[cudaMalloc]", *readback, 2});
        }
      }
      if (!counts.empty()) {
        EXPECT_TRUE(w.put_window(*rec, ws, we, store::CountKind::kOnCpu, counts));
      }
      EXPECT_TRUE(w.put_metrics(*rec, ws, we, metrics));
      EXPECT_TRUE(w.put_launch_samples(*rec, ws, we, launches));
    }
    EXPECT_TRUE(w.end_recording(*rec, end));
    EXPECT_TRUE(w.commit());
  }
};

// The loader: the sampled memory calls of the window diagnosed, by API and call site; the runtime's
// own frames, libc, launches of kernels, the stretch before the change and unresolved frames never
// name a site.
TEST(MemoryCallSites, LoaderNamesTheCallSitesOfTheWindow) {
  const Frame runtime = native("cudaMemcpy", "/usr/local/cuda/lib64/libcudart.so.13");
  Frame unresolved = native("");
  unresolved.function.clear();
  MemoryJob j({
      // The copy loop, called through an unresolved frame of the runtime's and one of the program's.
      {runtime, native("", "/usr/local/cuda/lib64/libcudart.so.13"), native("main::{lambda()#3}::operator()() const"),
       native("main")},
      // Only unresolved frames outside the runtime: no site, never an address.
      {runtime, unresolved},
      // A Python program: its innermost Python function, not the interpreter's C frames.
      {runtime, native("THPVariable_item", "/usr/lib/libtorch_python.so"), native("_PyEval_EvalFrameDefault", "/usr/bin/python3.11"),
       python("log_stats", "/srv/train.py"), python("main", "/srv/train.py")},
  });
  auto jw = load_job_window(*j.st);
  ASSERT_TRUE(jw) << jw.error().message;
  ASSERT_EQ(jw->ranks.size(), 4u);
  EXPECT_EQ(sites(*jw, jw->ranks[1]),
            "cudaMalloc|main=10 cudaMemcpy|main::{lambda()#3}::operator()() const=150 cudaMemcpy|main=5 "
            "cudaMemcpy|train.py:log_stats=50 ")
      << "the 5 windows after the window's start (the one straddling it left out: later ones were sampled)";
  EXPECT_EQ(sites(*jw, jw->ranks[0]), "cudaMemcpy|main=5 ");
  for (const auto& r : jw->ranks) {
    for (const auto& v : r.memory_call_sites) {
      const std::string& key = jw->names.name(v.name);
      EXPECT_EQ(key.find("+0x"), std::string::npos) << key;
      EXPECT_EQ(key.find("gemm"), std::string::npos) << key;
    }
  }
}

// The rule: the finding names the site most sampled calls come from, with its share, where the CPU
// profiles pass through no memory call (a copy that sleeps in the driver is on no on-CPU stack).
TEST(MemoryCallSites, SyncMemcpyFindingNamesTheSampledCallSite) {
  SyntheticSpec spec;
  spec.faults = {{3, "sync-memcpy", 40}};
  JobWindow job = make_synthetic_job(spec);
  RankWindow& r = job.ranks[3];
  r.memory_call_sites = {{job.names.id("cudaMemcpy|main::{lambda()#3}::operator()() const"), 90},
                         {job.names.id("cudaMemcpy|main"), 10},
                         {job.names.id("cudaFree|allocate_step"), 500}};  // another kind's: not counted
  normalize(r.memory_call_sites);
  auto dx = diagnose(job);
  ASSERT_FALSE(dx.findings.empty()) << text_of(dx);
  const Finding& f = dx.findings[0];
  ASSERT_EQ(f.cause, Cause::kSyncMemcpy) << text_of(dx);
  EXPECT_EQ(f.culprit, "cudaMemcpy (called from a lambda in main)") << text_of(dx);
  bool said = false;
  for (const auto& e : f.evidence) said |= e.find("90% of rank 3's synchronous copies sampled with their stacks are made from "
                                                   "a lambda in main (90 of 100 calls in the window)") != std::string::npos;
  EXPECT_TRUE(said) << text_of(dx);
}

// Through the store and the loader to the finding: a copy site the CPU profiles never saw.
TEST(MemoryCallSites, ThroughTheStoreToTheFinding) {
  const Frame runtime = native("cudaMemcpy", "/usr/local/cuda/lib64/libcudart.so.13");
  MemoryJob j({{runtime, native("log_activations"), native("main")}});
  auto jw = load_job_window(*j.st);
  ASSERT_TRUE(jw) << jw.error().message;
  // The store holds no profile: make rank 1 the copying straggler its sampled calls say it is.
  SyntheticSpec spec;
  spec.ranks = jw->ranks.size();
  spec.faults = {{1, "sync-memcpy", 40}};
  JobWindow job = make_synthetic_job(spec);
  ASSERT_EQ(job.ranks.size(), jw->ranks.size());
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    for (const auto& v : jw->ranks[i].memory_call_sites) job.ranks[i].memory_call_sites.push_back({job.names.id(jw->names.name(v.name)), v.ms_per_step});
    normalize(job.ranks[i].memory_call_sites);
  }
  auto dx = diagnose(job);
  ASSERT_FALSE(dx.findings.empty()) << text_of(dx);
  EXPECT_EQ(dx.findings[0].cause, Cause::kSyncMemcpy) << text_of(dx);
  EXPECT_EQ(dx.findings[0].culprit, "cudaMemcpy (called from log_activations)") << text_of(dx);
}

// Issue 18: the program's thin wrappers (dev_malloc / dev_free around cudaMalloc / cudaFree) are
// where the sampled calls' innermost program frame is, but not where the program makes them. Rank 3
// churns allocations from churn_step through its wrappers; its on-CPU profile passes through
// dev_free and dev_malloc only inside the calls they wrap. `own_work_ms`: on-CPU time dev_free spends
// outside cudaFree (then it is no wrapper).
Diagnosis churn_through_wrappers(double own_work_ms) {
  SyntheticSpec spec;
  spec.faults = {{3, "memory-alloc-churn", 40}};
  JobWindow job = make_synthetic_job(spec);
  RankWindow& r = job.ranks[3];
  r.memory_call_sites = {{job.names.id("cudaFree|dev_free"), 60}, {job.names.id("cudaMalloc|dev_malloc"), 40}};
  normalize(r.memory_call_sites);
  r.oncpu.push_back({job.names.id("main;train;churn_step;dev_free;cudaFree;[uprobes]"), 2.0});
  r.oncpu.push_back({job.names.id("main;train;churn_step;dev_malloc;cudaMalloc"), 1.0});
  if (own_work_ms > 0) r.oncpu.push_back({job.names.id("main;train;churn_step;dev_free;poison_buffer"), own_work_ms});
  normalize(r.oncpu);
  return diagnose(job);
}

TEST(MemoryCallSites, AWrapperOfTheCallsIsNamedWithItsCaller) {
  auto dx = churn_through_wrappers(0);
  ASSERT_FALSE(dx.findings.empty()) << text_of(dx);
  const Finding& f = dx.findings[0];
  ASSERT_EQ(f.cause, Cause::kMemoryAllocChurn) << text_of(dx);
  EXPECT_EQ(f.rank, 3);
  EXPECT_NE(f.culprit.find("(called from churn_step through dev_free)"), std::string::npos) << text_of(dx);
}

// A function that does work of its own beside the calls (here 1 ms per step outside cudaFree, a
// third of its time) is where the calls are made: named as it is.
TEST(MemoryCallSites, ASiteWithWorkOfItsOwnIsNoWrapper) {
  auto dx = churn_through_wrappers(1.0);
  ASSERT_FALSE(dx.findings.empty()) << text_of(dx);
  const Finding& f = dx.findings[0];
  ASSERT_EQ(f.cause, Cause::kMemoryAllocChurn) << text_of(dx);
  EXPECT_NE(f.culprit.find("(called from dev_free)"), std::string::npos) << text_of(dx);
}

// Issue 18, on real stacks: the runtime's work under the wrapper is not a frame named as the API.
// The testbed's libcudart tail-calls its helper (`cudaFree` leaves no frame: dev_free ->
// testbed::cuda::device_free), and a stripped libcudart's frames are module+offset. The loader knows
// them by their module: JobWindow::cuda_runtime_frames; a name also seen outside the runtime is not.
TEST(MemoryCallSites, LoaderKnowsTheRuntimesFramesByTheirModule) {
  const std::string cudart = "/work/build/testbed/lib/libcudart.so.13";
  Frame stripped = native("", "/usr/local/cuda/lib64/libcudart.so.13");
  stripped.function.clear();
  MemoryJob j({}, {{native("clock_nanosleep@@GLIBC_2.17", "/usr/lib/x86_64-linux-gnu/libc.so.6"),
                    native("testbed::cuda::(anonymous namespace)::device_free(void*)", cudart), native("dev_free(void*)"),
                    native("main")},
                   {stripped, native("cuMemFree_v2", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"), native("dev_free(void*)"),
                    native("main")},
                   {native("dev_free(void*)"), native("main")},
                   // A name inlined in the runtime and in the program alike: neither's.
                   {native("push_back", cudart), native("testbed::cuda::(anonymous namespace)::device_free(void*)", cudart),
                    native("dev_free(void*)"), native("main")},
                   {native("push_back"), native("dev_free(void*)"), native("main")}});
  auto jw = load_job_window(*j.st);
  ASSERT_TRUE(jw) << jw.error().message;
  std::vector<std::string> frames(jw->cuda_runtime_frames.begin(), jw->cuda_runtime_frames.end());
  std::sort(frames.begin(), frames.end());
  std::string all;
  for (const auto& f : frames) all += f + "\n";
  EXPECT_EQ(all, "cuMemFree_v2\n" + stripped.display_name() + "\ntestbed::cuda::(anonymous namespace)::device_free(void*)\n");
}

// ... and the wrapper rule counts time under them as inside the call: dev_free, whose on-CPU
// time is all under the runtime's helper (no cudaFree frame), is named with its caller. Fails
// without the runtime's frames (dev_free's time was then all "outside" the API).
TEST(MemoryCallSites, AWrapperOverTheRuntimesOwnFramesIsNamedWithItsCaller) {
  SyntheticSpec spec;
  spec.faults = {{3, "memory-alloc-churn", 40}};
  JobWindow job = make_synthetic_job(spec);
  RankWindow& r = job.ranks[3];
  r.memory_call_sites = {{job.names.id("cudaFree|dev_free"), 60}, {job.names.id("cudaMalloc|dev_malloc"), 40}};
  normalize(r.memory_call_sites);
  const std::string helper = "testbed::cuda::(anonymous namespace)::device_free(void*)";
  job.cuda_runtime_frames = {helper, "libcudart.so.13+0x4f20"};
  r.oncpu.push_back({job.names.id("main;train;churn_step;dev_free;" + helper + ";clock_nanosleep@@GLIBC_2.17"), 2.0});
  r.oncpu.push_back({job.names.id("main;train;churn_step;dev_malloc;libcudart.so.13+0x4f20"), 1.0});
  normalize(r.oncpu);
  auto dx = diagnose(job);
  ASSERT_FALSE(dx.findings.empty()) << text_of(dx);
  const Finding& f = dx.findings[0];
  ASSERT_EQ(f.cause, Cause::kMemoryAllocChurn) << text_of(dx);
  EXPECT_NE(f.culprit.find("(called from churn_step through dev_free)"), std::string::npos) << text_of(dx);
}

// Which Python functions are installed code (the interpreter's library, site- and dist-packages,
// frozen modules) and which are the program's own: read from each frame's source file by the loader.
TEST(PythonFrames, TheLoaderTellsInstalledLibrariesFromTheProgram) {
  Stack stack{python("augment_sample", "/srv/train.py"), python("Batches.__getitem__", "/srv/train.py"),
                    python("_MapDatasetFetcher.fetch", "/usr/lib/python3/dist-packages/torch/utils/data/_utils/fetch.py"),
                    python("_worker_loop", "/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py"),
                    python("BaseProcess.run", "/usr/lib/python3.11/multiprocessing/process.py"), python("_run_code", "<frozen runpy>"),
                    python("main", "/home/u/lib/python_helpers/main.py")};
  // The store keeps one frame per (kind, build id, module, offset): the agent's Python frames differ by offset.
  for (size_t i = 0; i < stack.size(); ++i) stack[i].offset = 0x1000 + i;
  MemoryJob j({}, std::vector<Stack>{stack});
  auto jw = load_job_window(*j.st);
  ASSERT_TRUE(jw) << jw.error().message;
  for (const char* f : {"train.py:augment_sample", "train.py:Batches.__getitem__", "fetch.py:_MapDatasetFetcher.fetch", "worker.py:_worker_loop",
                        "process.py:BaseProcess.run", "<frozen runpy>:_run_code", "main.py:main"})
    EXPECT_EQ(jw->python_functions.count(f), 1u) << f;
  std::vector<std::string> library(jw->python_library_functions.begin(), jw->python_library_functions.end());
  std::sort(library.begin(), library.end());
  EXPECT_EQ(library, (std::vector<std::string>{"<frozen runpy>:_run_code", "fetch.py:_MapDatasetFetcher.fetch", "process.py:BaseProcess.run",
                                               "worker.py:_worker_loop"}));
}

}  // namespace
}  // namespace strata::diagnose
