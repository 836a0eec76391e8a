// Steps so long that three slow ones take more than a window (find_long_step_change in
// diagnose/loader.cpp): the last completed step and the step still in flight at the data's end say
// that a slowdown persists, where three completed slow steps would come a minute later. One long
// step followed by a normal one (a checkpoint's save) is no change.
#include <gtest/gtest.h>

#include "diagnose/loader.h"
#include "store/store.h"
#include "tests/support/rank_process.h"
#include "tests/support/run.h"

namespace strata::diagnose {
namespace {

std::vector<double> steady(size_t n, double ms) { return std::vector<double>(n, ms); }

TEST(LongSteps, OneLongStepAndALongStepInFlightAreAChange) {
  auto s = steady(20, 250);
  s.push_back(15'000);
  EXPECT_EQ(find_long_step_change(s, 6'000, 10'000), 20u);
  s.push_back(21'000);  // two completed: the change is still where the first began
  EXPECT_EQ(find_long_step_change(s, 4'000, 10'000), 20u);
}

TEST(LongSteps, ALongStepFollowedByANormalOneIsNoChange) {
  auto s = steady(20, 250);
  s.push_back(15'000);
  EXPECT_EQ(find_long_step_change(s, 120, 10'000), 0u) << "the step in flight is back to the pace";
  s.push_back(260);
  EXPECT_EQ(find_long_step_change(s, 6'000, 10'000), 0u) << "the last completed step is back to the pace";
}

TEST(LongSteps, StepsThatFillAWindowOnlyInThreesAreLeftToTheThreeStepRule) {
  auto s = steady(20, 250);
  s.push_back(1'000);  // 4x, but it and the step in flight last 2 s, a fifth of the window
  EXPECT_EQ(find_long_step_change(s, 1'000, 10'000), 0u);
  s.push_back(1'000);
  s.push_back(1'000);  // three slow steps: find_change_point's case
  EXPECT_EQ(find_long_step_change(s, 1'000, 100), 0u);
  EXPECT_EQ(find_change_point(s), 20u);
}

TEST(LongSteps, TheSlowStepsMustClearTheStepsNoiseAndFew) {
  std::vector<double> noisy;
  for (int i = 0; i < 20; ++i) noisy.push_back(i % 2 ? 200 : 2'000);  // a job whose steps alternate
  noisy.push_back(5'000);  // 4.5x the median, 2.5x the job's own slow steps
  EXPECT_EQ(find_long_step_change(noisy, 5'000, 10'000), 0u) << "within the steps' own spread";
  auto few = steady(4, 250);  // too few steps before it for a median to stand for the pace
  few.push_back(15'000);
  EXPECT_EQ(find_long_step_change(few, 6'000, 10'000), 0u);
}

// Through the store and the loader: a 3-rank job of 40 steps of 250 ms whose rank 1 then takes 15 s
// over one step (its peers wait in the step's collective), with 10 s metric windows; the data goes
// on `in_flight_s` past that step's end without another step, with ranks 0 and 2 inside the next
// step's allreduce at its end when `waiting` (the agent's in-flight rows), else inside nothing (the
// job's teardown).
Result<JobWindow> load_long_step(test::TempDir& dir, const std::string& name, double in_flight_s, bool waiting = true) {
  auto st = store::Store::open_sqlite(dir.file(name), store::Store::Mode::kCreateOrAppend);
  if (!st) return st.error();
  store::Store& s = **st;
  constexpr int kRanks = 3;
  constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;
  constexpr uint64_t kWindow = 10'000'000'000ull;
  auto rec = s.begin_recording({"n0", "strata record -- torchrun train.py", kT0, 99, 10});
  if (!rec) return rec.error();
  std::vector<uint64_t> ends{kT0};
  for (int k = 1; k <= 41; ++k) ends.push_back(ends.back() + (k <= 40 ? 250'000'000ull : 15'000'000'000ull));
  std::vector<store::StepRecord> steps;
  for (int r = 0; r < kRanks; ++r) {
    const store::ProcessInfo p = test::rank_process(static_cast<uint32_t>(7000 + r), r, kRanks, kT0);
    if (auto put = s.put_process(*rec, p); !put) return put.error();
    for (int k = 1; k <= 41; ++k) {
      store::StepRecord x;
      x.pid = p.pid;
      x.step = static_cast<uint64_t>(k);
      x.start_ns = ends[k - 1];
      x.end_ns = ends[k];
      const bool waits = k == 41 && r != 1;
      x.collective_ns = waits ? 14'900'000'000ull : 20'000'000ull;
      steps.push_back(x);
    }
  }
  if (auto put = s.put_steps(*rec, steps); !put) return put.error();
  const uint64_t seen_until = ends.back() + static_cast<uint64_t>(in_flight_s * 1e9);
  for (uint64_t w = kT0; w < seen_until; w += kWindow) {
    std::vector<store::Metric> m;
    const bool last = w + kWindow >= seen_until;
    for (int r = 0; r < kRanks; ++r) {
      m.push_back({static_cast<uint32_t>(7000 + r), "os.cpu_time_us", "", 2e6});
      if (last && waiting && r != 1)
        m.push_back({static_cast<uint32_t>(7000 + r), store::kInFlightMetric,
                     store::in_flight_label({"gloo", "allreduce", "", 42}), in_flight_s * 0.9});
    }
    if (auto put = s.put_metrics(*rec, w, std::min(w + kWindow, seen_until), m); !put) return put.error();
  }
  return load_job_window(s);
}

TEST(LongSteps, TheLoaderComparesTheLongStepWithThePaceBeforeIt) {
  test::TempDir dir;
  auto job = load_long_step(dir, "inflight.db", 6.0);
  ASSERT_TRUE(job) << job.error().message;
  ASSERT_EQ(job->ranks.size(), 3u);
  for (const auto& r : job->ranks) {
    EXPECT_EQ(r.now.steps, 1u) << "rank " << r.rank << ": the long step is the window";
    EXPECT_GT(r.base.steps, 30u) << "rank " << r.rank;
  }
  auto one_off = load_long_step(dir, "checkpoint.db", 0.1);
  ASSERT_TRUE(one_off) << one_off.error().message;
  for (const auto& r : one_off->ranks)
    EXPECT_GT(r.now.steps, 1u) << "rank " << r.rank << ": one long step with nothing after it is no change";
  auto teardown = load_long_step(dir, "teardown.db", 6.0, false);
  ASSERT_TRUE(teardown) << teardown.error().message;
  for (const auto& r : teardown->ranks)
    EXPECT_GT(r.now.steps, 1u) << "rank " << r.rank << ": no rank inside a collective, no step in flight";
}

}  // namespace
}  // namespace strata::diagnose
