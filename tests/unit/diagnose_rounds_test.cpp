// Issue 16, continuous diagnosis whose cost does not grow with the job's age. Synthetic stores of
// one job (16 ranks, 10 s windows of stacks and metrics, as agents ship them) that ran 60 or 600
// steps, or for hours: a collector's round and `strata diagnose FILE.db` read the same rows
// whatever the age (rows counted, never timed), a straggler that began recently is named with its
// function at any age, `--last` is checked, and the SQLite store's retention deletes old rows only.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <iostream>
#include <fstream>
#include <map>
#include <algorithm>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "diagnose/engine.h"
#include "diagnose/render.h"
#include "diagnose/loader.h"
#include "server/diagnoser.h"
#include "server/server.h"
#include "store/store.h"
#include "tests/support/run.h"

namespace strata {
namespace {

using test::run;
using test::strata_bin;
using test::TempDir;

constexpr int kRanks = 16;
constexpr int kStraggler = 5;
constexpr uint64_t kStepNs = 200'000'000;
constexpr uint64_t kWindowNs = 10'000'000'000ull;  // the agents' default window
// Every store ends here, and is laid out backwards from it (steps and windows): the latest stretch
// of a young and of an old job is then the same to the row.
constexpr uint64_t kEnd = 1'700'000'000'000'000'000ull;

// The store at `where`: a SQLite file, or a ClickHouse database (clickhouse://HOST:PORT/DB, the
// *OnClickHouse tests below).
Result<std::unique_ptr<store::Store>> open_at(const std::string& where, store::Store::Mode mode) {
  if (where.rfind("clickhouse://", 0) == 0) return store::Store::open_clickhouse(where, mode);
  return store::Store::open_sqlite(where, mode);
}

Frame fn(const std::string& name) {
  Frame f;
  f.kind = FrameKind::kNative;
  f.module = "/opt/train/bin/trainer";
  f.function = name;
  f.offset = std::hash<std::string>{}(name) & 0xffffff;
  return f;
}

// A job of kRanks ranks on two nodes that ran `steps` steps; in its last `slow_last` steps, rank
// kStraggler computes 40 ms longer per step in `slow_augment` (the others wait for it). Stacks and
// metrics come in 10 s windows. Returns the time the first step started. `nodes` x `per_node`
// ranks (default kRanks on two nodes), named `job`, on nodes "<node_prefix>N" with pids from
// pid_base (a second job into the same store takes others).
uint64_t make_store(const std::string& path, int steps, int slow_last, int nodes = 2, int per_node = kRanks / 2,
                    const std::string& job = "rounds", uint32_t pid_base = 10000, const std::string& node_prefix = "node-",
                    uint64_t end = kEnd) {
  const int ranks = nodes * per_node;
  const int slow_from = steps - slow_last;
  auto st = open_at(path, store::Store::Mode::kCreateOrAppend);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  auto& s = **st;
  EXPECT_TRUE(s.begin());
  auto stack = [&](std::initializer_list<const char*> names) {
    Stack stk;
    for (auto it = std::rbegin(names); it != std::rend(names); ++it) stk.push_back(fn(*it));
    return *s.intern_stack(stk);
  };
  const int64_t fwd = stack({"_start", "main", "train_step", "forward", "launch_kernels"});
  const int64_t load = stack({"_start", "main", "train_step", "load_batch", "preprocess", "cpu_work"});
  const int64_t aug = stack({"_start", "main", "train_step", "load_batch", "slow_augment", "cpu_work"});
  const int64_t wait = stack({"_start", "main", "train_step", "allreduce", "ncclAllReduce", "poll"});
  // The job's steps, from the last one back: every rank waits for the slowest, so they share the
  // boundaries. Noise of 0-4 ms that depends on the distance from the end.
  std::vector<std::pair<uint64_t, uint64_t>> bounds(static_cast<size_t>(steps));
  uint64_t cursor = end;
  for (int k = steps - 1; k >= 0; --k) {
    const uint64_t j = static_cast<uint64_t>(steps - 1 - k);
    const uint64_t extra = k >= slow_from ? 40'000'000 : 0;
    const uint64_t start = cursor - kStepNs - extra - (j * 7919 % 41) * 100'000;
    bounds[static_cast<size_t>(k)] = {start, cursor};
    cursor = start - 1'000'000;
  }
  const uint64_t t0 = bounds.front().first;
  std::vector<int64_t> recs;
  for (int n = 0; n < nodes; ++n) {
    recs.push_back(*s.begin_recording({node_prefix + std::to_string(n), "synthetic", t0, 99, 10}));
    EXPECT_TRUE(s.end_recording(recs.back(), end));
  }
  for (int r = 0; r < ranks; ++r) {
    const uint32_t pid = pid_base + static_cast<uint32_t>(r);
    const int64_t rec = recs[static_cast<size_t>(r / per_node)];
    store::ProcessInfo p;
    p.pid = pid;
    p.ppid = 1;
    p.start_ns = t0;
    p.node = node_prefix + std::to_string(r / per_node);
    p.comm = "python3";
    p.command = "python3 train.py";
    p.job = job;
    p.rank = r;
    p.local_rank = r % per_node;
    p.world_size = ranks;
    EXPECT_TRUE(s.put_process(rec, p));
    std::vector<store::StepRecord> rows;
    for (int k = 0; k < steps; ++k) {
      store::StepRecord sr;
      sr.pid = pid;
      sr.step = static_cast<uint64_t>(k + 1);
      sr.start_ns = bounds[static_cast<size_t>(k)].first;
      sr.end_ns = bounds[static_cast<size_t>(k)].second;
      const uint64_t compute = 120'000'000 + (r == kStraggler && k >= slow_from ? 40'000'000 : 0);
      sr.collective_ns = sr.end_ns - sr.start_ns - compute;
      sr.device_known = true;
      sr.device_compute_ns = 110'000'000;
      sr.device_collective_ns = sr.collective_ns;
      sr.gpu_idle_ns = sr.end_ns - sr.start_ns - sr.device_compute_ns - sr.device_collective_ns / 2;
      rows.push_back(sr);
    }
    EXPECT_TRUE(s.put_steps(rec, rows));
    // Windows: samples at 99 Hz of what the rank did in them (10 ms a sample).
    for (uint64_t w = end + 1; w > t0; w -= kWindowNs) {  // [w - 10 s, w), the latest first
      uint64_t slow_ns = 0, n = 0;
      for (int k = 0; k < steps; ++k) {
        const auto& [a, b] = bounds[static_cast<size_t>(k)];
        if (a < w - kWindowNs || a >= w) continue;
        ++n;
        if (r == kStraggler && k >= slow_from) slow_ns += 40'000'000;
      }
      std::vector<store::StackCount> counts = {{pid, pid, "python3", fwd, 3 * n}, {pid, pid, "python3", load, 5 * n},
                                               {pid, pid, "python3", wait, 2 * n}};
      if (slow_ns) counts.push_back({pid, pid, "python3", aug, slow_ns / 10'000'000});
      EXPECT_TRUE(s.put_window(rec, w - kWindowNs, w, store::CountKind::kOnCpu, counts));
      std::vector<store::Metric> m = {{pid, "os.cpu_time_us", "", 6e6 + (slow_ns ? slow_ns / 1e3 : 0)},
                                      {pid, "os.runq_wait_us", "", 1e4}};
      EXPECT_TRUE(s.put_metrics(rec, w - kWindowNs, w, m));
    }
  }
  EXPECT_TRUE(s.commit());
  return t0;
}

// What a collector's round reads of a store: the counted rows, and the SQLite work.
// A store opened as a round reads it (read-only), with the end of its latest step (0: none, or it
// did not open: the expectations say which).
struct ReadStore {
  std::unique_ptr<store::Store> store;
  uint64_t latest_ns = 0;
};
ReadStore open_for_reading(const std::string& path) {
  ReadStore r;
  auto st = open_at(path, store::Store::Mode::kReadOnly);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  if (!st) return r;
  r.store = std::move(*st);
  auto latest = r.store->latest_step_ns();
  EXPECT_TRUE(latest && *latest) << "no step in " << path;
  if (latest && *latest) r.latest_ns = **latest;
  return r;
}

struct RoundCost {
  diagnose::Stats stats;
  uint64_t work = 0;
};

RoundCost round_cost(const std::string& path) {
  auto [st, latest] = open_for_reading(path);
  RoundCost c;
  if (!st || !latest) return c;
  diagnose::LoadOptions lo;
  lo.job = "rounds";
  lo.all_recordings = true;
  lo.from_ns = latest - server::Diagnoser::kAnalysisSpanNs;  // a first round, as the collector makes it
  lo.stats = &c.stats;
  const uint64_t before = st->read_work();
  auto w = diagnose::load_job_window(*st, lo);
  EXPECT_TRUE(w) << (w ? "" : w.error().message);
  c.work = st->read_work() - before;
  return c;
}

// A round reads the same rows of a job that ran 60 steps (12 s) as of one that ran 600 (2 min) or
// 6,000 (20 min): the span, not the history. The SQLite work follows: the time indexes find the
// span. A scan of the history would read 10 and 100 times as much.
TEST(DiagnoseRounds, ARoundReadsTheSameRowsWhateverTheJobsAge) {
  TempDir tmp;
  std::vector<RoundCost> costs;
  for (int steps : {300, 3000, 6000}) {
    const std::string db = tmp.file("job-" + std::to_string(steps) + ".db");
    make_store(db, steps, 150);
    costs.push_back(round_cost(db));
  }
  // Every store's last minutes are alike (laid out back from the same end: the same steps, windows,
  // and the straggler in them), so the rows are the same to the row.
  for (size_t i = 1; i < costs.size(); ++i) {
    EXPECT_EQ(costs[i].stats.steps, costs[0].stats.steps) << i;
    EXPECT_EQ(costs[i].stats.metrics, costs[0].stats.metrics) << i;
    EXPECT_EQ(costs[i].stats.samples, costs[0].stats.samples) << i;
    EXPECT_EQ(costs[i].stats.rows(), costs[0].stats.rows()) << i;
  }
  EXPECT_GT(costs[0].stats.steps, 0u);
  EXPECT_LT(costs[0].stats.steps, 300u * kRanks) << "the first store's round read its whole history";
  // The work may differ by the few index pages' worth the larger files need; a history scan of the
  // 6,000-step file would be 20 times the 300-step one's.
  constexpr double kMaxWorkGrowth = 1.5;
  EXPECT_GT(costs[0].work, 0u);
  EXPECT_LE(static_cast<double>(costs[2].work), kMaxWorkGrowth * static_cast<double>(costs[0].work))
      << costs[0].work << " vs " << costs[2].work;
}

// A load that is cancelled stops at its next read with an error that says so, and reads less than
// the whole load: a collector that is stopping does not wait for a round of thousands of ranks
// (a 10,000-rank store held `strata serve` past SIGTERM for more than 9 minutes).
TEST(DiagnoseRounds, ACancelledLoadStopsAtItsNextRead) {
  TempDir tmp;
  const std::string db = tmp.file("cancel.db");
  make_store(db, 300, 150);
  auto [st, latest] = open_for_reading(db);
  ASSERT_TRUE(st && latest);
  std::atomic<bool> cancel{true};
  diagnose::LoadOptions lo;
  lo.job = "rounds";
  lo.all_recordings = true;
  lo.cancel = &cancel;
  const uint64_t before = st->read_work();
  auto w = diagnose::load_job_window(*st, lo);
  ASSERT_FALSE(w) << "a cancelled load returned a window";
  EXPECT_NE(w.error().message.find("cancelled"), std::string::npos) << w.error().message;
  EXPECT_EQ(st->read_work(), before) << "it read before it looked at the flag";
  cancel = false;
  EXPECT_TRUE(diagnose::load_job_window(*st, lo)) << "the same load, not cancelled";
}

// A round's reads grow with the job's ranks, not with ranks x nodes: 4 times the ranks on 4 times
// the nodes, 4 times the work (issue 16: the stacks were read rank by rank, each query probing the
// span's windows of every rank; at 1,000 nodes x 8 a round outlasted the run and no fault was
// found). The SQLite work is counted, never timed.
TEST(DiagnoseRounds, ARoundReadsGrowWithRanksNotRanksTimesNodes) {
  TempDir tmp;
  std::vector<RoundCost> costs;
  constexpr int kPerNode = 8;
  const std::vector<int> nodes = {2, 8};
  for (int n : nodes) {
    const std::string db = tmp.file("nodes-" + std::to_string(n) + ".db");
    make_store(db, 300, 150, n, kPerNode);
    costs.push_back(round_cost(db));
  }
  const double grow = static_cast<double>(nodes[1]) / nodes[0];  // ranks and rows read: 4x
  EXPECT_EQ(costs[1].stats.steps, static_cast<uint64_t>(grow) * costs[0].stats.steps);
  // Linear: 4x, with room for index depth; reads per rank over every rank's windows: 16x.
  constexpr double kSlack = 1.5;
  RecordProperty("work", std::to_string(costs[0].work) + " -> " + std::to_string(costs[1].work));
  EXPECT_GT(costs[0].work, 0u);
  EXPECT_LE(static_cast<double>(costs[1].work), kSlack * grow * static_cast<double>(costs[0].work))
      << costs[0].work << " vs " << costs[1].work << " (SQLite work units)";
}

// The pause after a background round follows the CPU the round used when it read through
// connections of its own (it held nothing ingest waits for): round and pause together average
// kRoundCores at most, and time the round spent waiting for a core counts as time spent (measured
// at 1,000 x 8 on 2 shared cores, a round used 7.4 s of CPU in 17 s, and 4 x 17 s between rounds
// put a planted fault's finding 48 s after its start). Under the store mutex, the wall time: ingest
// waited all of it.
TEST(DiagnoseRounds, ThePauseAfterARoundFollowsItsCpuWhenItReadAlone) {
  using server::Diagnoser;
  // 4 s of CPU in 5 s: 8 s of round and pause at half a core.
  EXPECT_DOUBLE_EQ(Diagnoser::pause_after_s(5, 4, true), 4 / Diagnoser::kRoundCores - 5);
  EXPECT_NEAR((4 + 0.0) / (5 + Diagnoser::pause_after_s(5, 4, true)), Diagnoser::kRoundCores, 1e-12);
  // A round that waited for a core longer than its CPU allows for: no pause.
  EXPECT_DOUBLE_EQ(Diagnoser::pause_after_s(17, 7.4 * Diagnoser::kRoundCores, true), 0);
  EXPECT_DOUBLE_EQ(Diagnoser::pause_after_s(17, 7.4, false), Diagnoser::kBusyFactor * 17);
  EXPECT_DOUBLE_EQ(Diagnoser::pause_after_s(0, 0, true), 0);
}

// A read in any order (RowQuery::any_order: the diagnosis sums device activity per process) returns
// the same rows without the store's sort: less SQLite work, counted, never timed. A page (limit)
// keeps its order.
TEST(DiagnoseRounds, AReadInAnyOrderSkipsTheSort) {
  TempDir tmp;
  const std::string db = tmp.file("order.db");
  make_store(db, 3000, 0);
  auto [st, latest] = open_for_reading(db);
  ASSERT_TRUE(st && latest);
  store::RowQuery q;
  q.from_ns = latest - 300'000'000'000ull;  // 5 minutes of 16 ranks' steps
  auto read = [&](bool any, uint64_t& work) {
    q.any_order = any;
    const uint64_t before = st->read_work();
    auto rows = st->query_steps(q);
    work = st->read_work() - before;
    EXPECT_TRUE(rows);
    std::vector<std::tuple<std::string, uint32_t, uint64_t>> keys;
    for (const auto& r : *rows) keys.emplace_back(r.node, r.pid, r.step);
    return keys;
  };
  uint64_t sorted_work = 0, any_work = 0;
  auto sorted = read(false, sorted_work);
  auto any = read(true, any_work);
  ASSERT_GT(sorted.size(), 1000u);
  std::sort(any.begin(), any.end());
  auto expected = sorted;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(any, expected);
  RecordProperty("work", std::to_string(sorted_work) + " sorted, " + std::to_string(any_work) + " in any order");
  EXPECT_LT(any_work, sorted_work);
  // A page is in the store's order, asked for in any order or not.
  q.limit = 10;
  uint64_t w = 0;
  auto page = read(true, w);
  ASSERT_EQ(page.size(), 10u);
  EXPECT_TRUE(std::equal(page.begin(), page.end(), sorted.begin()));
}

// A span read open at its end walks the table in rowid order from the span's first row, where a
// collector's store has its rows (written as their windows close, in time order): the same rows as
// the time index finds, without a seek into the table per row. Where a row was written long before
// its time (an agent whose clock was ahead), the walk would cover the whole table: the time index,
// as before. Rows checked against a filter of every row; SQLite's counted work (its instructions:
// they count the rows looked at, not the seeks) against the same span read through the time index
// (a far end bound keeps the walk off): no more in either case.
TEST(DiagnoseRounds, ASpanReadWalksTheRowsWrittenSinceItsFirstWhereThatIsShort) {
  constexpr int kSpanRanks = 8, kSteps = 2000;
  for (bool clock_ahead : {false, true}) {
    SCOPED_TRACE(clock_ahead ? "a row written long before its time" : "rows written in time order");
    TempDir tmp;
    const std::string db = tmp.file("walk.db");
    {
      auto st = open_at(db, store::Store::Mode::kCreateOrAppend);
      ASSERT_TRUE(st) << st.error().message;
      auto& s = **st;
      ASSERT_TRUE(s.begin());
      const uint64_t t0 = kEnd - kSteps * kStepNs;
      const int64_t rec = *s.begin_recording({"node-0", "synthetic", t0, 99, 10});
      auto step_of = [&](int rank, int k) {
        store::StepRecord r;
        r.pid = 100 + static_cast<uint32_t>(rank);
        r.step = static_cast<uint64_t>(k + 1);
        r.start_ns = t0 + static_cast<uint64_t>(k) * kStepNs;
        r.end_ns = r.start_ns + kStepNs - 1'000'000;
        return r;
      };
      // Ahead: the first row written is of the job's last step (rank 0's clock ran ahead).
      if (clock_ahead) {
        ASSERT_TRUE(s.put_steps(rec, {step_of(0, kSteps - 1)}));
      }
      for (int k = 0; k < kSteps; ++k) {
        std::vector<store::StepRecord> rows;
        for (int r = 0; r < kSpanRanks; ++r) {
          if (!(clock_ahead && r == 0 && k == kSteps - 1)) rows.push_back(step_of(r, k));
        }
        ASSERT_TRUE(s.put_steps(rec, rows));
      }
      // A late row: written last, of a time long before the span.
      store::StepRecord late = step_of(kSpanRanks, 10);
      ASSERT_TRUE(s.put_steps(rec, {late}));
      ASSERT_TRUE(s.commit());
    }
    auto [st, latest] = open_for_reading(db);
    ASSERT_TRUE(st && latest);
    auto all = st->steps(std::nullopt, std::nullopt);
    ASSERT_TRUE(all);
    store::RowQuery q;
    q.from_ns = latest - 200 * kStepNs;  // the last 10% of the steps
    using Key = std::tuple<uint32_t, uint64_t>;
    std::vector<Key> want;
    for (const auto& r : *all) {
      if (r.end_ns > *q.from_ns) want.emplace_back(r.pid, r.step);
    }
    std::sort(want.begin(), want.end());
    ASSERT_EQ(want.size(), static_cast<size_t>(200 * kSpanRanks));
    auto read = [&](const store::RowQuery& query, uint64_t& work) {
      const uint64_t before = st->read_work();
      auto rows = st->query_steps(query);
      work = st->read_work() - before;
      EXPECT_TRUE(rows);
      std::vector<Key> keys;
      for (const auto& r : *rows) keys.emplace_back(r.pid, r.step);
      std::sort(keys.begin(), keys.end());
      return keys;
    };
    store::RowQuery by_index = q;
    by_index.to_ns = kEnd + kStepNs;  // every row starts before it: the same span
    uint64_t walk_work = 0, index_work = 0;
    EXPECT_EQ(read(q, walk_work), want);
    EXPECT_EQ(read(by_index, index_work), want);
    RecordProperty("work", std::to_string(walk_work) + " open-ended, " + std::to_string(index_work) + " by the time index");
    EXPECT_LE(walk_work, index_work + index_work / 4) << "walked more rows than the span's";
  }
}

// A read that keeps some processes only (RowQuery::keep_process, as a collector's round reads for
// one job): the rows of those processes, all of them, in the order of a read of everything; the
// same through SQLite's own read and the Reader's general one (ClickHouse's), which filters the
// query's rows.
TEST(DiagnoseRounds, AReadKeepsTheProcessesItIsAskedFor) {
  TempDir tmp;
  const std::string db = tmp.file("keep.db");
  make_store(db, 300, 0);
  auto [st, latest] = open_for_reading(db);
  ASSERT_TRUE(st && latest);
  store::RowQuery all;
  all.from_ns = latest - 60'000'000'000ull;
  auto wanted = [](std::string_view node, uint32_t pid) { return node == "node-1" && (pid % 2 == 0 || pid == 0); };
  store::RowQuery some = all;
  some.keep_process = wanted;
  auto steps = st->query_steps(all);
  auto metrics = st->query_metrics(all);
  ASSERT_TRUE(steps && metrics);
  std::vector<store::StepRecord> want_steps;
  for (const auto& r : *steps) if (wanted(r.node, r.pid)) want_steps.push_back(r);
  std::vector<store::Store::MetricRow> want_metrics;
  for (const auto& r : *metrics) if (wanted(r.node, r.metric.pid)) want_metrics.push_back(r);
  ASSERT_GT(want_steps.size(), 0u);
  ASSERT_LT(want_steps.size(), steps->size());
  ASSERT_GT(want_metrics.size(), 0u);
  ASSERT_LT(want_metrics.size(), metrics->size());
  auto key = [](const store::StepRecord& r) { return std::tuple{r.node, r.pid, r.step, r.start_ns}; };
  auto mkey = [](const store::Store::MetricRow& r) { return std::tuple{r.node, r.metric.pid, r.metric.name, r.end_ns}; };
  for (bool general : {false, true}) {
    std::vector<store::StepRecord> got;
    std::vector<store::Store::MetricRow> got_metrics;
    ASSERT_TRUE(general ? st->store::Reader::append_steps(some, got) : st->append_steps(some, got));
    ASSERT_TRUE(general ? st->store::Reader::append_metrics(some, got_metrics) : st->append_metrics(some, got_metrics));
    ASSERT_EQ(got.size(), want_steps.size()) << (general ? "general" : "SQLite");
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(key(got[i]), key(want_steps[i])) << i;
    ASSERT_EQ(got_metrics.size(), want_metrics.size()) << (general ? "general" : "SQLite");
    for (size_t i = 0; i < got_metrics.size(); ++i) EXPECT_EQ(mkey(got_metrics[i]), mkey(want_metrics[i])) << i;
  }
}

// One process's profile of a span (a hang's stall stacks are read so, rank by rank) costs the same
// on 2 nodes as on 8: the query looks at that node's windows, not every node's. Before, the work
// grew with the nodes, and the stall reads of a round with ranks x nodes.
TEST(DiagnoseRounds, OneProcessProfileOfASpanDoesNotGrowWithTheNodes) {
  TempDir tmp;
  std::vector<uint64_t> work;
  for (int n : {2, 8}) {
    const std::string db = tmp.file("proc-" + std::to_string(n) + ".db");
    make_store(db, 300, 150, n, 8);
    auto [st, latest] = open_for_reading(db);
    ASSERT_TRUE(st && latest);
    store::ProfileFilter f;
    f.node = "node-0";
    f.pid = 10000 + kStraggler;
    f.from_ns = latest - server::Diagnoser::kAnalysisSpanNs;
    const uint64_t before = st->read_work();
    auto prof = st->load_profile(f);
    ASSERT_TRUE(prof) << prof.error().message;
    work.push_back(st->read_work() - before);
    EXPECT_FALSE(prof->samples.empty());
    for (const auto& smp : prof->samples) EXPECT_EQ(smp.pid, 10000u + kStraggler);
  }
  RecordProperty("work", std::to_string(work[0]) + " -> " + std::to_string(work[1]));
  constexpr double kSlack = 1.5;  // index depth; a read of every node's windows: 4x
  EXPECT_GT(work[0], 0u);
  EXPECT_LE(static_cast<double>(work[1]), kSlack * static_cast<double>(work[0])) << work[0] << " vs " << work[1];
}

// A collector's diagnoser over the store `db` (written through `st`), its rounds reading through a
// connection of their own, as strata serve sets it up.
struct RoundsDiagnoser {
  std::mutex mu;
  std::ostringstream log;
  std::unique_ptr<server::Diagnoser> d;
  RoundsDiagnoser(store::Store& st, const std::string& db, server::DiagnoserOptions o) {
    d = std::make_unique<server::Diagnoser>(st, mu, o, log);
    auto reader = open_at(db, store::Store::Mode::kReadOnly);
    EXPECT_TRUE(reader);
    if (reader) d->set_reader(std::move(*reader));
  }
};

// The collector's rounds through the Diagnoser itself: the rows each reads do not grow with the
// job's age, and the state carries the job's healthy past from round to round.
TEST(DiagnoseRounds, TheCollectorsRoundsReadTheirSpanOnly) {
  TempDir tmp;
  std::vector<uint64_t> rows;
  for (int steps : {300, 3000}) {
    const std::string db = tmp.file("c-" + std::to_string(steps) + ".db");
    make_store(db, steps, 0);  // healthy throughout
    auto st = store::Store::open_sqlite(db, store::Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st);
    RoundsDiagnoser rd(**st, db, server::DiagnoserOptions{0});
    server::Diagnoser& d = *rd.d;
    auto job = d.diagnose_job("rounds");
    ASSERT_TRUE(job) << job.error().message << rd.log.str();
    auto again = d.diagnose_job("rounds");  // a second round: from the first's end, one span back
    ASSERT_TRUE(again) << again.error().message;
    auto c = d.counters();
    EXPECT_EQ(c.diagnosed, 2u);
    rows.push_back(c.rows_read);
  }
  EXPECT_GT(rows[0], 0u);
  EXPECT_EQ(rows[0], rows[1]) << "a round of the 10x older job read more";
}

// Data an agent ships after a store made by make_store (kRanks ranks on two nodes): `seconds` of
// steps from kEnd on (rank kStraggler 40 ms slow in each, from `slow_from` steps in), one
// collective and one kernel per step, and one 10 s window of metrics, each node in a recording of
// its own (an agent that restarted). With `late`, also a metric window that ended 20 s before kEnd
// (a batch that arrived late: an agent that retried). Written to the store; returns the batch that
// carried it, for Diagnoser::note. Steps and collectives are numbered from `first_step`.
ingest::Batch append_data(const std::string& path, uint64_t from_ns, int steps, int slow_from, bool late,
                          uint64_t first_step = 100000) {
  auto st = open_at(path, store::Store::Mode::kCreateOrAppend);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  ingest::Batch b;
  if (!st) return b;
  auto& s = **st;
  EXPECT_TRUE(s.begin());
  b.set_node("node-0");
  std::vector<int64_t> recs;
  for (int n = 0; n < 2; ++n) recs.push_back(*s.begin_recording({"node-" + std::to_string(n), "synthetic", from_ns, 99, 10}));
  auto* steps_rec = b.add_records()->mutable_steps();
  auto* colls_rec = b.add_records()->mutable_collectives();
  auto* dev_rec = b.add_records()->mutable_device_activity();
  auto* met_rec = b.add_records()->mutable_metrics();
  met_rec->set_start_ns(from_ns);
  met_rec->set_end_ns(from_ns + kWindowNs);
  for (int r = 0; r < kRanks; ++r) {
    const uint32_t pid = 10000 + static_cast<uint32_t>(r);
    const int64_t rec = recs[static_cast<size_t>(r / (kRanks / 2))];
    std::vector<store::StepRecord> rows;
    std::vector<store::CollectiveRecord> colls;
    std::vector<store::DeviceActivity> dev;
    uint64_t t = from_ns;
    for (int k = 0; k < steps; ++k) {
      const uint64_t extra = k >= slow_from ? 40'000'000 : 0;
      store::StepRecord sr;
      sr.pid = pid;
      sr.step = first_step + static_cast<uint64_t>(k);
      sr.start_ns = t;
      sr.end_ns = t + kStepNs + extra;
      const uint64_t compute = 120'000'000 + (r == kStraggler ? extra : 0);
      sr.collective_ns = sr.end_ns - sr.start_ns - compute;
      sr.device_known = true;
      sr.device_compute_ns = 110'000'000 + (r == kStraggler ? extra : 0);
      sr.device_collective_ns = sr.collective_ns;
      sr.gpu_idle_ns = sr.end_ns - sr.start_ns - sr.device_compute_ns - sr.device_collective_ns / 2;
      rows.push_back(sr);
      store::CollectiveRecord c;
      c.pid = pid;
      c.library = "nccl";
      c.op = "allreduce";
      c.comm_id = "c1";
      c.seq = first_step + static_cast<uint64_t>(k);
      c.enter_ns = sr.start_ns + compute;
      c.exit_ns = c.enter_ns + 1000;
      c.device_start_ns = c.enter_ns;
      c.device_end_ns = sr.end_ns - 1;
      colls.push_back(c);
      store::DeviceActivity d;
      d.pid = pid;
      d.kind = "kernel";
      d.name = "gemm";
      d.start_ns = sr.start_ns + 1000;
      d.end_ns = d.start_ns + sr.device_compute_ns;
      dev.push_back(d);
      auto* ps = steps_rec->add_rows();
      ps->set_pid(pid), ps->set_step(sr.step), ps->set_start_ns(sr.start_ns), ps->set_end_ns(sr.end_ns);
      auto* pc = colls_rec->add_rows();
      pc->set_pid(pid), pc->set_enter_ns(c.enter_ns), pc->set_exit_ns(c.exit_ns);
      auto* pd = dev_rec->add_rows();
      pd->set_pid(pid), pd->set_start_ns(d.start_ns), pd->set_end_ns(d.end_ns);
      t = sr.end_ns + 1'000'000;
    }
    EXPECT_TRUE(s.put_steps(rec, rows));
    EXPECT_TRUE(s.put_collectives(rec, colls));
    EXPECT_TRUE(s.put_device_activity(rec, dev));
    if (steps == 0) continue;
    std::vector<store::Metric> m = {{pid, "os.cpu_time_us", "", 6e6}, {pid, "os.runq_wait_us", "", 1e4}};
    EXPECT_TRUE(s.put_metrics(rec, from_ns, from_ns + kWindowNs, m));
    for (const auto& x : m) {
      auto* pm = met_rec->add_metrics();
      pm->set_pid(x.pid), pm->set_name(x.name), pm->set_value(x.value);
    }
  }
  if (late) {
    const uint64_t end = kEnd - 2 * kWindowNs;
    std::vector<store::Metric> m = {{10000 + kStraggler, "os.major_faults", "", 7}};
    EXPECT_TRUE(s.put_metrics(recs[0], end - kWindowNs, end, m));
    auto* lm = b.add_records()->mutable_metrics();
    lm->set_start_ns(end - kWindowNs);
    lm->set_end_ns(end);
    auto* pm = lm->add_metrics();
    pm->set_pid(10000 + kStraggler), pm->set_name("os.major_faults"), pm->set_value(7);
  }
  EXPECT_TRUE(s.commit());
  return b;
}

// The earliest end of the rows a batch carried, as Diagnoser::note keeps it.
uint64_t earliest_end(const ingest::Batch& b) {
  uint64_t e = UINT64_MAX;
  for (const auto& r : b.records()) {
    if (r.has_steps()) for (const auto& x : r.steps().rows()) e = std::min(e, x.end_ns());
    if (r.has_collectives()) for (const auto& x : r.collectives().rows()) e = std::min(e, std::max(x.exit_ns(), x.enter_ns() + 1));
    if (r.has_device_activity()) for (const auto& x : r.device_activity().rows()) e = std::min(e, x.end_ns());
    if (r.has_metrics() && r.metrics().metrics_size() > 0) e = std::min(e, r.metrics().end_ns());
  }
  return e;
}

std::string report_of(store::Reader& s, const diagnose::LoadOptions& lo) {
  auto w = diagnose::load_job_window(s, lo);
  EXPECT_TRUE(w) << (w ? "" : w.error().message);
  if (!w) return {};
  std::ostringstream out;
  diagnose::write_json(diagnose::diagnose(*w), out);
  return out.str();
}

// Issue 16 item 2: a round after a round reads only the rows written since (10 s of new steps),
// not its whole 60 s span again; a late batch (a window that ended 20 s before the latest data)
// is read too: by write sequence (SQLite), that window alone; by time (a store without write
// sequences), from that window's end on. The rows then held are the span's as a whole read gets
// them, in the same order, and the report is the same.
// `db`: a ClickHouse database (clickhouse://HOST:PORT/DB, which has no write sequences: by time);
// empty: a SQLite file.
void refresh_reads_only_the_new_rows(bool by_seq, std::string db = "") {
  SCOPED_TRACE(by_seq ? "by write sequence" : "by time");
  TempDir tmp;
  if (db.empty()) db = tmp.file("refresh.db");
  make_store(db, 600, 0);  // two healthy minutes
  const uint64_t from1 = kEnd - server::Diagnoser::kAnalysisSpanNs;
  diagnose::SpanRows held;
  diagnose::Stats first;
  {
    auto [st, latest] = open_for_reading(db);
    ASSERT_TRUE(st);
    ASSERT_TRUE(diagnose::refresh_span_rows(*st, held, std::nullopt, from1, std::nullopt, &first, nullptr, by_seq));
  }
  EXPECT_GT(first.steps, 0u);
  // 10 s more (40 steps), the straggler slow from the 20th on.
  const uint64_t changed = earliest_end(append_data(db, kEnd + 1'000'000, 40, 20, /*late=*/false));
  auto [st, latest] = open_for_reading(db);
  ASSERT_TRUE(st);
  const uint64_t from2 = from1 + kWindowNs;  // the span moved on
  diagnose::Stats second;
  ASSERT_TRUE(diagnose::refresh_span_rows(*st, held, std::nullopt, from2, changed, &second, nullptr, by_seq));
  // Exactly the new rows: steps, collectives and kernels per step, and two metrics per rank.
  EXPECT_EQ(second.rows(), 40u * kRanks * 3 + 2u * kRanks);
  diagnose::SpanRows whole;
  diagnose::Stats whole_stats;
  ASSERT_TRUE(diagnose::refresh_span_rows(*st, whole, std::nullopt, from2, std::nullopt, &whole_stats));
  EXPECT_GT(whole_stats.rows(), 2 * second.rows()) << "a whole read of the span is not much more";
  // A late window: read from its end on, and nothing before.
  const uint64_t late = earliest_end(append_data(db, 0, 0, 0, /*late=*/true));
  EXPECT_EQ(late, kEnd - 2 * kWindowNs);
  diagnose::Stats third;
  ASSERT_TRUE(diagnose::refresh_span_rows(*st, held, std::nullopt, from2, late, &third, nullptr, by_seq));
  store::RowQuery q;
  q.from_ns = late - 1;
  if (by_seq) {
    EXPECT_EQ(third.rows(), 1u) << "the late window's one row";
  } else {
    EXPECT_EQ(third.rows(), st->query_steps(q)->size() + st->query_metrics(q)->size() + st->query_collectives(q)->size() +
                                st->query_device_activity(q)->size());
  }
  whole = {};
  ASSERT_TRUE(diagnose::refresh_span_rows(*st, whole, std::nullopt, from2, std::nullopt, &whole_stats));
  EXPECT_LT(third.rows(), whole_stats.rows() - first.steps / 2) << "the late window's read reached back to the span's start";
  // The same rows as a whole read of the span, in the same order.
  ASSERT_EQ(held.steps.size(), whole.steps.size());
  ASSERT_EQ(held.metrics.size(), whole.metrics.size());
  ASSERT_EQ(held.collectives.size(), whole.collectives.size());
  ASSERT_EQ(held.device.size(), whole.device.size());
  for (size_t i = 0; i < held.steps.size(); ++i) {
    ASSERT_EQ(std::tie(held.steps[i].node, held.steps[i].pid, held.steps[i].step, held.steps[i].end_ns),
              std::tie(whole.steps[i].node, whole.steps[i].pid, whole.steps[i].step, whole.steps[i].end_ns)) << i;
  }
  for (size_t i = 0; i < held.metrics.size(); ++i) {
    const auto& a = held.metrics[i];
    const auto& b = whole.metrics[i];
    ASSERT_EQ(std::tie(a.node, a.start_ns, a.end_ns, a.metric.pid, a.metric.name, a.metric.value),
              std::tie(b.node, b.start_ns, b.end_ns, b.metric.pid, b.metric.name, b.metric.value)) << i;
  }
  bool late_held = false;
  for (const auto& m : held.metrics) late_held |= m.metric.name == "os.major_faults";
  EXPECT_TRUE(late_held) << "the late window was lost";
  // The report from the held rows is the one from a load of the span from the store.
  diagnose::LoadOptions lo;
  lo.job = "rounds";
  lo.all_recordings = true;
  lo.from_ns = from2;
  const std::string from_store = report_of(*st, lo);
  diagnose::Stats loader_stats;
  lo.rows = &held;
  lo.stats = &loader_stats;
  const std::string from_held = report_of(*st, lo);
  EXPECT_EQ(loader_stats.steps + loader_stats.metrics + loader_stats.collectives + loader_stats.device, 0u)
      << "the load read rows the refresh holds";
  EXPECT_NE(from_store.find("\"rank\":" + std::to_string(kStraggler)), std::string::npos) << from_store.substr(0, 600);
  EXPECT_EQ(from_held, from_store);
}

TEST(DiagnoseRounds, ARefreshReadsOnlyTheNewRowsAndHoldsWhatAWholeReadGets) {
  refresh_reads_only_the_new_rows(/*by_seq=*/true);
  refresh_reads_only_the_new_rows(/*by_seq=*/false);
}

// Issue 16: a job's held span keeps its own processes' rows and its nodes' own (pid 0), not every
// job's: two jobs of the collector held each other's rows, and the rows held grew with the square
// of the jobs. The report from them is the one from the store; a process that joins the job later
// (a restarted rank) makes the next refresh read the span again, its rows included.
TEST(DiagnoseRounds, AJobsHeldRowsAreItsOwnProcessesRows) {
  TempDir tmp;
  const std::string db = tmp.file("two-jobs.db");
  make_store(db, 600, 60);                                                   // "rounds" on node-0, node-1
  make_store(db, 600, 0, 2, kRanks / 2, "other", 20000);                     // beside it on the same nodes
  make_store(db, 600, 0, 1, kRanks / 2, "elsewhere", 30000, "far-node-");   // and on a node of its own
  {
    auto st = open_at(db, store::Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st);
    ASSERT_TRUE((*st)->begin());
    for (const char* node : {"node-0", "far-node-0"}) {  // a GPU's series: the node's own rows
      auto rec = (*st)->begin_recording({node, "synthetic", kEnd - kWindowNs, 99, 10});
      ASSERT_TRUE(rec);
      ASSERT_TRUE((*st)->put_metrics(*rec, kEnd - kWindowNs, kEnd, {{0, "gpu.sm_clock_mhz", "gpu0", 1400}}));
    }
    ASSERT_TRUE((*st)->commit());
  }
  auto [st, latest] = open_for_reading(db);
  ASSERT_TRUE(st);
  diagnose::JobMembers members;
  auto procs = st->processes(std::nullopt);
  ASSERT_TRUE(procs);
  for (const auto& p : *procs) {
    if (p.job == "rounds") members[p.node].insert(p.pid);
  }
  ASSERT_EQ(members.size(), 2u);
  const uint64_t from = kEnd - server::Diagnoser::kAnalysisSpanNs;
  diagnose::SpanRows held, whole;
  ASSERT_TRUE(diagnose::refresh_span_rows(*st, held, std::nullopt, from, std::nullopt, nullptr, nullptr, true, &members));
  ASSERT_TRUE(diagnose::refresh_span_rows(*st, whole, std::nullopt, from, std::nullopt));
  auto member = [&](const std::string& node, uint32_t pid) { return members.count(node) && members[node].count(pid); };
  size_t own_steps = 0;
  for (const auto& r : whole.steps.view()) own_steps += member(r.node, r.pid);
  EXPECT_GT(own_steps, 0u);
  EXPECT_EQ(held.steps.size(), own_steps) << "of " << whole.steps.size();
  for (const auto& r : held.steps.view()) EXPECT_TRUE(member(r.node, r.pid)) << r.node << " " << r.pid;
  size_t node_rows = 0;
  for (const auto& r : held.metrics.view()) {
    if (r.metric.pid == 0) {
      ++node_rows;
      EXPECT_EQ(r.node, "node-0") << "a node-wide row of a node the job does not run on";
    } else {
      EXPECT_TRUE(member(r.node, r.metric.pid)) << r.node << " " << r.metric.pid;
    }
  }
  EXPECT_EQ(node_rows, 1u);
  // The report from the job's own rows is the one from a load of the span from the store.
  diagnose::LoadOptions lo;
  lo.job = "rounds";
  lo.all_recordings = true;
  lo.from_ns = from;
  const std::string from_store = report_of(*st, lo);
  lo.rows = &held;
  EXPECT_EQ(report_of(*st, lo), from_store);
  EXPECT_NE(from_store.find("\"rank\":" + std::to_string(kStraggler)), std::string::npos) << from_store.substr(0, 600);
  // A process that joins the job: the span is read again, its rows held.
  members["node-1"].insert(20000 + kRanks - 1);
  diagnose::Stats again;
  ASSERT_TRUE(diagnose::refresh_span_rows(*st, held, std::nullopt, from, std::nullopt, &again, nullptr, true, &members));
  size_t joined_steps = 0;
  for (const auto& r : whole.steps.view()) joined_steps += r.node == "node-1" && r.pid == 20000 + kRanks - 1;
  EXPECT_GT(joined_steps, 0u);
  // (The read returns only the members' rows: RowQuery::keep_process drops the others as they are read.)
  EXPECT_EQ(again.steps, own_steps + joined_steps) << "not read again";
  EXPECT_EQ(held.steps.size(), own_steps + joined_steps);
  // Asked for fewer (a process left): what is held is kept, nothing is read but what is new.
  members["node-1"].erase(20000 + kRanks - 1);
  diagnose::Stats fewer;
  ASSERT_TRUE(diagnose::refresh_span_rows(*st, held, std::nullopt, from, std::nullopt, &fewer, nullptr, true, &members));
  EXPECT_EQ(fewer.rows(), 0u);
}

// A refresh reads by the time index, bounded by the rowids it took first: the SQLite work of a
// whole read of the span, and of one after new data, does not grow with the job's age (a rowid
// bound the planner took for the scan would walk the whole table).
TEST(DiagnoseRounds, ARefreshsWorkDoesNotGrowWithTheJobsAge) {
  TempDir tmp;
  std::vector<std::pair<uint64_t, uint64_t>> work;  // (whole, after new data)
  for (int steps : {300, 6000}) {
    const std::string db = tmp.file("age-" + std::to_string(steps) + ".db");
    make_store(db, steps, 0);
    const uint64_t from = kEnd - server::Diagnoser::kAnalysisSpanNs;
    diagnose::SpanRows held;
    auto [st, latest] = open_for_reading(db);
    ASSERT_TRUE(st);
    uint64_t w0 = st->read_work();
    ASSERT_TRUE(diagnose::refresh_span_rows(*st, held, std::nullopt, from, std::nullopt));
    const uint64_t whole = st->read_work() - w0;
    const uint64_t changed = earliest_end(append_data(db, kEnd + 1'000'000, 40, 1000, /*late=*/false));
    w0 = st->read_work();
    ASSERT_TRUE(diagnose::refresh_span_rows(*st, held, std::nullopt, from + kWindowNs, changed));
    work.push_back({whole, st->read_work() - w0});
  }
  std::cout << "refresh work (whole, new rows): 300 steps " << work[0].first << ", " << work[0].second << "; 6,000 steps "
            << work[1].first << ", " << work[1].second << "\n";
  constexpr double kMaxWorkGrowth = 1.5;  // as ARoundReadsTheSameRowsWhateverTheJobsAge: index pages
  EXPECT_LE(static_cast<double>(work[1].first), kMaxWorkGrowth * static_cast<double>(work[0].first))
      << work[0].first << " vs " << work[1].first;
  EXPECT_LE(static_cast<double>(work[1].second), kMaxWorkGrowth * static_cast<double>(work[0].second))
      << work[0].second << " vs " << work[1].second;
  EXPECT_LT(work[0].second, work[0].first) << "the read of the new rows did more than the whole span's";
}

// The collector's rounds (Diagnoser) read through such a refresh: a round after a round reads the
// rows its note()s said were written, not the span again; with nothing written since, none.
TEST(DiagnoseRounds, ARoundAfterARoundReadsOnlyTheNewRows) {
  TempDir tmp;
  const std::string db = tmp.file("rounds.db");
  make_store(db, 600, 0);
  auto st = store::Store::open_sqlite(db, store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st);
  RoundsDiagnoser rd(**st, db, server::DiagnoserOptions{0});
  server::Diagnoser& d = *rd.d;
  ASSERT_TRUE(d.diagnose_job("rounds")) << rd.log.str();
  const uint64_t first = d.counters().rows_read;
  ASSERT_TRUE(d.diagnose_job("rounds"));
  const uint64_t unchanged = d.counters().rows_read - first;
  auto batch = append_data(db, kEnd + 1'000'000, 40, 1000, /*late=*/false);
  d.note(batch);
  ASSERT_TRUE(d.diagnose_job("rounds"));
  const uint64_t after_new = d.counters().rows_read - first - unchanged;
  EXPECT_GT(first, 0u);
  // Rows: steps, collectives, device activity and metrics; the stacks (samples) are still read
  // per span, and counted too: they are at most what the first round read of them.
  const uint64_t new_rows = 40u * kRanks * 3 + 2u * kRanks;
  EXPECT_LT(unchanged, first / 4) << "a round with nothing new re-read the span";
  EXPECT_GE(after_new, new_rows);
  EXPECT_LT(after_new, new_rows + unchanged + kRanks * 4) << "first round " << first << ", unchanged " << unchanged;
}

// The rows the rounds hold are bounded for every job together (DiagnoserOptions::max_held_rows):
// past the bound other jobs' rows go (TheLeastRecentlyActiveJobsRowsGoFirst), never the rows of the
// job whose round it is. Fails if a round with nothing new reads much, under or over the bound.
TEST(DiagnoseRounds, AJobOverTheBoundAloneKeepsItsRows) {
  TempDir tmp;
  const std::string db = tmp.file("held.db");
  make_store(db, 600, 0);
  auto st = store::Store::open_sqlite(db, store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st);
  auto rounds = [&](size_t bound, uint64_t& first, uint64_t& second, server::DiagnoserCounters& c) {
    server::DiagnoserOptions o{0};
    o.max_held_rows = bound;
    RoundsDiagnoser rd(**st, db, o);
    server::Diagnoser& d = *rd.d;
    ASSERT_TRUE(d.diagnose_job("rounds")) << rd.log.str();
    first = d.counters().rows_read;
    ASSERT_TRUE(d.diagnose_job("rounds"));
    second = d.counters().rows_read - first;
    c = d.counters();
  };
  uint64_t first = 0, second = 0;
  server::DiagnoserCounters held, bounded;
  rounds(server::kMaxHeldRows, first, second, held);
  EXPECT_GT(held.held_rows, 0u);
  EXPECT_EQ(held.rows_released, 0u);
  EXPECT_LT(second, first / 4) << "with rows held, a round with nothing new reads little";
  // One job over the bound keeps its rows: its next round needs them all (a whole read holds as
  // many at once). Let go, an 8,000-rank job near the bound re-read its span at every round.
  rounds(100, first, second, bounded);
  EXPECT_EQ(bounded.held_rows, held.held_rows);
  EXPECT_EQ(bounded.rows_released, 0u) << "the round's own job let its rows go";
  EXPECT_LT(second, first / 4) << "a round over the bound read its whole span again";
}

// Two alike jobs of kRanks ranks each, `a` on nodes a-node-N and `b` on b-node-N, in one SQLite
// store at `db`; the store opened for writing.
Result<std::unique_ptr<store::Store>> two_job_store(const std::string& db, const std::string& a, const std::string& b) {
  make_store(db, 600, 0, 2, kRanks / 2, a, 10000, "a-node-");
  make_store(db, 600, 0, 2, kRanks / 2, b, 20000, "b-node-");
  return store::Store::open_sqlite(db, store::Store::Mode::kCreateOrAppend);
}

// Two jobs in one collector, over the bound for both: the least recently active job's rows go, and
// the job diagnosed now keeps its own (before, the job of the round let its rows go and re-read its
// whole span at every round while an earlier job's rows sat held). A job quiet for rows_idle_ns lets
// its rows go at the next round of another job, even under the bound.
TEST(DiagnoseRounds, TheLeastRecentlyActiveJobsRowsGoFirst) {
  TempDir tmp;
  const std::string db = tmp.file("two-jobs.db");
  auto st = two_job_store(db, "first", "second");
  ASSERT_TRUE(st);
  // What one job's round holds: the span's rows of its own processes (AJobsHeldRowsAreItsOwn...;
  // the two jobs are alike, and so are their rounds' rows).
  size_t one = 0;
  {
    RoundsDiagnoser rd(**st, db, server::DiagnoserOptions{0});
    ASSERT_TRUE(rd.d->diagnose_job("first")) << rd.log.str();
    one = rd.d->counters().held_rows;
    ASSERT_GT(one, 0u);
  }
  // Room for one job's rows and a half.
  server::DiagnoserOptions o{0};
  o.max_held_rows = one + one / 2;
  RoundsDiagnoser rd(**st, db, o);
  server::Diagnoser& d = *rd.d;
  ASSERT_TRUE(d.diagnose_job("first")) << rd.log.str();
  ASSERT_TRUE(d.diagnose_job("second")) << rd.log.str();
  auto c = d.counters();
  EXPECT_EQ(c.rows_released, 1u) << "one job's rows go";
  EXPECT_EQ(c.held_rows, one) << "one job's rows stay held";
  const uint64_t before = c.rows_read;
  ASSERT_TRUE(d.diagnose_job("second"));
  const uint64_t again = d.counters().rows_read - before;
  EXPECT_LT(again, before / 8) << "the second job let its own rows go: its round re-read its span (" << again
                               << " rows; both first rounds " << before << ")";
  EXPECT_EQ(d.counters().rows_released, 1u);

  // Quiet: with rows_idle_ns 0 every other job is quiet, and its rows go at the next round.
  server::DiagnoserOptions q{0};
  q.rows_idle_ns = 0;
  RoundsDiagnoser quiet(**st, db, q);
  ASSERT_TRUE(quiet.d->diagnose_job("first")) << quiet.log.str();
  EXPECT_EQ(quiet.d->counters().held_rows, one);
  EXPECT_EQ(quiet.d->counters().rows_released, 0u) << "a job's own round never counts it quiet";
  ASSERT_TRUE(quiet.d->diagnose_job("second"));
  EXPECT_EQ(quiet.d->counters().rows_released, 1u) << "the quiet job kept its rows";
  EXPECT_EQ(quiet.d->counters().held_rows, one);
}

// A job that ended lets its rows go once it has sent nothing for three of its agents' windows
// (kQuietWindows; 10 s windows here, so 30 s), not after rows_idle_ns: a collector whose jobs
// follow one another held an ended job's span beside the next job's for two minutes (2.2 GB at
// 8,000 ranks). Never sooner than rows_quiet_min_ns, never later than rows_idle_ns.
TEST(DiagnoseRounds, AnEndedJobsRowsGoAfterThreeOfItsWindows) {
  TempDir tmp;
  const std::string db = tmp.file("ended.db");
  auto st = two_job_store(db, "ended", "running");
  ASSERT_TRUE(st);
  const uint64_t t0 = 1'800'000'000'000'000'000ull;
  auto after = [&](const server::DiagnoserOptions& base, double quiet_s) {
    uint64_t now = t0;
    server::DiagnoserOptions o = base;
    o.clock = [&now] { return now; };
    RoundsDiagnoser rd(**st, db, o);
    EXPECT_TRUE(rd.d->diagnose_job("ended")) << rd.log.str();
    const uint64_t held = rd.d->counters().held_rows;
    EXPECT_GT(held, 0u);
    now += static_cast<uint64_t>(quiet_s * 1e9);
    EXPECT_TRUE(rd.d->diagnose_job("running")) << rd.log.str();  // "ended" sent nothing since
    return rd.d->counters().rows_released;
  };
  server::DiagnoserOptions o{0};
  EXPECT_EQ(after(o, 29), 0u) << "released before three 10 s windows passed";
  EXPECT_EQ(after(o, 31), 1u) << "an ended job kept its rows for rows_idle_ns (" << o.rows_idle_ns / 1e9 << " s)";
  // The floor: a job quiet for three windows, not yet for rows_quiet_min_ns, keeps them.
  server::DiagnoserOptions floor{0};
  floor.rows_quiet_min_ns = 60'000'000'000ull;
  EXPECT_EQ(after(floor, 45), 0u);
  EXPECT_EQ(after(floor, 61), 1u);
  // The ceiling: rows_idle_ns below three windows wins.
  server::DiagnoserOptions ceiling{0};
  ceiling.rows_idle_ns = 10'000'000'000ull;
  ceiling.rows_quiet_min_ns = 0;
  EXPECT_EQ(after(ceiling, 11), 1u);
}

// Rows (steps and metrics) of the processes with pids in [lo, hi) that end after from_ns.
uint64_t rows_of(store::Store& s, uint64_t from_ns, uint32_t lo, uint32_t hi) {
  store::RowQuery q;
  q.from_ns = from_ns;
  uint64_t n = 0;
  auto steps = s.query_steps(q);
  EXPECT_TRUE(steps);
  if (steps) {
    for (const auto& r : *steps) n += r.pid >= lo && r.pid < hi ? 1 : 0;
  }
  auto metrics = s.query_metrics(q);
  EXPECT_TRUE(metrics);
  if (metrics) {
    for (const auto& r : *metrics) n += r.metric.pid >= lo && r.metric.pid < hi ? 1 : 0;
  }
  return n;
}

// A young job's first round reads its span from its first process's start, not the whole analysis
// span: what the nodes recorded before it (the job before it, on the same nodes) is no part of it,
// and was read to be thrown away (at 8,000 ranks, 2-3.6 s of a new job's first rounds). Job
// "earlier" ran two minutes on node-0 and node-1; job "next" started on the same nodes 12 s before
// the end: its first round passes over only what "earlier" recorded since then.
TEST(DiagnoseRounds, AYoungJobsFirstRoundReadsFromItsFirstProcess) {
  TempDir tmp;
  const std::string db = tmp.file("young.db");
  make_store(db, 600, 0, 2, kRanks / 2, "earlier", 10000);
  const uint64_t next_t0 = make_store(db, 60, 0, 2, kRanks / 2, "next", 20000);
  auto st = store::Store::open_sqlite(db, store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st);
  const uint64_t since_start = rows_of(**st, next_t0, 10000, 10000 + kRanks);
  const uint64_t whole_span = rows_of(**st, kEnd - server::Diagnoser::kAnalysisSpanNs, 10000, 10000 + kRanks);
  ASSERT_GT(whole_span, 2 * since_start);  // (else this test could not tell the two apart)
  RoundsDiagnoser rd(**st, db, server::DiagnoserOptions{0});
  ASSERT_TRUE(rd.d->diagnose_job("next")) << rd.log.str();
  EXPECT_GT(rd.d->counters().rows_read, 0u);
  EXPECT_LE(rd.d->counters().rows_passed_over, since_start);
  EXPECT_GT(rd.d->counters().held_rows, 0u);
}

// A job whose round comes before the store shows any of its processes (noted by a batch that the
// rounds' connection does not see yet) reads nothing: read as a job without names, its span was
// every process's, and a new job's first round at 8,000 ranks held the job before it's 2.6M rows.
TEST(DiagnoseRounds, AJobNoProcessNamesYetReadsNothing) {
  TempDir tmp;
  const std::string db = tmp.file("unseen.db");
  make_store(db, 600, 0, 2, kRanks / 2, "earlier", 10000, "a-node-");
  auto st = store::Store::open_sqlite(db, store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st);
  RoundsDiagnoser rd(**st, db, server::DiagnoserOptions{0});
  auto r = rd.d->diagnose_job("next");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("no process of job 'next'"), std::string::npos) << r.error().message;
  EXPECT_EQ(rd.d->counters().rows_read, 0u);
  EXPECT_EQ(rd.d->counters().held_rows, 0u);
  // The job before it is diagnosed as ever.
  ASSERT_TRUE(rd.d->diagnose_job("earlier")) << rd.log.str();
  EXPECT_GT(rd.d->counters().held_rows, 0u);
}

// The rounds on ClickHouse, which has no write sequences: a round reads the rows that end at or
// after the earliest end its note()s saw (Diagnoser::note), and those replace the held ones. These
// need a server (STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT, a throwaway database per test); a
// unit run has none and skips; tests/cluster/cluster_test.py (clickhouse) runs every
// DiagnoseRounds.*OnClickHouse test against the server it starts and fails unless each passes.
std::string clickhouse_db(const std::string& name) {
  const char* url = std::getenv("STRATA_TEST_CLICKHOUSE");
  if (!url || !*url) return "";
  return std::string(url) + "/strata_unit_rounds_" + name + "_" + std::to_string(getpid());
}
constexpr const char* kNoClickHouse = "set STRATA_TEST_CLICKHOUSE=clickhouse://HOST:PORT to run against ClickHouse";

// As ARefreshReadsOnlyTheNewRowsAndHoldsWhatAWholeReadGets by time, on a real ClickHouse: 10 s of
// new rows read once, a late window (it ended 20 s before the newest row held) not lost, and the
// rows held are a whole read's, in its order, with the same report.
TEST(DiagnoseRounds, ARefreshReadsOnlyTheNewRowsAndHoldsWhatAWholeReadGetsOnClickHouse) {
  const std::string db = clickhouse_db("refresh");
  if (db.empty()) GTEST_SKIP() << kNoClickHouse;
  refresh_reads_only_the_new_rows(/*by_seq=*/false, db);
}

// The collector's rounds (Diagnoser) on ClickHouse, round after round: after each, the rows the job
// holds are exactly those of a whole read of the round's span (none missed, none twice), and its
// report is that of a diagnoser that reads the whole span every round. Rows written between
// rounds are read by the next one only; a straggler that begins in new data is found in the round
// after it arrives; a late batch (a metric window that ended 20 s before the newest row of the
// round before: an agent that retried) is held by the next round, not lost below a watermark.
TEST(DiagnoseRounds, RoundsHoldEachRowOnceAndFindALaterFaultOnClickHouse) {
  const std::string db = clickhouse_db("rounds");
  if (db.empty()) GTEST_SKIP() << kNoClickHouse;
  make_store(db, 600, 0);  // two healthy minutes
  auto st = open_at(db, store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  auto reader = open_at(db, store::Store::Mode::kReadOnly);
  ASSERT_TRUE(reader) << reader.error().message;
  RoundsDiagnoser rd(**st, db, server::DiagnoserOptions{0});
  server::Diagnoser& d = *rd.d;
  // The reference: it lets its rows go after every round (hold_rows false), so each of its rounds
  // reads the whole span, as rounds did before they held rows.
  server::DiagnoserOptions whole_every_round{0};
  whole_every_round.hold_rows = false;
  RoundsDiagnoser ref(**st, db, whole_every_round);
  using server::Diagnoser;
  uint64_t last_end = 0;  // the newest step of the round before, as Diagnoser::diagnose_job keeps it
  struct Round {
    uint64_t rows_read = 0;  // by the incremental diagnoser in this round
    std::string report;      // its kept report
  };
  auto round = [&](const std::string& what) {
    SCOPED_TRACE(what);
    Round r;
    const uint64_t read_before = d.counters().rows_read;
    auto job = d.diagnose_job("rounds");
    EXPECT_TRUE(job) << (job ? "" : job.error().message) << rd.log.str();
    r.rows_read = d.counters().rows_read - read_before;
    auto kept = (*st)->latest_diagnosis("rounds");
    EXPECT_TRUE(kept && *kept) << "no kept diagnosis";
    if (kept && *kept) r.report = (*kept)->report_json;
    // The span the round read, as diagnose_job picks it, and a whole read of it.
    auto latest = (*reader)->latest_step_ns();
    EXPECT_TRUE(latest && *latest);
    if (!latest || !*latest) return r;
    uint64_t from = (last_end ? last_end : **latest) - Diagnoser::kAnalysisSpanNs;
    from = std::max(from, **latest - Diagnoser::kMaxRoundSpanNs);
    last_end = std::max(last_end, **latest);
    diagnose::SpanRows whole;
    EXPECT_TRUE(diagnose::refresh_span_rows(**reader, whole, std::nullopt, from, std::nullopt));
    EXPECT_EQ(d.counters().held_rows, whole.size()) << "the rows held are not a whole read's: some missed or twice";
    auto ref_job = ref.d->diagnose_job("rounds");
    EXPECT_TRUE(ref_job) << (ref_job ? "" : ref_job.error().message) << ref.log.str();
    EXPECT_EQ(ref.d->counters().held_rows, 0u) << "the reference held its rows";
    auto ref_kept = (*st)->latest_diagnosis("rounds");
    EXPECT_TRUE(ref_kept && *ref_kept);
    if (ref_kept && *ref_kept) {
      EXPECT_EQ(r.report, (*ref_kept)->report_json) << "a whole read's report differs";
    }
    return r;
  };
  const std::string straggler = "\"rank\":" + std::to_string(kStraggler) + ",";
  const Round first = round("the first round: the whole span");
  EXPECT_GT(first.rows_read, 0u);
  EXPECT_EQ(first.report.find(straggler), std::string::npos) << "a finding on a healthy job: " << first.report.substr(0, 600);
  const Round unchanged = round("nothing written since");
  EXPECT_LT(unchanged.rows_read, first.rows_read / 4) << "a round with nothing new re-read the span";
  // 10 s more, healthy (40 steps: steps, collectives and kernels per rank, two metrics).
  const uint64_t new_rows = 40u * kRanks * 3 + 2u * kRanks;
  uint64_t t = kEnd + 1'000'000;
  d.note(append_data(db, t, 40, /*slow_from=*/1000, /*late=*/false));
  const Round healthy = round("10 s of healthy rows");
  EXPECT_GE(healthy.rows_read, new_rows);
  EXPECT_LT(healthy.rows_read, new_rows + unchanged.rows_read + kRanks * 4) << "the round read more than the new rows";
  EXPECT_EQ(healthy.report.find(straggler), std::string::npos) << healthy.report.substr(0, 600);
  // 10 s in which rank kStraggler is 40 ms slow in every step: found in the round after.
  t += 11 * kWindowNs / 10;
  d.note(append_data(db, t, 40, /*slow_from=*/0, /*late=*/false, /*first_step=*/100040));
  const Round slow = round("10 s with a straggler");
  EXPECT_GE(slow.rows_read, new_rows);
  EXPECT_NE(slow.report.find(straggler), std::string::npos) << "the straggler was not found: " << slow.report.substr(0, 600);
  // A late batch: its window ended 20 s before kEnd, 40 s before the newest row the last round read.
  const ingest::Batch late = append_data(db, 0, 0, 0, /*late=*/true);
  ASSERT_LT(earliest_end(late), last_end);
  d.note(late);
  const Round after_late = round("a late batch");
  EXPECT_GE(after_late.rows_read, 1u);
  store::RowQuery q;
  q.from_ns = earliest_end(late) - 1;
  auto late_rows = (*reader)->query_metrics(q);
  ASSERT_TRUE(late_rows);
  bool stored = false;
  for (const auto& m : *late_rows) stored |= m.metric.name == "os.major_faults";
  EXPECT_TRUE(stored) << "the late window is not in the store";
  std::cout << "rounds on ClickHouse, rows read: first " << first.rows_read << ", nothing new " << unchanged.rows_read
            << ", 10 s healthy " << healthy.rows_read << ", 10 s straggler " << slow.rows_read << ", late batch "
            << after_late.rows_read << "; held now " << d.counters().held_rows << "\n";
}

std::string culprit_of(const diagnose::Diagnosis& dx, int rank) {
  for (const auto& f : dx.findings) {
    if (f.rank == rank) return f.culprit;
  }
  return "(no finding on rank " + std::to_string(rank) + ")";
}

// Issue 16: at 600 steps a straggler that began recently had culprit `unknown` (its profile summed
// over the healthy past). With the latest stretch and its windows alone, the function is named, at
// any age; the same through the collector's round.
TEST(DiagnoseRounds, TheCulpritDoesNotFadeWithAge) {
  TempDir tmp;
  for (int steps : {60, 600, 6000}) {
    const std::string db = tmp.file("fade-" + std::to_string(steps) + ".db");
    // The straggler began 100 steps (about 25 s) before the end; half-way in the short job.
    make_store(db, steps, steps >= 600 ? 100 : steps / 2);
    auto st = store::Store::open_sqlite(db, store::Store::Mode::kReadOnly);
    ASSERT_TRUE(st);
    diagnose::LoadOptions lo;
    lo.all_recordings = true;
    auto w = diagnose::load_latest_with_baseline(**st, lo, 600'000'000'000ull, 600'000'000'000ull);
    ASSERT_TRUE(w) << w.error().message;
    auto dx = diagnose::diagnose(*w);
    EXPECT_NE(culprit_of(dx, kStraggler).find("slow_augment"), std::string::npos)
        << steps << " steps: " << culprit_of(dx, kStraggler);
    // The CLI's default reads the same.
    auto cli = run(strata_bin() + " diagnose " + db + " --json");
    ASSERT_EQ(cli.exit_code, 0) << cli.err;
    EXPECT_NE(cli.out.find("slow_augment"), std::string::npos) << steps << " steps: " << cli.out.substr(0, 600);
  }
}

// `--job J` counts its span back from J's own latest step: a job that ended an hour before another
// began is diagnosed at its end, not in the other job's latest stretch, where it has no step.
TEST(DiagnoseRounds, AJobIsDiagnosedAtItsOwnEnd) {
  TempDir tmp;
  const std::string db = tmp.file("two-jobs.db");
  make_store(db, 600, 100, 2, kRanks / 2, "early", 10000, "node-", kEnd - 3'600'000'000'000ull);
  make_store(db, 120, 0, 2, kRanks / 2, "late", 20000);
  for (const char* span : {"", " --last 5m"}) {
    auto early = run(strata_bin() + " diagnose " + db + " --job early --json" + span);
    ASSERT_EQ(early.exit_code, 0) << span << ": " << early.err;
    EXPECT_NE(early.out.find("\"job\":\"early\""), std::string::npos) << span << ": " << early.out.substr(0, 300);
    EXPECT_NE(early.out.find("slow_augment"), std::string::npos) << span << ": " << early.out.substr(0, 600);
    auto late = run(strata_bin() + " diagnose " + db + " --job late --json" + span);
    ASSERT_EQ(late.exit_code, 0) << span << ": " << late.err;
    EXPECT_EQ(late.out.find("slow_augment"), std::string::npos) << span << ": " << late.out.substr(0, 600);
  }
  auto none = run(strata_bin() + " diagnose " + db + " --job nope");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("early"), std::string::npos) << none.err;
}

TEST(DiagnoseRounds, LastTakesADurationAndRefusesAnythingElse) {
  TempDir tmp;
  const std::string db = tmp.file("last.db");
  make_store(db, 600, 100);
  auto ok = run(strata_bin() + " diagnose " + db + " --last 30s --json");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("slow_augment"), std::string::npos) << ok.out.substr(0, 400);
  for (const char* bad : {"10", "10x", "m", "-5m", "1.5h", "0s", "10 m", "9999999999s"}) {
    auto r = run(strata_bin() + " diagnose " + db + " --last '" + bad + "'");
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_NE(r.err.find("--last"), std::string::npos) << bad << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "one line: " << r.err;
    EXPECT_TRUE(r.out.empty()) << bad;
  }
  auto both = run(strata_bin() + " diagnose " + db + " --last 10m --from 5");
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.err.find("not both"), std::string::npos) << both.err;
  auto remote = run(strata_bin() + " diagnose --server http://127.0.0.1:1 --last 10m");
  EXPECT_EQ(remote.exit_code, 1);
  EXPECT_NE(remote.err.find("--last reads a file"), std::string::npos) << remote.err;
}

