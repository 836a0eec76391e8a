// The collector's diagnosis (DESIGN §6: every window): a background thread diagnoses each job that
// got new data since its last round and keeps the result in the store (the latest report per job,
// every round's findings), so the API and `strata diagnose --server` read kept findings and their
// history: when a finding first appeared, whether it is still there.
//
// A round's cost follows the job's size and the analysis span, not its age (issue 16): per job the
// diagnoser keeps a state between rounds (the job's healthy past per rank and layer, where the last
// round ended, and the rows of its analysis span read so far), each round reads from the store only
// the rows written since the last one (note() keeps the earliest end of what batches brought, so a
// late batch is re-read, not lost), bounded by time in the store query, and jobs are diagnosed in
// parallel, each reading through a store connection of its own. The engine still sees the whole
// analysis span; only the reads follow the new data.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"
#include "ingest.pb.h"
#include "server/job_sharing.h"
#include "server/prometheus.h"
#include "store/store.h"

namespace strata::server {

// Rows the rounds hold between them for every job together (each job's analysis span: issue 16
// asks that every cache keyed by agent data be bounded). A held row takes ~100-200 bytes (device
// activity names, metric labels); the span of a 1,000 x 8 job is ~3.3M rows (measured), ~0.3-0.5 GB
// more RSS at that scale (728 -> 1,090 MB). Past this bound the other jobs' rows go, the least
// recently active first, and their next rounds read their whole spans, as rounds did before they
// held rows: slower, never unbounded. A round's own job keeps its rows: its next round needs them all,
// and a whole read would hold as many (so one job's span is bounded by Diagnoser::kMaxRoundSpanNs).
inline constexpr size_t kMaxHeldRows = 4'000'000;

// A job that sent nothing for this long lets its held rows go (its healthy past stays). Rows are
// held only to spare the job's next round a read of its whole span; a job quiet for two analysis
// spans (Diagnoser::kAnalysisSpanNs) has ended or lost its agents, and if it comes back its first
// round reads one span, as after a restart. Held on, an ended job's rows were most of a collector's
// RSS when jobs followed one another (3.1 GB after five 1,000 x 8 jobs), and they counted against
// max_held_rows: the next job's rounds let their own rows go and re-read their whole span each time.
inline constexpr uint64_t kRowsIdleNs = 120ull * 1'000'000'000ull;

// ... or sooner, when its agents' windows say it has stopped: quiet for this many of its windows
// (the longest metric window among its latest rows held). An agent ships a window when it closes:
// a job that runs sends rows every window, from each node at its own phase. Quiet for one window
// is a node's phase, for two a slow send; three is what kJoinGraceNs waits for a rank to be known.
// Held two minutes, an ended job's span sat beside the next job's whenever jobs follow one another
// (five 1,000 x 8 jobs of ~90 s in turn: the collector's peak RSS 2,191 MB before, 2,106 MB with
// this alone; the rest of that peak was a new job's first round, Diagnoser::diagnose_job).
inline constexpr uint64_t kQuietWindows = 3;
// ... but never sooner than this: an agent whose sends failed waits up to 30 s before it tries
// again (the shipper's longest pause, agent/shipper/batching_writer.cpp kRetryMaxS), and agents
// with 1 s windows would make a job quiet after 3 s of a slow collector.
inline constexpr uint64_t kRowsQuietMinNs = 30ull * 1'000'000'000ull;

// A job fewer of whose ranks have sent their process than its world size says is still joining:
// its background rounds wait until every rank has, or this long after the first round that
// found it joining. An agent ships a window's rows when the window closes (10 s by default, its
// phase anywhere in it), so a rank that started is known within a window and a retry; three
// windows. A round of a job half joined is of little use (most of its ranks are missing), and
// each one that finds more ranks than the last reads the job's span whole again (their rows
// were not held): measured at 1,000 x 8, the second round of a new job cost 16 s of CPU, three
// times a round that reads only what is new. A rank that never joins holds nothing back for
// longer than this.
inline constexpr uint64_t kJoinGraceNs = 30ull * 1'000'000'000ull;

struct DiagnoserOptions {
  double every_s = 2;  // 0: no background rounds (a job is still diagnosed when first asked for)
  // Past this bound for every job together, the least recently active jobs' rows go first; the job
  // of the round keeps its own (kMaxHeldRows says why).
  size_t max_held_rows = kMaxHeldRows;
  // This collector's name among those that share the store (server/job_sharing.h).
  std::string collector_id = "collector";
  uint64_t rows_idle_ns = kRowsIdleNs;      // quiet this long: its rows go, whatever its windows
  uint64_t rows_quiet_min_ns = kRowsQuietMinNs;  // ... and after kQuietWindows windows, not sooner than this
  // False: a job's rows go after each of its rounds, and every round reads its whole span, as rounds
  // did before they held rows (the reference the tests compare held rounds with).
  bool hold_rows = true;
  uint64_t join_grace_ns = kJoinGraceNs;
  // The wall clock (unix ns) that says how long a job was quiet; unset: the real one. Tests set it.
  std::function<uint64_t()> clock;
};

struct DiagnoserCounters {
  uint64_t rounds = 0;          // rounds that found something new to look at
  uint64_t diagnosed = 0;       // job diagnoses made and kept
  uint64_t skipped = 0;         // jobs left alone: no new data since their last round
  uint64_t waiting = 0;         // jobs whose round waited: ranks still joining (kJoinGraceNs)
  uint64_t failed = 0;          // loads or writes that failed (no steps yet, store error)
  uint64_t handed_over = 0;     // jobs with new data here that another collector of the store diagnoses
  double seconds = 0;           // spent diagnosing, loads and writes included
  double cpu_seconds = 0;       // CPU the background rounds used, over their threads (their pauses follow it)
  uint64_t rows_read = 0;       // rows the rounds' loads read (steps, collectives, device, metrics, samples)
  uint64_t rows_passed_over = 0;  // rows of other jobs' processes the rounds read and threw away
  uint64_t states_dropped = 0;  // per-job states dropped: the job went quiet, or too many jobs
  uint64_t rows_released = 0;   // times a job's held rows were let go (over max_held_rows, or the job went quiet)
  uint64_t held_rows = 0;       // rows held for every job now
  prom::Histogram job_seconds{prom::diagnosis_buckets()};    // each job's diagnosis, for /metrics
  prom::Histogram round_seconds{prom::diagnosis_buckets()};  // each background round (wall), for /metrics
};

class Diagnoser {
 public:
  Diagnoser(store::Store& store, std::mutex& store_mu, DiagnoserOptions opts, std::ostream& log);
  ~Diagnoser();
  Diagnoser(const Diagnoser&) = delete;
  Diagnoser& operator=(const Diagnoser&) = delete;

