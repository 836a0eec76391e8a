// The job's healthy past through the store and the loader: the OS metrics of the recording windows
// before a slowdown are each rank's past (RankWindow::past). The agent's first window begins with
// the agent, a little before the ranks' first steps; it is the past when that lead is a small share
// of it (kMaxPastWarmupShare in diagnose/loader.cpp), and warm-up when it is not. Measured: an 8-rank
// sim job slowed 16 s in had only that first window before it, and without it no past at all.
#include <gtest/gtest.h>

#include <set>

#include "diagnose/loader.h"
#include "store/store.h"
#include "tests/support/rank_process.h"
#include "tests/support/run.h"

namespace strata::diagnose {
namespace {

// A 4-rank gloo job: 120 steps of 100 ms, then 80 of 250 ms; 10 s metric windows, the first of
// which begins `lead_s` before the first step. Every window says each rank ran 2 s on a CPU, and
// holds 198 on-CPU samples at 99 Hz (2 s) of each rank in `work`.
// `hog`: a process the launcher started beside the ranks (recorded, no RANK) that renamed itself
// right after its exec, "python3" then "strata-hog", runs 1 s of each window on rank 3's CPU; the
// agent named it "python3" in the first window (its first slice there came before the rename).
// `warmup_ms`: how long each rank's two warm-up steps (1 and 2) take.
void write_job(store::Store& s, double lead_s, bool hog = false, uint64_t warmup_ms = 100) {
  constexpr int kRanks = 4;
  constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;
  constexpr uint64_t kWindow = 10'000'000'000ull;
  const uint64_t first_window = kT0 - static_cast<uint64_t>(lead_s * 1e9);
  auto rec = s.begin_recording({"n0", "strata record -- torchrun train.py", first_window, 99, 10});
  ASSERT_TRUE(rec) << rec.error().message;
  std::vector<uint64_t> ends{kT0};
  for (int k = 1; k <= 200; ++k)
    ends.push_back(ends.back() + (k <= 2 ? warmup_ms * 1'000'000ull : k <= 120 ? 100'000'000ull : 250'000'000ull));
  std::vector<store::StepRecord> steps;
  std::vector<store::CollectiveRecord> colls;
  for (int r = 0; r < kRanks; ++r) {
    const store::ProcessInfo p = test::rank_process(static_cast<uint32_t>(5000 + r), r, kRanks, first_window);
    ASSERT_TRUE(s.put_process(*rec, p));
    for (int k = 1; k <= 200; ++k) {
      store::StepRecord st;
      st.pid = p.pid;
      st.step = static_cast<uint64_t>(k);
      st.start_ns = ends[k - 1];
      st.end_ns = ends[k];
      st.collective_ns = 20'000'000;
      steps.push_back(st);
      store::CollectiveRecord c;
      c.pid = p.pid;
      c.tid = p.pid + 100;
      c.library = "gloo";
      c.op = "allreduce";
      c.seq = static_cast<uint64_t>(k);
      c.enter_ns = st.end_ns - 20'000'000;
      c.exit_ns = st.end_ns;
      c.completion = "host";
      colls.push_back(c);
    }
  }
  if (hog) {
    store::ProcessInfo p;
    p.pid = 6000;
    p.ppid = 1;
    p.start_ns = first_window;
    p.node = "n0";
    p.comm = "python3";  // read at its exec, before its prctl
    p.command = "python3 -c hog";
    ASSERT_TRUE(s.put_process(*rec, p));
  }
  ASSERT_TRUE(s.put_steps(*rec, steps));
  ASSERT_TRUE(s.put_collectives(*rec, colls));
  Frame f;
  f.kind = FrameKind::kNative;
  f.build_id = "abcd";
  f.module = "/usr/bin/python3";
  f.offset = 0x1000;
  f.function = "work";
  auto work = s.intern_stack({f});
  ASSERT_TRUE(work) << work.error().message;
  for (uint64_t w = first_window; w < ends.back(); w += kWindow) {
    std::vector<store::Metric> m;
    std::vector<store::StackCount> counts;
    for (int r = 0; r < kRanks; ++r) {
      const auto pid = static_cast<uint32_t>(5000 + r);
      m.push_back({pid, "os.cpu_time_us", "", 2e6});
      // Where it ran: 95% on CPU r, the rest elsewhere.
      m.push_back({pid, "os.cpu_time_by_cpu_us", std::to_string(r), 1.9e6});
      m.push_back({pid, "os.cpu_time_by_cpu_us", "other", 0.1e6});
      if (hog && r == 3) m.push_back({pid, "os.neighbour_run_us", w == first_window ? "python3:6000" : "strata-hog:6000", 1e6});
      counts.push_back({pid, pid, "python3", *work, 198});
    }
    ASSERT_TRUE(s.put_metrics(*rec, w, w + kWindow, m));
    ASSERT_TRUE(s.put_window(*rec, w, w + kWindow, store::CountKind::kOnCpu, counts, {99, store::kUnwindingCfi}));
  }
  ASSERT_TRUE(s.end_recording(*rec, ends.back()));
}

Result<JobWindow> load(test::TempDir& dir, const std::string& name, double lead_s, bool hog = false,
                       uint64_t warmup_ms = 100) {
  auto st = store::Store::open_sqlite(dir.file(name), store::Store::Mode::kCreateOrAppend);
  if (!st) return st.error();
  write_job(**st, lead_s, hog, warmup_ms);
  return load_job_window(**st);
}

TEST(DiagnosePastStore, AFirstWindowThatBeganJustBeforeTheStepsIsThePast) {
  test::TempDir dir;
  auto job = load(dir, "lead.db", 0.3);  // 3% of the window before the first step
  ASSERT_TRUE(job) << job.error().message;
  ASSERT_EQ(job->ranks.size(), 4u);
  for (const auto& r : job->ranks) {
    ASSERT_GT(r.base.steps, 0u) << "the slowdown 12 s in leaves a healthy baseline";
    const double cpu = r.past.os[static_cast<size_t>(Os::kCpu)];
    ASSERT_TRUE(known(cpu)) << "rank " << r.rank << " has no OS past";
    // 2 s of CPU over the window's 100 baseline steps' worth of time: 20 ms a step.
    EXPECT_NEAR(cpu, 20.0, 2.0) << "rank " << r.rank;
  }
}

// Where each rank ran comes from its process's os.cpu_time_by_cpu_us, as shares, largest first.
TEST(DiagnosePastStore, WhereEachRankRanIsItsShareOfRunTimeByCpu) {
  test::TempDir dir;
  auto job = load(dir, "placement.db", 0.3);
  ASSERT_TRUE(job) << job.error().message;
  ASSERT_EQ(job->ranks.size(), 4u);
  for (const auto& r : job->ranks) {
    ASSERT_EQ(r.cpu_placement.size(), 2u) << "rank " << r.rank;
    EXPECT_EQ(r.cpu_placement[0].first, std::to_string(r.rank));
    EXPECT_NEAR(r.cpu_placement[0].second, 0.95, 1e-9);
    EXPECT_EQ(r.cpu_placement[1].first, "other");
  }
}

// The slowdown begins 12 s in, inside the second window: that window holds the analysis window's
// start and is no past, the first one is. The past's stacks come from that first window alone, as
// its OS metrics do. (They came from nowhere before: the span asked for reached into the second
// window, so the past had no stacks at all, and every function of the window "grew" from nothing.)
TEST(DiagnosePastStore, ThePastsStacksAreThoseOfItsWindows) {
  test::TempDir dir;
  auto job = load(dir, "stacks.db", 0.3);
  ASSERT_TRUE(job) << job.error().message;
  ASSERT_EQ(job->ranks.size(), 4u);
  for (const auto& r : job->ranks) {
    ASSERT_GT(r.past.windows, 0u) << "rank " << r.rank;
    double work = 0;
    for (const auto& v : r.past.oncpu) work += v.ms_per_step;
    // 198 samples at 99 Hz (2 s) over the window's ~97 steps: ~20.6 ms a step, as its OS metric says.
    EXPECT_NEAR(work, 20.0, 2.0) << "rank " << r.rank << ": the past has no stacks of its window";
    double now = 0;
    for (const auto& v : r.oncpu) now += v.ms_per_step;
    EXPECT_GT(now, 0) << "rank " << r.rank;
  }
}

TEST(DiagnosePastStore, AFirstWindowMostlyBeforeTheStepsIsWarmUp) {
  test::TempDir dir;
  auto job = load(dir, "warm.db", 3.0);  // 30%: the job's start, not its healthy past
  ASSERT_TRUE(job) << job.error().message;
  ASSERT_EQ(job->ranks.size(), 4u);
  for (const auto& r : job->ranks)
    EXPECT_FALSE(known(r.past.os[static_cast<size_t>(Os::kCpu)])) << "rank " << r.rank << ": warm-up taken as the past";
}

// Slow warm-up steps are the job's start only beyond its pace: 0.15 s before the first step and two
// warm-up steps of 500 ms where the pace is 100 ms (0.8 s beyond it) are 9.5% of the first window,
// which stays the past (the lead counted to the baseline's first step, 1.15 s, made it warm-up: an
// 8-rank sim's job-wide I/O stall had no OS past). A first step that compiles for 3 s is start-up.
TEST(DiagnosePastStore, WarmUpStepsCountAsStartUpOnlyBeyondTheJobsPace) {
  for (uint64_t warmup_ms : {500ull, 3000ull}) {
    test::TempDir dir;
    auto job = load(dir, "warmup.db", 0.15, false, warmup_ms);
    ASSERT_TRUE(job) << job.error().message;
    ASSERT_EQ(job->ranks.size(), 4u);
    for (const auto& r : job->ranks) {
      const bool past = known(r.past.os[static_cast<size_t>(Os::kCpu)]);
      EXPECT_EQ(past, warmup_ms == 500) << "rank " << r.rank << ", warm-up steps of " << warmup_ms << " ms";
    }
  }
}

// A neighbour is named as it ran last, not as the process was recorded at its exec: a hog that
// renamed itself was "python3" on a DDP run (ddp_train.py's cpu-contention), the name of every rank.
TEST(DiagnosePastStore, ANeighbourIsNamedAsItRanLast) {
  test::TempDir dir;
  auto job = load(dir, "hog.db", 0.3, true);
  ASSERT_TRUE(job) << job.error().message;
  ASSERT_EQ(job->ranks.size(), 4u);
  const RankWindow& r = job->ranks[3];
  std::set<std::string> names;
  for (const auto& v : r.neighbours) names.insert(job->names.name(v.name));
  for (const auto& v : r.past.neighbours) names.insert(job->names.name(v.name));
  EXPECT_TRUE(names.count("strata-hog")) << "neighbours of rank 3: " << names.size();
  EXPECT_FALSE(names.count("python3")) << "the hog named by its name at exec";
  EXPECT_TRUE(job->ranks[0].neighbours.empty());
}

}  // namespace
}  // namespace strata::diagnose