// Retention deletes the rows that ended before the cutoff, in batches, and keeps the rest (and the
// processes, which a running job needs whatever their age).
TEST(DiagnoseRounds, RetentionDeletesOldRowsAndKeepsNewOnes) {
  TempDir tmp;
  const std::string db = tmp.file("retention.db");
  const uint64_t t0 = make_store(db, 600, 0);
  const uint64_t cutoff = t0 + (kEnd - t0) / 2;
  auto count = [&](store::Store& s) {
    std::map<std::string, uint64_t> n;
    auto steps = s.steps();
    auto metrics = s.metrics("");
    auto p = s.load_profile(store::ProfileFilter{});
    EXPECT_TRUE(steps && metrics && p);
    if (!steps || !metrics || !p) return n;
    // Old: ended before the cutoff.
    for (const auto& x : *steps) n[x.end_ns < cutoff ? "old steps" : "new steps"]++;
    for (const auto& x : *metrics) n[x.end_ns < cutoff ? "old metrics" : "new metrics"]++;
    for (const auto& x : p->samples) n["samples"] += x.count;
    n["processes"] = s.processes()->size();
    return n;
  };
  auto st = store::Store::open_sqlite(db, store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st);
  auto before = count(**st);
  ASSERT_GT(before["old steps"], 0u);
  ASSERT_GT(before["new steps"], 0u);
  // Windows that start before the cutoff go with their stack counts.
  store::ProfileFilter newer;
  newer.from_ns = cutoff;
  uint64_t new_samples = 0;
  auto newer_profile = (*st)->load_profile(newer);
  ASSERT_TRUE(newer_profile);
  for (const auto& x : newer_profile->samples) new_samples += x.count;
  uint64_t batches = 0, deleted = 0;
  while (true) {
    auto n = (*st)->delete_before(cutoff, 1000);
    ASSERT_TRUE(n) << n.error().message;
    if (*n == 0) break;
    deleted += *n;
    ++batches;
    ASSERT_LT(batches, 1000u);
  }
  EXPECT_GT(batches, 1u) << "one batch deleted everything: the batches are not bounded";
  auto after = count(**st);
  EXPECT_EQ(after["old steps"], 0u);
  EXPECT_EQ(after["old metrics"], 0u);
  EXPECT_EQ(after["new steps"], before["new steps"]);
  EXPECT_EQ(after["new metrics"], before["new metrics"]);
  EXPECT_EQ(after["processes"], before["processes"]);
  EXPECT_LT(after["samples"], before["samples"]);
  EXPECT_GE(after["samples"], new_samples > 0 ? 1u : 0u);
  EXPECT_GE(deleted, before["old steps"] + before["old metrics"]);
}

