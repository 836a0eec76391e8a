// The node pipeline that `strata record` and `strata agent` both run (DESIGN §2): the on-CPU
// sampler and the layers' sources, process tracking (identity, CPU, exits), the window clock,
// normalization and symbolization of stacks, the cost budget and (for the agent) the flight
// recorder. Each closed window goes to one sink, a store::Writer: the
// SQLite store (`strata record`, `strata agent -o`) or the shipper's BatchingWriter (`strata agent
// --server`). The shells around it only choose what to watch and where the windows go:
//   record = pipeline + SQLite sink + the command it starts (or -p pids)
//   agent  = pipeline + shipper or SQLite sink + /proc scan for training processes + /metrics + /drilldown
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "agent/capture.h"
#include "agent/cost_budget.h"
#include "agent/events.h"
#include "agent/flight_recorder.h"
#include "agent/normalizer.h"
#include "agent/oncpu_sampler.h"
#include "agent/privileges.h"
#include "agent/process_info.h"
#include "agent/source.h"
#include "agent/window_profile.h"
#include "common/result.h"
#include "store/store.h"
#include "symbolize/symbolizer.h"

namespace strata::agent {

struct SourceEnv;  // agent/sources.h

struct PipelineOptions {
  std::string node;  // the node's name on every record
  unsigned frequency_hz = 99;
  double window_s = 10;
  std::set<std::string> layers = {"cpu", "offcpu", "os", "gpu", "comm"};
  size_t unwind_table_bytes = 128u << 20;  // normalizer.h
  // Raw per-kernel GPU records into the sink every window (a local store); else per-window
  // summaries only, raw records in the flight recorder (the shipper: DESIGN §2).
  bool raw_device_records = true;
  bool flight_recorder = false;  // keep raw collectives and device records for /drilldown
  // Symbolize new frames when each window closes (a store read while the agent runs); else once in
  // finish(), off the target's time. The shipper symbolizes as it interns and needs neither.
  bool symbolize_each_window = false;
  double budget_share = CostBudget::kDefaultShare;
  std::string log_prefix = "strata: ";
  // Symbolize frames at all (replay does not: symbols would come from this machine's files).
  bool symbolize = true;
  // Where the pipeline reads the world (agent/capture.h): nullptr is live; a capturing tape also
  // writes every read to a capture; a replaying one runs the pipeline from a capture (the event
  // engine is then the capture's, not BPF). Not owned; outlives the pipeline.
  Tape* tape = nullptr;
};

// The closing figures of a run, for `strata record`'s summary and the agent's last line.
struct PipelineTotals {
  SamplerCounters counters;
  uint64_t samples_seen = 0;    // samples taken from the ring buffer
  uint64_t samples_stored = 0;  // ... written into windows
  uint64_t windows = 0;         // windows closed
  uint64_t windows_with_samples = 0;
  uint64_t processes = 0;       // processes seen
  uint64_t threads = 0;         // threads seen sampled
  uint64_t distinct_stacks = 0; // stored (counted up to kMaxCountedStacks)
  double agent_cpu_s = 0;       // the agent's own CPU while the targets ran
  double agent_cpu_after_s = 0; // in finish(): last window, symbolization
  double target_cpu_s = 0;      // the watched processes' CPU over the same time
  double wall_s = 0;
  double sources_kernel_s = 0;  // the other layers' BPF run time and probe traps (Source::kernel_cost_ns)
};

class NodePipeline final : public EventSink {
 public:
  NodePipeline(const PipelineOptions& opts, std::ostream& log);
  ~NodePipeline() override;

  // The privileged start-up, on the calling thread and without starting any thread: loads the
  // BPF programs, opens the perf events, starts the layers' sources (a layer that cannot start
  // here is a warning; the on-CPU sampler is required: an environment error without it).
  Status start();
  // Start-up is over: keeps only the runtime capabilities (privileges.h; bounding set included)
  // for the whole process, then starts the sources' threads. No thread of this process exists yet
  // when the shell follows the rule (start no thread before this), so every thread started
  // afterwards -- sources, shipper, HTTP -- inherits the reduced sets.
  void drop_privileges_and_start_threads();
  // Where the windows go; begins the recording (this node, rate and window; `command` names what
  // is watched). The run's clock (its duration, the first window, the agent's CPU) starts with the
  // first step(), once the shell's start-up is over.
  Status begin(store::Writer& sink, const std::string& command);

  // Watches a process from now on (its children follow in the kernel). `preexisting`: it ran
  // before the watch began, so only its CPU from now on is the run's.
  Status watch(uint32_t pid, bool preexisting);
  // The two halves of watch(), for a child started by the shell: the kernel follows it from its
  // first instruction (add_target), and it is announced once it has exec'ed the command.
  Status add_target(uint32_t pid);
  void announce(uint32_t pid, uint32_t ppid, const std::string& comm, bool preexisting);
  bool known(uint32_t pid) const { return known_.count(pid) > 0; }
  size_t known_count() const { return known_.size(); }
  size_t live_processes() const { return live_.size(); }
  // Thread ids held for the run's thread count (bounded: kMaxThreadsPerProcess per live process).
  size_t threads_held() const {
    size_t n = 0;
    for (const auto& [pid, tids] : threads_) n += tids.size();
    return n;
  }
  size_t normalizer_processes() const { return normalizer_.processes_held(); }
  // Forgets pids that are gone and no longer watched (bounds a long-running agent's memory).
  void forget_gone_pids();

