// Fills a JobWindow from a store: the step timeline splits into the job's baseline and the window
// being diagnosed (where the job's step time changed), and every layer's data is summarized per rank
// and per step.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "diagnose/model.h"
#include "store/store.h"

namespace strata::diagnose {

struct Stats;
struct SpanRows;

struct LoadOptions {
  std::string job;        // empty: the job with the most ranks in the latest recording
  int warmup_steps = 2;   // first steps of each rank are start-up, never a baseline
  // Every recording, not only the latest: a collector holds one per agent (node) and agent start,
  // and a job's ranks span them.
  bool all_recordings = false;
  // Only what overlaps [from_ns, to_ns) (unix ns; either end open) is read: steps, collectives,
  // device activity, metrics and the store windows of stacks. The cost is then bounded by the span,
  // not by what the store holds.
  std::optional<uint64_t> from_ns, to_ns;
  // The latest stretch of this length (ns): from the latest step the store holds (of the recording
  // read) back; with from_ns given, from_ns wins.
  std::optional<uint64_t> last_ns;
  // When set, what the load read is counted here (the rows each bounded read returned).
  struct Stats* stats = nullptr;
  // When the job made no progress for this long before the latest data, the ranks' stacks since
  // its last progress are read too (RankWindow::stall_oncpu/stall_offcpu): the evidence of a hang.
  // As the engine's Options::hang_s, so that only a job that may be hung pays for the extra reads.
  double stall_stacks_s = 10;
  // When set and true, the load stops at its next read and returns an error: a collector shutting
  // down does not wait for a round (or a request's diagnosis) of thousands of ranks to finish.
  const std::atomic<bool>* cancel = nullptr;
  // When set and it holds the rows of the span asked for (SpanRows::covers), the steps,
  // collectives, device activity and metrics come from it instead of the store: a collector's
  // round brought it up to date with the rows that are new since its last round
  // (refresh_span_rows). Stacks, launch samples and processes are still read from the store.
  const SpanRows* rows = nullptr;
};

// Rows a load read, per kind: a round's cost, which must follow the span, not the store's age.
struct Stats {
  uint64_t steps = 0, collectives = 0, device = 0, metrics = 0, samples = 0, profiles = 0;
  // Rows of other processes a refresh read and threw away (refresh_span_rows with members): in rows().
  uint64_t passed_over = 0;
  uint64_t rows() const { return steps + collectives + device + metrics + samples; }
  void add(const Stats& o) {
    steps += o.steps, collectives += o.collectives, device += o.device, metrics += o.metrics, samples += o.samples;
    profiles += o.profiles, passed_over += o.passed_over;
  }
};

template <typename Row>
class HeldRows;
namespace detail {
// What refresh_span_rows does to each kind (instantiated for the four in loader.cpp): keeps the
// held rows that end in (from_ns, cut_ns], then adds `fresh` (all ending after cut_ns; in the span
// query's order where the kind has one) as one read of the span would have them. `fresh` is left
// empty with its memory kept, for the next read.
template <typename Row>
void merge_rows(HeldRows<Row>& held, std::vector<Row>& fresh, uint64_t from_ns, uint64_t cut_ns);
}  // namespace detail

// One kind of held rows (SpanRows), in the order the store's span query returns them. A round
// drops the rows the span moved past and adds the new ones; neither may cost what the rows held
// cost: at 8,000 ranks a span holds millions of rows, and moving each of them once per round (an
// erase from the front, a merge into a new vector) was most of a round's CPU, the new vector's
// page faults included (measured: refresh_span_rows 68% of a round, mostly memmove and page
// faults, the store's reads a fifth of it). So the rows dropped are a dead prefix that a later
// compaction reclaims, and new rows are merged in from where they begin.
template <typename Row>
class HeldRows {
 public:
  size_t size() const { return rows_.size() - first_; }
  bool empty() const { return size() == 0; }
  const Row& operator[](size_t i) const { return rows_[first_ + i]; }
  const Row* begin() const { return rows_.data() + first_; }
  const Row* end() const { return rows_.data() + rows_.size(); }
  std::span<const Row> view() const { return {begin(), end()}; }