  void start();
  // Cancels the loads in progress (the round's, and a request's diagnosis) at their next read, so
  // that stopping the server does not wait minutes for a job of thousands of ranks; stop() does it
  // too, and then waits for the round thread.
  void cancel();
  void stop();

  // A store connection of the rounds' own for their reads (SQLite in WAL mode lets it read beside
  // the writer; ClickHouse is another HTTP client): a round then reads without the store mutex, and
  // ingest never waits for it. Without one, rounds read the shared store under the mutex. Each call
  // adds one to a pool: jobs diagnosed at once read through one each (kRoundThreads is enough).
  void set_reader(std::unique_ptr<store::Store> reader);

  // Runs `f` at a moment when no round reads through its own connections: reads that began finish
  // first, reads that would begin wait until `f` returns. SQLite can truncate its write-ahead log
  // only then (Store::truncate_log): rounds that overlap without a gap keep it growing.
  void reader_gap(const std::function<void()>& f);
  // Whether a reader_gap waits for reads to finish (new reads wait behind it).
  bool gap_pending();
  // One read through the rounds' connections (the shared store under the mutex without them), as a
  // round makes it; it waits behind a pending gap.
  void with_reader(const std::function<void(store::Store&)>& f);

  // Jobs diagnosed at once within a round. Each reads (SQLite readers run side by side under WAL)
  // and computes on its own; four keep a round of many jobs short while leaving most of a small
  // collector's cores to ingest.
  static constexpr size_t kRoundThreads = 4;
  // One analysis span: each round reads the job's data from this long before the last round's end
  // on (the first round: this long before the latest step). Six of the agents' default 10 s
  // windows: enough steps on both sides of a change that began since the last round for the
  // change-point finder (3 + 3 at up to 8 s a step), and the stacks of the new windows alone.
  static constexpr uint64_t kAnalysisSpanNs = 60ull * 1'000'000'000ull;
  // A round that fell this far behind the latest data (the collector was busy) reads the latest
  // span only: its cost stays bounded, at the price of the windows it skipped.
  static constexpr uint64_t kMaxRoundSpanNs = 10 * kAnalysisSpanNs;
  // Per-job states kept at most, and how long a job may send nothing before its state is dropped.
  // A collector serves one cluster's jobs (tens at a time); a state is the job's healthy past per
  // rank (a few KB a rank) and its analysis span's rows (steps, collectives, device activity and
  // metrics: ~400 rows a rank a minute in the simulated job, tens of KB a rank). A job quiet for an hour has ended (a hang is found within minutes); if
  // it comes back, its first round rebuilds the state from its latest span.
  static constexpr size_t kMaxJobStates = 256;
  static constexpr uint64_t kStateIdleNs = 3600ull * 1'000'000'000ull;
  // How much CPU the rounds may take on average, in cores, when they read through connections of
  // their own (they then hold nothing ingest waits for: what they take from it is CPU). After a
  // round the thread pauses until the round and its pause together used at most this: a pause of
  // cpu / kRoundCores - wall. Half a core: at 8,000 ranks a round costs 4-5 s of CPU on this
  // project's 2-core machine (bench/cluster_scale.sh), and the fifth of a core allowed before put
  // 20 s and more between rounds, twice the 10 s windows they follow, so a fault waited longer for
  // a round than for its data (and a round of 17 s of CPU, a new job's first, held the next one
  // back 67 s). Ingest of the same 8,000 ranks took about half a core there: the collector stays
  // near one core in all. Where rounds read under the store mutex (no connections of their own),
  // the thread pauses kBusyFactor times the round's wall time: ingest waited all of it.
  static constexpr double kRoundCores = 0.5;
  static constexpr double kBusyFactor = 4;
  static double pause_after_s(double wall_s, double cpu_s, bool own_readers);