  // One turn of the loop: takes the kernel's events (waits up to timeout_ms), polls the sources,
  // refreshes the watched processes' CPU and forgets exited ones (once a second), and closes the
  // window when it is due (by time, or when it holds kMaxWindowStacks distinct stacks). Errors
  // are the sink's (a full disk): the run cannot go on.
  Status step(int timeout_ms);
  double elapsed_s() const;
  // CPU of watched children already reaped by the shell (rusage counts them; /proc no longer can).
  void note_reaped_cpu_ns(uint64_t ns);

  // The end of the run: the kernel's last events, the last window, symbolization, the run's stats
  // (with `extra_stats`), the end of the recording.
  Result<PipelineTotals> finish(const std::vector<std::pair<std::string, double>>& extra_stats = {});

  // For /metrics and the batches' health.
  SamplerCounters counters() const;
  // What the sources' kernel side has cost so far (Source::kernel_cost_ns), summed.
  uint64_t sources_kernel_cost_ns() const;
  UnwindCounters unwind_counters() const { return normalizer_.unwind_counters(); }
  const CostBudget& budget() const { return budget_; }
  const WallClockWatch& clock_watch() const { return clock_watch_; }
  uint64_t windows() const { return windows_; }
  uint64_t samples_seen() const { return samples_seen_; }
  uint64_t probe_hits() const;
  void source_stats(std::vector<std::pair<std::string, double>>& out) const;
  FlightRecorder& flight_recorder() { return flight_; }

  // EventSink: the sampler's events.
  void on_sample(const SampleEvent& e) override;
  void on_proc(const ProcEvent& e) override;

 private:
  SourceEnv source_env();
  void see_process(uint32_t pid, uint32_t ppid, const std::string& comm, bool refresh, bool preexisting);
  void forget(uint32_t pid);
  void refresh_cpu(uint32_t pid);
  void start_clock();
  void refresh_watched();
  uint64_t target_cpu_ns() const;
  Status close_window(bool last = false);
  void apply_budget(const WindowContext& ctx, double one_time_s);
  Status symbolize_new_frames();
  std::vector<std::pair<std::string, double>> run_stats(const PipelineTotals& t) const;
  void control(CaptureControl op, const ByteWriter& args = ByteWriter());  // the shell's call, taped

  PipelineOptions opts_;
  std::ostream& log_;
  Tape& tape_;
  std::unique_ptr<OnCpuSampler> sampler_;
  std::unique_ptr<symbolize::Symbolizer> symbolizer_ = symbolize::make_caching_symbolizer();
  Normalizer normalizer_{opts_.unwind_table_bytes};  // after opts_
  FlightRecorder flight_;  // before the sources: they hold a pointer to it
  std::vector<std::unique_ptr<Source>> sources_;
  WindowProfile profile_{normalizer_};  // after normalizer_
  store::Writer* sink_ = nullptr;
  int64_t recording_ = 0;

  // The window clock.
  bool clock_started_ = false;
  uint64_t started_ = 0, window_started_ = 0, last_refresh_ = 0;  // CLOCK_MONOTONIC ns (the tape's)
  uint64_t window_start_unix_ = 0;
  uint64_t window_start_mono_ = 0;
  WallClockWatch clock_watch_;
  uint64_t windows_ = 0, windows_with_samples_ = 0;
  uint64_t samples_seen_ = 0, samples_stored_ = 0;
  double cpu_at_start_ = 0;

  // Process tracking.
  std::set<uint32_t> known_;  // announced; kept until the pid is gone (a late sample must not re-announce it)
  std::set<uint32_t> live_;   // watched now
  uint64_t processes_seen_ = 0;
  std::map<uint32_t, store::ProcessInfo> pending_processes_;  // written with the next window
  std::unordered_map<uint32_t, std::unordered_set<uint32_t>> threads_;  // live pid -> tids sampled
  // The distinct threads kept per process for the run's thread count: a training rank has ~100
  // (intra-op pool, NCCL, data loading), but one that starts threads all the time (a thread per
  // request or per checkpoint) would add a tid per thread for weeks; past this the count goes on
  // in threads_gone_ and the set starts over.
  static constexpr size_t kMaxThreadsPerProcess = 4096;
  uint64_t threads_gone_ = 0;
  std::unordered_map<uint32_t, uint64_t> cpu_first_, cpu_last_;  // pid -> CPU ns at watch start / last look
  uint64_t cpu_gone_ns_ = 0;  // the run's CPU of processes forgotten since
  uint64_t reaped_cpu_ns_ = 0;
  // Distinct stored stacks for the summary, bounded: a months-long agent must not grow with it.
  static constexpr size_t kMaxCountedStacks = 1u << 18;
  std::unordered_set<int64_t> stored_stacks_;

  // The cost budget.
  CostBudget budget_{opts_.budget_share};  // after opts_
  double budget_cpu_mark_ = 0, budget_bpf_mark_ = 0;
  uint64_t budget_target_mark_ = 0;
  unsigned sampling_hz_ = opts_.frequency_hz;  // the sampler's rate now (the budget lowers it)
  uint64_t one_time_mark_ns_ = 0;  // unwind-table builds and loads so far
  double symbolize_s_ = 0;         // this window's symbolization (one-time per frame)
  double one_time_total_s_ = 0;
};

}  // namespace strata::agent