 private:
  friend void detail::merge_rows<Row>(HeldRows<Row>&, std::vector<Row>&, uint64_t, uint64_t);
  std::vector<Row> rows_;  // [0, first_) are dropped rows, emptied
  size_t first_ = 0;
  // The longest row held (its end minus its start): a row that ends after a time starts at most
  // this long before it. Only grows (until the rows are read whole again).
  uint64_t longest_ns_ = 0;
  // Whether a row that ends before it starts was ever held (a clock step between two reads):
  // then no row's start bounds where one that ends by a time can be, and drops look at every row.
  bool ends_before_start_ = false;
};

// The processes whose rows a job's held span keeps, by node: the job's processes (node, pid), and
// the node-wide rows (pid 0: the GPUs' series) of the nodes they run on. Rows of other jobs are
// of no use to the job's loads: held for every job, each job's span held every job's rows, and a
// collector's held rows grew with the square of its jobs.
// (Looked up by a view of the node's name: a read's filter asks for each row it reads.)
struct NodeNameHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using JobMembers = std::unordered_map<std::string, std::unordered_set<uint32_t>, NodeNameHash, std::equal_to<>>;

// The rows of one job's analysis span that a collector keeps between rounds (issue 16: each round
// reads only what is new since the last one, never the whole span again): every row of the four
// kinds the loader reads by time (steps, collectives, device activity, metrics) that ends after
// from_ns, in the order the store's span queries return them.
struct SpanRows {
  bool valid = false;                 // false: nothing held yet (the next refresh reads the span)
  // Whose rows are held (unset: every process's). A refresh that asks for a process not among them
  // reads the span whole: its rows from before were not kept.
  std::optional<JobMembers> members;
  std::optional<int64_t> recording;   // of the reads (unset: every recording)
  uint64_t from_ns = 0;               // rows that end after this are held
  // How far the store was written when they were read (a store with write sequences: SQLite); the
  // next refresh reads what was written after.
  std::optional<store::WriteSeqs> seqs;
  HeldRows<store::Store::MetricRow> metrics;
  HeldRows<store::StepRecord> steps;
  HeldRows<store::CollectiveRecord> collectives;
  HeldRows<store::DeviceActivity> device;  // in no particular order (the loader sums them)
  // What a refresh read, before it is merged in: empty between refreshes, its memory kept for the
  // next one (store::Reader::append_steps says why).
  struct Read {
    std::vector<store::Store::MetricRow> metrics;
    std::vector<store::StepRecord> steps;
    std::vector<store::CollectiveRecord> collectives;
    std::vector<store::DeviceActivity> device;
    void clear() { metrics.clear(), steps.clear(), collectives.clear(), device.clear(); }
  } read;
  bool covers(std::optional<int64_t> rec, uint64_t from) const { return valid && recording == rec && from_ns == from; }
  size_t size() const { return metrics.size() + steps.size() + collectives.size() + device.size(); }
};

// Where a row of each kind ends, as the stores' span queries test it (RowQuery::from_ns: "rows
// whose time span ends after from_ns"). A collective without an exit ends just after its entry.
uint64_t row_end(const store::Store::MetricRow& r);
uint64_t row_end(const store::StepRecord& r);
uint64_t row_end(const store::CollectiveRecord& r);
uint64_t row_end(const store::DeviceActivity& r);

// Brings `rows` to the store's rows that end after `from_ns`, reading as little as it can:
//   - rows held that end at or before from_ns are dropped (the span moved on);
//   - a store with write sequences (Reader::write_seqs: SQLite) is read for the rows written since
//     the last refresh, whatever their time (a batch comes up to a window after its rows' time;
//     a late one, minutes after): exactly the new rows, none twice, none missed;
//   - a store without them (ClickHouse) is read for the rows that end at or after
//     `changed_from_ns`, the earliest end of any row written since the last refresh began (the
//     collector notes it from the batches it applies), and those replace the held ones;
//   - otherwise (nothing held, another recording, a span that starts earlier than what is held, no
//     changed_from_ns without write sequences: the caller does not know what was written since)
//     the whole span is read.
// What it read is counted in `stats`. Reads metrics first, as load_job_window does (its comment:
// newer rows can only add progress). `use_write_seqs` false: by time even where the store has
// write sequences (tests of the ClickHouse path on SQLite).
// `members`: only these processes' rows are held (SpanRows::members; null: every process's).
Status refresh_span_rows(store::Reader& s, SpanRows& rows, std::optional<int64_t> recording, uint64_t from_ns,
                         std::optional<uint64_t> changed_from_ns, Stats* stats = nullptr,
                         const std::atomic<bool>* cancel = nullptr, bool use_write_seqs = true,
                         const JobMembers* members = nullptr);

// `strata diagnose FILE.db` without a span: the latest stretch of `latest_ns`, against the
// `baseline_ns` before it as the job's healthy past (JobBaseline) when that stretch diagnoses
// healthy. Reads those two stretches, whatever else the store holds.
Result<JobWindow> load_latest_with_baseline(store::Reader& store, LoadOptions options, uint64_t latest_ns,
                                            uint64_t baseline_ns);

Result<JobWindow> load_job_window(store::Reader& store, const LoadOptions& options = {});

// The name of a job whose ranks have no RANK and no job name in their environment (a job started
// with torch.multiprocessing.spawn): the loader takes the processes that train under one parent as
// its ranks and names the job after that parent, "COMM-PID" ("job-PID" when the parent was not
// recorded). The collector names the jobs it diagnoses the same way.
std::string job_of_ranks_without_rank(const std::string& parent_comm, uint32_t parent);

// How far back from the store's newest step processes_with_ranks looks for the processes that
// train: a rank steps far more often than once a minute (a step of a minute or more is rare even
// for the largest models), and the read stays bounded by ranks x a minute, not by the job's age.
inline constexpr uint64_t kTrainerLookbackNs = 60'000'000'000ull;

// The store's processes, with the ranks (and job) of jobs whose ranks have no RANK in their
// environment filled in as the loader infers them (processes that stepped in the last
// kTrainerLookbackNs of the store's steps, numbered per parent): the collector's job list, heatmap
// and profiles show such a job as the diagnosis names it.
Result<std::vector<store::ProcessInfo>> processes_with_ranks(store::Reader& store);

// Where the job's step time series (one value per step) rose: the index of the first slow step,
// or 0 when no rise stands out from the noise before it. Exposed for tests.
size_t find_change_point(const std::vector<double>& step_ms, double min_rise = 0.05);

// Where steps that became so long that fewer than three fill a window began: the last one or two
// completed steps and the step in flight (`in_flight_ms` so far) each far above the steps before,
// lasting a window (`window_ms`) together; 0 when they do not. Exposed for tests.
size_t find_long_step_change(const std::vector<double>& step_ms, double in_flight_ms, double window_ms);

// The ranks of a synchronous job complete the same iterations in the same time; a rank whose steps
// (per rank, in order, after warm-up) number clearly more than the others' over the time they all
// cover was cut at a fraction of the iteration by the agent's step detector, and is re-cut at the
// boundaries of the rank with the fewest steps (its collective and device time shared out by
// overlap). Returns the indices of the ranks re-cut. Exposed for tests.
std::vector<size_t> align_step_cuts(std::vector<std::vector<store::StepRecord>>& steps);

}  // namespace strata::diagnose