  // After a batch is applied: the processes it brought data for, and the jobs it named.
  void note(const ingest::Batch& batch);

  // Diagnoses one job now (empty: the one with the most ranks) and keeps the result; returns the
  // job's name. Takes the store mutex itself.
  Result<std::string> diagnose_job(const std::string& job);

  // The kept findings of a job, as the API answers them: the latest report (DESIGN §8 JSON, or
  // text) with the findings' history. An empty job with job_given false picks the job with the
  // most ranks. A job nothing was kept for yet is diagnosed first.
  struct Reply {
    int status = 200;
    std::string body;
    std::string content_type;
  };
  Reply findings(const std::string& job, bool job_given, bool text);

  DiagnoserCounters counters();

 private:
  void loop();
  // Returns the CPU it used (s). `background`: the thread's round, which lets a job whose ranks are
  // still joining wait (DiagnoserOptions::join_grace_ns); a request's round diagnoses what is there.
  double round(bool background);
  struct JobState;  // diagnoser.cpp: the job's baseline, where its last round ended
  std::shared_ptr<JobState> state_of(const std::string& job);
  void drop_idle_states();
  // Held rows let go: of jobs quiet for quiet_after_ns (not `current`), then, after a job's round
  // (`current` set), while the rows held are over max_held_rows, of the other jobs, the least
  // recently active first. `current` keeps its own (kMaxHeldRows says why), and so does a job whose
  // round runs now (its lock is taken with try_lock: never a wait). Returns the count of jobs that
  // let their rows go.
  uint64_t release_rows(JobState* current);
  // How long `st`'s job must send nothing before its rows go (kQuietWindows, kRowsQuietMinNs).
  uint64_t quiet_after_ns(const JobState& st) const;
  uint64_t now_ns() const;
  // A state's held rows go and leave held_rows_; the caller holds st.mu. Whether it held any.
  bool let_rows_go(JobState& st);
  void fold_noted();  // noted_from_ns_ into every job's state

  store::Store& store_;
  std::mutex& store_mu_;
  DiagnoserOptions opts_;
  std::ostream& log_;

  std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  bool stopping_ = false;
  std::atomic<bool> cancel_{false};  // LoadOptions::cancel of every load
  std::set<std::pair<std::string, uint32_t>> dirty_procs_;  // (node, pid): pids repeat across nodes
  std::set<std::pair<std::string, uint32_t>> dirty_trainers_;  // ... of them, those that sent steps or collectives
  std::set<std::string> dirty_jobs_;
  // The earliest end of a row written since the last fold_noted (UINT64_MAX: none), as the stores'
  // span queries test a row's end (diagnose::row_end).
  uint64_t noted_from_ns_ = UINT64_MAX;
  DiagnoserCounters counters_;
  JobSharing sharing_;  // used by the round thread only

  // Where rounds read: a free reader of the pool when there are readers (waiting for one), else
  // store_ under store_mu_.
  std::vector<std::unique_ptr<store::Store>> free_readers_;
  size_t readers_ = 0;
  size_t reading_ = 0;       // readers in use
  bool gap_wanted_ = false;  // reader_gap waits for reading_ == 0; new reads wait for it
  std::mutex reader_mu_;
  std::condition_variable reader_cv_;
  template <typename F>
  auto read(F f);

  std::atomic<int64_t> held_rows_{0};  // every state's JobState::counted_rows
  std::mutex states_mu_;  // guards states_ (each state has its own lock: one round of a job at a time)
  std::map<std::string, std::shared_ptr<JobState>> states_;
  std::mutex first_mu_;  // a request's diagnosis of "the job with the most ranks" (no state)
  std::thread thread_;
};

}  // namespace strata::server