TEST(DiagnoseRounds, ARetentionThatIsNotANumberOfDaysIsRefused) {
  for (const char* bad : {"abc", "0", "-1", "", "1.5", "99999999"}) {
    auto s = server::parse_sqlite_spec(std::string("sqlite:x.db?retention_days=") + bad);
    ASSERT_FALSE(s) << bad;
    EXPECT_EQ(s.error().exit_code, 2);
    EXPECT_NE(s.error().message.find("retention_days"), std::string::npos) << s.error().message;
  }
  auto good = server::parse_sqlite_spec("sqlite:/tmp/x.db?retention_days=30");
  ASSERT_TRUE(good);
  EXPECT_EQ(good->path, "/tmp/x.db");
  EXPECT_EQ(good->retention_days, 30u);
  EXPECT_FALSE(server::parse_sqlite_spec("sqlite:x.db?retain=3"));
  TempDir tmp;
  auto r = run(strata_bin() + " serve --store 'sqlite:" + tmp.file("s.db") + "?retention_days=abc' --listen 127.0.0.1:0");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find("retention_days"), std::string::npos) << r.err;
  EXPECT_FALSE(std::ifstream(tmp.file("s.db")).good()) << "a refused store spec left a file";
}

// Issue 16 at 1,000 nodes: the collector's SQLite write-ahead log grew to 18.5 GB in 7 minutes.
// SQLite's own checkpoints cannot restart the log while a reader holds a snapshot in it, and the
// rounds' readers overlap. Store::truncate_log empties it when no reader stays, and says so when
// one does; Diagnoser::reader_gap gives it that moment: reads that began finish first, reads that
// would begin wait.
TEST(DiagnoseRounds, TheWriteAheadLogIsTruncatedInAGapOfTheReads) {
  TempDir tmp;
  const std::string db = tmp.file("wal.db");
  make_store(db, 300, 0);
  auto st = store::Store::open_sqlite(db, store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  auto& w = **st;
  auto write_more = [&](int n) {
    auto rec = w.latest_recording();
    ASSERT_TRUE(rec && *rec);
    for (int i = 0; i < n; ++i) ASSERT_TRUE(w.put_stat(**rec, "wal_test." + std::to_string(i), i));
  };
  auto stats_of = [&](store::Store& s) {
    auto rec = s.latest_recording();
    return rec && *rec ? s.stats(**rec)->size() : size_t{0};
  };
  write_more(200);  // each put a transaction: the log grows
  // The writer's own kept statements (a stack's frames are interned through them) leave no read
  // transaction behind on its connection: one did, and no truncation could ever run.
  Stack stk{fn("wal_test_leaf"), fn("wal_test_root")};
  ASSERT_TRUE(w.intern_stack(stk));
  EXPECT_GT(w.log_bytes(), 0u);

  // A reader in the middle of a read (a snapshot held) while the writer goes on: no truncation.
  sqlite3* r = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db.c_str(), &r, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(r, "BEGIN; SELECT count(*) FROM steps;", nullptr, nullptr, nullptr), SQLITE_OK);
  write_more(50);
  auto busy = w.truncate_log();
  ASSERT_FALSE(busy);
  EXPECT_NE(busy.error().message.find("a reader stayed"), std::string::npos) << busy.error().message;
  EXPECT_GT(w.log_bytes(), 0u);
  ASSERT_EQ(sqlite3_exec(r, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(r);
  const size_t stats_before = stats_of(w);
  ASSERT_TRUE(w.truncate_log());
  EXPECT_EQ(w.log_bytes(), 0u);
  EXPECT_EQ(stats_of(w), stats_before) << "nothing lost";

  // The gap: a read in progress finishes before it, a read asked for meanwhile runs after it.
  std::mutex mu;
  std::ostringstream log;
  server::Diagnoser d(w, mu, server::DiagnoserOptions{0}, log);
  auto reader = store::Store::open_sqlite(db, store::Store::Mode::kReadOnly);
  ASSERT_TRUE(reader);
  d.set_reader(std::move(*reader));
  std::mutex ev_mu;
  std::condition_variable ev_cv;
  std::vector<std::string> events;
  bool release = false;
  auto event = [&](const std::string& e) {
    std::lock_guard lock(ev_mu);
    events.push_back(e);
    ev_cv.notify_all();
  };
  std::thread a([&] {
    d.with_reader([&](store::Store& s) {
      event("read A begins");
      std::unique_lock lock(ev_mu);
      ev_cv.wait(lock, [&] { return release; });
      lock.unlock();
      event(stats_of(s) == stats_before ? "read A ends" : "read A saw other rows");
    });
  });
  {
    std::unique_lock lock(ev_mu);
    ev_cv.wait(lock, [&] { return !events.empty(); });
  }
  std::thread gap([&] { d.reader_gap([&] { event("gap"); }); });
  auto gap_ran = [&] {
    std::lock_guard lock(ev_mu);
    return std::find(events.begin(), events.end(), "gap") != events.end();
  };
  while (!d.gap_pending() && !gap_ran()) std::this_thread::yield();
  std::thread c([&] { d.with_reader([&](store::Store&) { event("read C"); }); });
  {
    std::lock_guard lock(ev_mu);
    EXPECT_EQ(events.size(), 1u) << "the gap ran while a read was in progress";
    release = true;
  }
  ev_cv.notify_all();
  a.join();
  gap.join();
  c.join();
  EXPECT_EQ(events, (std::vector<std::string>{"read A begins", "read A ends", "gap", "read C"}));
}

TEST(DiagnoseRounds, TheWalLimitIsAWholeNumberOfMegabytes) {
  auto good = server::parse_sqlite_spec("sqlite:/tmp/x.db?retention_days=7&wal_max_mb=64");
  ASSERT_TRUE(good) << good.error().message;
  EXPECT_EQ(good->path, "/tmp/x.db");
  EXPECT_EQ(good->retention_days, 7u);
  EXPECT_EQ(good->wal_max_mb, 64u);
  for (const char* bad : {"0", "abc", "", "1.5", "-3", "99999999"}) {
    auto s = server::parse_sqlite_spec(std::string("sqlite:x.db?wal_max_mb=") + bad);
    ASSERT_FALSE(s) << bad;
    EXPECT_EQ(s.error().exit_code, 2);
    EXPECT_NE(s.error().message.find("wal_max_mb"), std::string::npos) << s.error().message;
  }
}

}  // namespace
}  // namespace strata
