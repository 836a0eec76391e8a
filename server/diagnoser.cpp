#include "server/diagnoser.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <sstream>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "common/clock.h"
#include "server/json.h"

#ifdef STRATA_HAVE_DIAGNOSE
#include "diagnose/baseline.h"
#include "diagnose/engine.h"
#include "diagnose/loader.h"
#include "diagnose/render.h"
#endif

namespace strata::server {
namespace {

// "2026-11-29 22:31:07 UTC": when a finding appeared, for people.
std::string utc(uint64_t ns) {
  time_t t = static_cast<time_t>(ns / 1000000000ull);
  tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// The CPU time the calling thread has used, in seconds.
double thread_cpu_s() {
  timespec ts{};
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

#ifdef STRATA_HAVE_DIAGNOSE
using ProcsByPid = std::map<std::pair<std::string, uint32_t>, const store::ProcessInfo*>;

ProcsByPid by_pid_of(const std::vector<store::ProcessInfo>& procs) {
  ProcsByPid by_pid;
  for (const auto& p : procs) by_pid[{p.node, p.pid}] = &p;
  return by_pid;
}

// The job of a process that trains without a RANK (torch.multiprocessing.spawn's ranks): named
// after its parent, as the loader names it (diagnose::job_of_ranks_without_rank).
std::string job_without_rank(const ProcsByPid& by_pid, const store::ProcessInfo& p) {
  auto parent = by_pid.find({p.node, p.ppid});
  return diagnose::job_of_ranks_without_rank(parent != by_pid.end() ? parent->second->comm : "", p.ppid);
}

// Whether `job` is such a name: of a process without a job name or a rank.
bool inferred_job(const std::vector<store::ProcessInfo>& procs, const std::string& job) {
  const ProcsByPid by_pid = by_pid_of(procs);
  for (const auto& p : procs) {
    if (p.rank < 0 && p.job.empty() && job_without_rank(by_pid, p) == job) return true;
  }
  return false;
}
#endif

// The latest metric rows a job's window length is read from (quiet_after_ns): enough that one odd
// row (a window cut short when an agent stopped) does not decide it.
constexpr size_t kWindowRowsLooked = 64;

}  // namespace

double Diagnoser::pause_after_s(double wall_s, double cpu_s, bool own_readers) {
  // Through connections of their own, rounds take CPU only: the pause makes the round and itself
  // average kRoundCores at most. A round's wall time on a busy machine is mostly waiting for a
  // core (measured at 1,000 x 8 on 2 shared cores: 7.4 s of CPU in 17 s); that waiting counts as
  // time the round already spent, never as cost to pause for (pausing for it put 30 s and more
  // between rounds: a fault that began in the pause was found that much later). Without readers,
  // rounds read under the store mutex, and the wall time is how long ingest waited.
  if (!own_readers) return kBusyFactor * std::max(0.0, wall_s);
  return std::max(0.0, std::max(0.0, cpu_s) / kRoundCores - std::max(0.0, wall_s));
}

struct Diagnoser::JobState {
  std::mutex mu;  // one round of the job at a time
#ifdef STRATA_HAVE_DIAGNOSE
  diagnose::JobBaseline baseline;  // the job's recent healthy windows, per rank and layer
  // The rows of the analysis span read so far (issue 16): each round reads only the rows written
  // since (by write sequence on SQLite; on a store without one, those that end at or after
  // changed_from_ns), and merges them in.
  diagnose::SpanRows rows;
#endif
  size_t counted_rows = 0;   // rows.size() as counted in held_rows_
  uint64_t last_end_ns = 0;  // data time: where the last round's window ended
  // The earliest end of a row written since the job's last refresh of `rows` began (UINT64_MAX:
  // none). A late batch (an agent that retried for a minute) lowers it, and the next round reads
  // again from there: no overlap to guess, nothing missed.
  std::mutex changed_mu;  // guards changed_from_ns (a fold runs while the job's round does)
  uint64_t changed_from_ns = UINT64_MAX;
  uint64_t touched_ns = 0;     // wall clock: the last round with new data
  // The job's agents' window (the longest of its latest metric windows held; 0: none seen), read
  // by release_rows without the job's lock.
  std::atomic<uint64_t> window_ns{0};
  uint64_t joining_since_ns = 0;  // wall clock: the first round that found its ranks joining (0: none)
  uint32_t last_findings = 0;  // the last report's (the report itself is kept in the store)
};

std::shared_ptr<Diagnoser::JobState> Diagnoser::state_of(const std::string& job) {
  std::lock_guard lock(states_mu_);
  auto& st = states_[job];
  if (!st) st = std::make_shared<JobState>();
  st->touched_ns = now_ns();
  return st;
}

void Diagnoser::fold_noted() {
  uint64_t noted_from;
  {
    std::lock_guard lock(mu_);
    noted_from = std::exchange(noted_from_ns_, UINT64_MAX);
  }
  if (noted_from == UINT64_MAX) return;
  // Every job's held rows are re-read from there: a job diagnosed later, or in another round,
  // still has it.
  std::lock_guard lock(states_mu_);
  for (auto& [job, st] : states_) {
    std::lock_guard changed(st->changed_mu);
    st->changed_from_ns = std::min(st->changed_from_ns, noted_from);
  }
}

bool Diagnoser::let_rows_go(JobState& st) {
  if (st.counted_rows == 0) return false;
  held_rows_ -= static_cast<int64_t>(st.counted_rows);
#ifdef STRATA_HAVE_DIAGNOSE
  st.rows = diagnose::SpanRows{};
#endif
  st.counted_rows = 0;
  return true;
}

uint64_t Diagnoser::now_ns() const { return opts_.clock ? opts_.clock() : wall_clock_ns(); }

uint64_t Diagnoser::quiet_after_ns(const JobState& st) const {
  const uint64_t window = st.window_ns.load();
  if (window == 0) return opts_.rows_idle_ns;  // its windows unknown: the longest wait
  return std::min(opts_.rows_idle_ns, std::max(opts_.rows_quiet_min_ns, kQuietWindows * window));
}

uint64_t Diagnoser::release_rows(JobState* current) {
  const uint64_t now = now_ns();
  const auto over = [&] { return held_rows_.load() > static_cast<int64_t>(opts_.max_held_rows); };
  std::vector<std::pair<uint64_t, std::shared_ptr<JobState>>> others;  // (touched_ns, state)
  {
    std::lock_guard lock(states_mu_);
    for (const auto& [job, st] : states_) {
      if (st.get() != current) others.emplace_back(st->touched_ns, st);
    }
  }
  std::sort(others.begin(), others.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  uint64_t released = 0;
  for (const auto& [touched, st] : others) {
    // Each job its own wait (its windows'): a job active more recently may have been quiet longer
    // than its windows allow.
    const bool quiet = now > touched + quiet_after_ns(*st);
    if (!quiet && (!current || !over())) continue;
    std::unique_lock lock(st->mu, std::try_to_lock);
    if (lock.owns_lock()) released += let_rows_go(*st);  // else its round runs now: not quiet
  }
  // The job of the round keeps its own rows, over the bound or not: its next round needs every one
  // of them, and a whole read of its span holds as many at once (the read is swapped in). Let go,
  // a job whose span alone was near the bound (an 8,000-rank job, ~4M rows) re-read its whole span
  // each round, its rounds took 4x as long and came further apart, its span grew past the bound
  // again: 6-9 rounds in a 3-minute job instead of 22 (bench/README.md, session 23).
#ifdef __GLIBC__
  // The rows were millions of small allocations: without a trim the heap keeps their pages, and
  // the collector's RSS stays where the largest job took it.
  if (released) malloc_trim(0);
#endif
  return released;
}

void Diagnoser::drop_idle_states() {
  uint64_t dropped = 0;
  {
    std::lock_guard lock(states_mu_);
    const uint64_t now = now_ns();
    // A state goes with its rows uncounted, under its own lock (release_rows may hold it from a
    // request's diagnosis); one whose round runs now is not idle.
    auto drop = [&](JobState& st) {
      std::unique_lock one(st.mu, std::try_to_lock);
      if (!one.owns_lock()) return false;
      let_rows_go(st);
      ++dropped;
      return true;
    };
    std::erase_if(states_, [&](const auto& kv) { return now > kv.second->touched_ns + kStateIdleNs && drop(*kv.second); });
    // Over the cap: the least recently diagnosed go.
    while (states_.size() > kMaxJobStates) {
      auto oldest = std::min_element(states_.begin(), states_.end(), [](const auto& a, const auto& b) {
        return a.second->touched_ns < b.second->touched_ns;
      });
      if (!drop(*oldest->second)) break;  // the next round tries again
      states_.erase(oldest);
    }
  }
  std::lock_guard lock(mu_);
  counters_.states_dropped += dropped;
}

Diagnoser::Diagnoser(store::Store& store, std::mutex& store_mu, DiagnoserOptions opts, std::ostream& log)
    : store_(store), store_mu_(store_mu), opts_(opts), log_(log), sharing_(store, store_mu, opts_.collector_id, log) {}

Diagnoser::~Diagnoser() { stop(); }

void Diagnoser::set_reader(std::unique_ptr<store::Store> reader) {
  if (!reader) return;
  {
    std::lock_guard lock(reader_mu_);
    free_readers_.push_back(std::move(reader));
    ++readers_;
  }
  reader_cv_.notify_one();
}

void Diagnoser::reader_gap(const std::function<void()>& f) {
  {
    std::unique_lock lock(reader_mu_);
    reader_cv_.wait(lock, [this] { return !gap_wanted_; });  // one gap at a time
    gap_wanted_ = true;
    reader_cv_.wait(lock, [this] { return reading_ == 0; });
  }
  f();
  {
    std::lock_guard lock(reader_mu_);
    gap_wanted_ = false;
  }
  reader_cv_.notify_all();
}

bool Diagnoser::gap_pending() {
  std::lock_guard lock(reader_mu_);
  return gap_wanted_;
}

template <typename F>
auto Diagnoser::read(F f) {
  std::unique_ptr<store::Store> reader;
  {
    std::unique_lock lock(reader_mu_);
    if (readers_ > 0) {
      reader_cv_.wait(lock, [this] { return !free_readers_.empty() && !gap_wanted_; });
      reader = std::move(free_readers_.back());
      free_readers_.pop_back();
      ++reading_;
    }
  }
  if (reader) {
    auto out = f(*reader);
    {
      std::lock_guard lock(reader_mu_);
      free_readers_.push_back(std::move(reader));
      --reading_;
    }
    reader_cv_.notify_all();  // a waiting read, or a gap waiting for the last one
    return out;
  }
  std::lock_guard lock(store_mu_);
  return f(store_);
}

void Diagnoser::with_reader(const std::function<void(store::Store&)>& f) {
  read([&](store::Store& s) {
    f(s);
    return 0;
  });
}

void Diagnoser::start() {
  if (opts_.every_s <= 0 || thread_.joinable()) return;
  {
    // What the store holds but no round has looked at (a restart, a recorded file being served):
    // every job with ranks gets a first round.
    std::lock_guard lock(store_mu_);
    if (auto procs = store_.processes()) {
      auto kept = store_.latest_diagnoses();
      std::set<std::string> have;
      if (kept) {
        for (const auto& d : *kept) have.insert(d.job);
      }
      std::lock_guard l2(mu_);
      for (const auto& p : *procs) {
        if (p.rank >= 0 && !have.count(p.job)) dirty_jobs_.insert(p.job);
      }
    }
  }
  thread_ = std::thread([this] { loop(); });
}

void Diagnoser::cancel() { cancel_.store(true, std::memory_order_relaxed); }

void Diagnoser::stop() {
  cancel();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Diagnoser::note(const ingest::Batch& b) {
  std::lock_guard lock(mu_);
  // The earliest end of the new rows, as the stores' span queries test it (diagnose::row_end):
  // the next round re-reads from there. Of every process, not only ranks': a load's figures also
  // look at rows of other processes (how far any agent's windows reach).
  auto wrote = [&](uint64_t end_ns) { noted_from_ns_ = std::min(noted_from_ns_, end_ns); };
  for (const auto& r : b.records()) {
    switch (r.kind_case()) {
      case ingest::Record::kProcess:
        if (r.process().rank() >= 0) dirty_jobs_.insert(r.process().job());
        break;
      case ingest::Record::kSteps:
        for (const auto& s : r.steps().rows()) {
          dirty_procs_.insert({b.node(), s.pid()});
          dirty_trainers_.insert({b.node(), s.pid()});
          wrote(s.end_ns());
        }
        break;
      case ingest::Record::kMetrics:
        // A rank that stopped stepping still sends its OS metrics: the round that finds it hung.
        for (const auto& m : r.metrics().metrics()) {
          if (m.pid() != 0) dirty_procs_.insert({b.node(), m.pid()});
          wrote(r.metrics().end_ns());  // pid 0 too: the node's own series (its GPUs)
        }
        break;
      case ingest::Record::kCollectives:
        for (const auto& c : r.collectives().rows()) {
          dirty_procs_.insert({b.node(), c.pid()});
          dirty_trainers_.insert({b.node(), c.pid()});
          wrote(std::max(c.exit_ns(), c.enter_ns() + 1));
        }
        break;
      case ingest::Record::kDeviceActivity:
        for (const auto& d : r.device_activity().rows()) wrote(d.end_ns());
        break;
      default:
        break;
    }
  }
}

DiagnoserCounters Diagnoser::counters() {
  std::lock_guard lock(mu_);
  DiagnoserCounters c = counters_;
  c.held_rows = static_cast<uint64_t>(std::max<int64_t>(0, held_rows_.load()));
  return c;
}

void Diagnoser::loop() {
  // A round runs every_s after the last one ended, or when its pause (pause_after_s) is over if that
  // is later: the thread wakes then, not at the next every_s tick (a pause of 7.7 s waited until
  // 8 s, one of 8.1 s until 10). Between rounds it wakes at least every every_s: on a store shared
  // with other collectors those wakes are heartbeats, so a collector whose rounds are paused is not
  // taken for gone and its jobs do not move.
  using Clock = std::chrono::steady_clock;
  const auto every = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts_.every_s));
  auto next_round = Clock::now() + every;
  while (true) {
    {
      std::unique_lock lock(mu_);
      cv_.wait_until(lock, std::min(Clock::now() + every, next_round), [this] { return stopping_; });
      if (stopping_) return;
    }
    auto t0 = std::chrono::steady_clock::now();
    if (t0 < next_round) {
      sharing_.heartbeat(wall_clock_ns());
      continue;
    }
    const double cpu = round(true);
    auto t1 = std::chrono::steady_clock::now();
    {
      std::lock_guard lock(mu_);
      counters_.round_seconds.observe(std::chrono::duration<double>(t1 - t0).count());
    }
    bool own_readers;
    {
      std::lock_guard lock(reader_mu_);
      own_readers = readers_ > 0;
    }
    const double pause = pause_after_s(std::chrono::duration<double>(t1 - t0).count(), cpu, own_readers);
    next_round = t1 + std::max(every, std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(pause)));
  }
}

double Diagnoser::round(bool background) {
  std::set<std::pair<std::string, uint32_t>> procs_seen, trainers;
  std::set<std::string> jobs;
  {
    std::lock_guard lock(mu_);
    procs_seen.swap(dirty_procs_);
    trainers.swap(dirty_trainers_);
    jobs.swap(dirty_jobs_);
  }
  // A store shared with other collectors is looked at every round: they may have noted jobs for
  // this one (and the round is this collector's heartbeat).
  if (procs_seen.empty() && jobs.empty() && !sharing_.shared()) return 0;
  std::set<std::string> all_jobs;
  // Per job named by its processes: the ranks that sent their process, and the world size they say.
  std::map<std::string, std::pair<std::set<int>, int>> joined;
  // (Read for jobs noted without new data too: one that waited for its ranks comes back so.)
  if (!procs_seen.empty() || (background && !jobs.empty())) {
    auto procs = read([](store::Store& s) { return s.processes(); });
    if (!procs) {
      log_ << "strata: serve: diagnosis: " << procs.error().message << "\n";
      return 0;
    }
#ifdef STRATA_HAVE_DIAGNOSE
    const ProcsByPid by_pid = by_pid_of(*procs);
#endif
    for (const auto& p : *procs) {
      if (p.rank < 0) {
#ifdef STRATA_HAVE_DIAGNOSE
        // A process that trains without a RANK: its job is named after its parent.
        if (p.job.empty() && trainers.count({p.node, p.pid})) jobs.insert(job_without_rank(by_pid, p));
#endif
        continue;
      }
      all_jobs.insert(p.job);
      if (procs_seen.count({p.node, p.pid})) jobs.insert(p.job);
      auto& [ranks, world] = joined[p.job];
      ranks.insert(p.rank);
      world = std::max(world, p.world_size);
    }
  }
  const size_t with_new_data = jobs.size();
  jobs = sharing_.take(jobs, wall_clock_ns());
  if (with_new_data == 0 && jobs.empty()) return 0;
  if (background) {
    // Jobs still joining wait (join_grace_ns at most), noted again for the next round.
    const uint64_t now = wall_clock_ns();
    std::vector<std::string> waiting;
    for (const auto& job : jobs) {
      auto it = joined.find(job);
      if (it == joined.end()) continue;
      const auto& [ranks, world] = it->second;
      if (world <= 0 || ranks.size() >= static_cast<size_t>(world)) continue;
      auto st = state_of(job);
      if (!st->joining_since_ns) st->joining_since_ns = now;
      if (now - st->joining_since_ns < opts_.join_grace_ns) waiting.push_back(job);
    }
    if (!waiting.empty()) {
      std::lock_guard lock(mu_);
      for (const auto& job : waiting) {
        jobs.erase(job);
        dirty_jobs_.insert(job);
      }
      counters_.waiting += waiting.size();
    }
  }
  {
    std::lock_guard lock(mu_);
    counters_.rounds++;
    counters_.skipped += all_jobs.size() > with_new_data ? all_jobs.size() - with_new_data : 0;
    counters_.handed_over = sharing_.handed_over();
  }
  drop_idle_states();
  // Quiet jobs' rows go before this round's loads read (each job's round lets other jobs' rows go
  // after its load, when that took the rows held over the bound: not here, where the least recently
  // active job may be one this round diagnoses, and would read its whole span again).
  if (const uint64_t released = release_rows(nullptr)) {
    std::lock_guard lock(mu_);
    counters_.rows_released += released;
  }
  // The jobs of the round, kRoundThreads at a time.
  const std::vector<std::string> list(jobs.begin(), jobs.end());
  std::atomic<size_t> next{0};
  std::mutex cpu_mu;
  double cpu = 0;  // the round's CPU, over its threads
  auto work = [&] {
    const double c0 = thread_cpu_s();
    for (size_t i; (i = next++) < list.size();) {
      {
        std::lock_guard lock(mu_);
        if (stopping_) break;
      }
      (void)diagnose_job(list[i]);
    }
    std::lock_guard lock(cpu_mu);
    cpu += thread_cpu_s() - c0;
  };
  std::vector<std::thread> pool;
  for (size_t k = 1; k < std::min(kRoundThreads, list.size()); ++k) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  {
    std::lock_guard lock(mu_);
    counters_.cpu_seconds += cpu;
  }
  return cpu;
}

Result<std::string> Diagnoser::diagnose_job(const std::string& job) {
#ifdef STRATA_HAVE_DIAGNOSE
  // One round of a job at a time (the thread, or a first request); other jobs go on meanwhile.
  std::shared_ptr<JobState> state = job.empty() ? nullptr : state_of(job);
  std::unique_lock one(state ? state->mu : first_mu_);
  auto t0 = std::chrono::steady_clock::now();
  auto count = [&](bool ok) {
    std::lock_guard lock(mu_);
    (ok ? counters_.diagnosed : counters_.failed)++;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    counters_.seconds += dt;
    counters_.job_seconds.observe(dt);
  };
  diagnose::LoadOptions lo;
  lo.job = job;
  lo.all_recordings = true;
  diagnose::Stats stats;
  lo.stats = &stats;
  lo.cancel = &cancel_;
  // Read through the rounds' own connection when there is one: ingest goes on meanwhile. The
  // window is the span since the last round's end (one analysis span before it, for context); of
  // it, only what was written since the last round is read (diagnose::refresh_span_rows).
  // What was written since the job's rows were last read, for a store without write sequences:
  // every note before this point is in changed_from_ns, what is written from now on is noted for
  // the next round.
  std::optional<uint64_t> changed_from;
  if (state) {
    fold_noted();
    std::lock_guard changed(state->changed_mu);
    changed_from = std::exchange(state->changed_from_ns, UINT64_MAX);
  }
  // Batches that other collectors of a shared store applied are never noted here: without write
  // sequences, the whole span is read.
  if (store_.shared()) changed_from.reset();
  Result<diagnose::JobWindow> window = read([&](store::Store& s) -> Result<diagnose::JobWindow> {
    auto latest = s.latest_step_ns(std::nullopt);
    if (!latest) return latest.error();
    if (!*latest) return Error{"no training step in the store yet"};
    const uint64_t end = **latest;
    uint64_t from = state && state->last_end_ns ? state->last_end_ns : end;
    from = from > kAnalysisSpanNs ? from - kAnalysisSpanNs : 0;
    if (end > kMaxRoundSpanNs) from = std::max(from, end - kMaxRoundSpanNs);
    lo.from_ns = from;
    if (state) {
      // The job's processes, in every recording (agents restart), and their nodes: the rows held
      // for the job are theirs. A job no process names (its ranks were inferred: no RANK) holds
      // every process's.
      std::optional<diagnose::JobMembers> members;
      auto procs = s.processes(std::nullopt);
      if (!procs) return procs.error();
      uint64_t first_start = UINT64_MAX;  // the job's earliest process start (0: one not known)
      for (const auto& p : *procs) {
        if (p.job != job) continue;
        if (!members) members.emplace();
        (*members)[p.node].insert(p.pid);
        first_start = std::min(first_start, p.start_ns);
      }
      // No row of the job ends before its first process started (each row ends after its own
      // process's start, on its own node's clock): a young job's span starts there. Read from the
      // span's usual start instead, a new job's first rounds read the job before it on the same
      // nodes, to throw it away (measured at 8,000 ranks: 2-3.6 s of a new job's first rounds, while
      // its processes joined and each join read the span whole again).
      if (members && first_start != UINT64_MAX && first_start > from && first_start < end) {
        from = first_start;
        lo.from_ns = from;
      }
      // A job named by its processes' RANK and job name, none of which the store shows yet (a
      // round noted by a batch this connection does not see yet): nothing of it to read. Read as
      // an inferred job's, the span would be every process's: measured at 8,000 ranks, a new
      // job's first round read the 2.6M rows of the job before it, beside that job's held ones
      // (the collector's peak RSS, 2.1 GB, came at each change of job).
      if (!members && !inferred_job(*procs, job))
        return Error{"no process of job '" + job + "' is in the store yet"};
      // Only the rows new since the last round are read (the held ones are the span's others).
      if (auto st = diagnose::refresh_span_rows(s, state->rows, std::nullopt, from, changed_from, &stats, &cancel_,
                                                true, members ? &*members : nullptr);
          !st) {
        state->rows = diagnose::SpanRows{};  // read whole next time
        return st.error();
      }
      lo.rows = &state->rows;
    }
    return diagnose::load_job_window(s, lo);
  });
  uint64_t released = 0;
  if (state) {
    const size_t now_rows = state->rows.size();
    held_rows_ += static_cast<int64_t>(now_rows) - static_cast<int64_t>(state->counted_rows);
    state->counted_rows = now_rows;
#ifdef STRATA_HAVE_DIAGNOSE
    // The job's agents' window, from its latest metric windows (a node's own series and its ranks'
    // come in one window each): how long the job may be quiet while it runs (quiet_after_ns).
    const auto metrics = state->rows.metrics.view();
    uint64_t window = 0;
    for (size_t i = metrics.size() > kWindowRowsLooked ? metrics.size() - kWindowRowsLooked : 0; i < metrics.size(); ++i) {
      if (metrics[i].end_ns > metrics[i].start_ns) window = std::max(window, metrics[i].end_ns - metrics[i].start_ns);
    }
    if (window > 0) state->window_ns = window;
#endif
    released = release_rows(state.get());
    if (!opts_.hold_rows) released += let_rows_go(*state);
  }
  {
    std::lock_guard lock(mu_);
    counters_.rows_read += stats.rows();
    counters_.rows_passed_over += stats.passed_over;
    counters_.rows_released += released;
  }
  if (!window) {
    count(false);
    return window.error();  // no steps yet: nothing to keep
  }
  // The job's healthy past from the rounds before, then the engine: it reads only the window, the
  // store is free for ingest meanwhile.
  if (state && !state->baseline.empty()) state->baseline.apply(*window);
  auto dx = diagnose::diagnose(*window);
  if (state) {
    // A healthy window joins the past the next rounds compare with; a slow one never does.
    if (diagnose::may_join_past(dx)) state->baseline.absorb(*window);
    state->last_end_ns = std::max(state->last_end_ns, window->end_ns);
    state->last_findings = static_cast<uint32_t>(dx.findings.size());
  }
  std::ostringstream json, text;
  diagnose::write_json(dx, json);
  diagnose::write_text(dx, text);
  store::KeptDiagnosis kd;
  kd.job = window->job;
  kd.diagnosed_ns = wall_clock_ns();
  kd.window_start_ns = window->start_ns;
  kd.window_end_ns = window->end_ns;
  kd.ranks = static_cast<uint32_t>(dx.ranks);
  kd.findings = static_cast<uint32_t>(dx.findings.size());
  kd.report_json = json.str();
  kd.report_text = text.str();
  std::vector<store::KeptFinding> rows;
  for (const auto& f : dx.findings) {
    store::KeptFinding k;
    k.job = kd.job;
    k.diagnosed_ns = kd.diagnosed_ns;
    k.window_start_ns = kd.window_start_ns;
    k.window_end_ns = kd.window_end_ns;
    k.rank = f.rank;
    k.node = f.node;
    k.layer = f.layer;
    k.cause = cause_name(f.cause);
    k.culprit = f.culprit;
    k.lost_ms_per_step = std::isfinite(f.lost_ms_per_step) ? f.lost_ms_per_step : 0;
    k.confidence = f.confidence;
    k.evidence_json = "{\"evidence\":[";
    for (size_t i = 0; i < f.evidence.size(); ++i) k.evidence_json += (i ? "," : "") + json_str(f.evidence[i]);
    k.evidence_json += "],\"advice\":" + json_str(f.advice) + "}";
    rows.push_back(std::move(k));
  }
  Status st;
  {
    std::lock_guard lock(store_mu_);
    st = store_.put_diagnosis(kd, rows);
  }
  if (!st) log_ << "strata: serve: cannot keep the diagnosis of job '" << kd.job << "': " << st.error().message << "\n";
  count(static_cast<bool>(st));
  if (!st) return st.error();
  return kd.job;
#else
  (void)job;
  return Error{"the diagnosis engine is not built into this server"};
#endif
}

Diagnoser::Reply Diagnoser::findings(const std::string& wanted, bool job_given, bool text) {
  auto error_reply = [&](int status, const std::string& job, const std::string& why) {
    Reply r;
    r.status = text ? status : 200;  // the web UI reads the JSON's "error"
    r.content_type = text ? "text/plain; charset=utf-8" : "application/json";
    r.body = text ? why + "\n"
                  : "{\"job\":" + json_str(job) + ",\"findings\":[],\"error\":" + json_str(why) + "}\n";
    return r;
  };
  // Without background rounds, a request makes the round for whatever arrived since the last one.
  if (opts_.every_s <= 0) round(false);
  std::string job = wanted;
  std::optional<store::KeptDiagnosis> kept;
  {
    std::lock_guard lock(store_mu_);
    if (job_given) {
      auto k = store_.latest_diagnosis(job);
      if (!k) return error_reply(503, job, k.error().message);
      kept = std::move(*k);
    } else {
      // The job with the most ranks, as a recording's diagnosis picks it.
      auto all = store_.latest_diagnoses();
      if (!all) return error_reply(503, job, all.error().message);
      for (auto& d : *all) {
        if (!kept || d.ranks > kept->ranks) kept = std::move(d);
      }
    }
  }
  if (!kept) {
    // Nothing kept yet (the first request before the first round): diagnose it now.
    auto name = diagnose_job(job_given ? job : "");
    if (!name) return error_reply(404, job, name.error().message);
    std::lock_guard lock(store_mu_);
    auto k = store_.latest_diagnosis(*name);
    if (!k || !*k) return error_reply(503, job, "the diagnosis was made but cannot be read back");
    kept = std::move(**k);
  }
  std::vector<store::FindingHistory> history;
  {
    std::lock_guard lock(store_mu_);
    auto h = store_.finding_history(kept->job);
    if (!h) return error_reply(503, kept->job, h.error().message);
    history = std::move(*h);
  }
  Reply r;
  if (text) {
    r.content_type = "text/plain; charset=utf-8";
    std::string o = kept->report_text;
    o += "\ndiagnosed by strata serve at " + utc(kept->diagnosed_ns) + " (a round whenever new data arrives)\n";
    if (!history.empty()) o += "history of this job's findings:\n";
    for (const auto& h : history) {
      bool active = h.last_seen_ns == kept->diagnosed_ns;
      o += std::string("  ") + (active ? "ACTIVE  " : "resolved") + " " + h.cause + " on rank " + std::to_string(h.rank) +
           ": " + h.culprit + "; first seen " + utc(h.first_seen_ns) + (active ? "" : ", last seen " + utc(h.last_seen_ns)) +
           ", in " + std::to_string(h.rounds) + " round(s)\n";
    }
    r.body = std::move(o);
    return r;
  }
  r.content_type = "application/json";
  std::string o = kept->report_json;
  while (!o.empty() && (o.back() == '\n' || o.back() == ' ')) o.pop_back();
  if (o.empty() || o.back() != '}') return error_reply(503, kept->job, "a kept diagnosis is damaged");
  o.pop_back();
  o += ",\"kept\":{\"diagnosed_ns\":" + json_num(kept->diagnosed_ns) + ",\"window_start_ns\":" +
       json_num(kept->window_start_ns) + ",\"window_end_ns\":" + json_num(kept->window_end_ns) + "},\"history\":[";
  for (size_t i = 0; i < history.size(); ++i) {
    const auto& h = history[i];
    o += (i ? "," : "") + std::string("{\"rank\":") + json_num(h.rank) + ",\"node\":" + json_str(h.node) +
         ",\"layer\":" + json_str(h.layer) + ",\"cause\":" + json_str(h.cause) + ",\"culprit\":" + json_str(h.culprit) +
         ",\"first_seen_ns\":" + json_num(h.first_seen_ns) + ",\"last_seen_ns\":" + json_num(h.last_seen_ns) +
         ",\"first_window_start_ns\":" + json_num(h.first_window_start_ns) + ",\"rounds\":" + json_num(h.rounds) +
         ",\"max_lost_ms_per_step\":" + json_num(h.max_lost_ms_per_step) +
         ",\"active\":" + (h.last_seen_ns == kept->diagnosed_ns ? "true" : "false") + "}";
  }
  r.body = o + "]}\n";
  return r;
}

}  // namespace strata::server
