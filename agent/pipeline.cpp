#include "agent/pipeline.h"

#include <dirent.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <ostream>
#include <string>

#include "agent/engine.h"
#include "agent/limits.h"
#include "agent/sources.h"
#include "common/self_usage.h"

namespace strata::agent {

namespace {
// How often the watched processes' CPU is read and exits noticed: often enough for the run's CPU
// figure, rarely enough to cost nothing.
constexpr uint64_t kRefreshNs = 1'000'000'000ull;
}  // namespace

NodePipeline::NodePipeline(const PipelineOptions& opts, std::ostream& log)
    : opts_(opts), log_(log), tape_(opts.tape ? *opts.tape : live_tape()) {
  if (opts_.node.empty()) opts_.node = node_name();
  normalizer_.set_tape(&tape_);
}

void NodePipeline::control(CaptureControl op, const ByteWriter& args) {
  if (!tape_.capturing()) return;
  ByteWriter w;
  w.u8(static_cast<uint8_t>(op));
  std::string rec = w.take() + args.data();
  tape_.put(CaptureKind::kControl, rec);
}

// Sources first (their threads join), then the sampler they share maps with.
NodePipeline::~NodePipeline() { sources_.clear(); }

// What every source gets from the pipeline, live or replayed (the live BPF maps are added by start()).
SourceEnv NodePipeline::source_env() {
  SourceEnv env;
  env.normalizer = &normalizer_;
  env.frequency_hz = opts_.frequency_hz;
  env.raw_device_records = opts_.raw_device_records;
  env.flight_recorder = opts_.flight_recorder ? &flight_ : nullptr;
  env.tape = &tape_;
  return env;
}

Status NodePipeline::start() {
  if (tape_.replaying()) {  // the capture's events, and the sources that replay (sources.h)
    sampler_ = replay_sampler(tape_);
    auto started = make_replay_sources(opts_.layers, source_env());
    sources_ = std::move(started.sources);
    for (const auto& w : started.warnings) log_ << opts_.log_prefix << w << "\n";
    return {};
  }
  SamplerOptions so;
  so.frequency_hz = opts_.frequency_hz;
  so.sample_cpu = opts_.layers.count("cpu") > 0;
  auto sampler = OnCpuSampler::start(so);
  if (!sampler) return sampler.error().environment();
  sampler_ = std::move(*sampler);
  if (tape_.capturing()) sampler_ = capturing_sampler(std::move(sampler_), tape_);
  normalizer_.set_python_hook([this](uint32_t pid, const strata_py_offsets* o) {
    (void)sampler_->set_python_process(pid, o);  // a full map only costs that process its Python frames
  });
  // Mode 3: the kernel unwinds with CFI from tables the normalizer derives and loads.
  if (sampler_->user_stack_mode() == STRATA_USTACK_KERNEL_CFI) {
    normalizer_.set_kernel_unwind(KernelUnwindHooks{
        [this](const strata_unwind_row* rows, size_t n) { return sampler_->load_unwind_module(rows, n); },
        [this](uint32_t pid, const strata_proc_mappings* m) { return bool(sampler_->set_process_mappings(pid, m)); }});
  } else if (sampler_->user_stack_mode() == STRATA_USTACK_BOTH) {  // adaptive: which modules keep frame pointers
    normalizer_.set_kernel_unwind(KernelUnwindHooks{
        nullptr,
        [this](uint32_t pid, const strata_proc_mappings* m) { return bool(sampler_->set_process_mappings(pid, m)); },
        /*tables=*/false});
  }
  SourceEnv env = source_env();
  env.targets_map_fd = sampler_->targets_map_fd();
  env.target_bits_fd = sampler_->target_bits_fd();
  auto started = make_sources(opts_.layers, env);
  sources_ = std::move(started.sources);
  for (const auto& w : started.warnings) log_ << opts_.log_prefix << "warning: " << w << "\n";
  for (const auto& src : sources_) {
    if (auto st = sampler_->add_wake_fd(src->wake_fd()); !st) return st.error().context(src->name());
  }
  return {};
}

namespace {

// The job comes first: every thread of the agent runs at this nice value (never lower than it was
// started with). Against a runnable thread of the job at nice 0 it gets 110/1134 of a contended CPU
// (CFS weights 1024 and 110), about 10%: its one-time start-up work (unwind tables, the first
// window's symbols) waits for the job's idle moments instead of taking half of a pinned rank's CPU,
// and 10% is still ten times what its steady work needs (0.4 s of CPU a minute, measured on a
// 2-rank DDP job), so it keeps up on a saturated node. 19 (1.5%) would leave it no margin for a
// window's close. (autogroup: nice weighs inside the session's group; `record -- CMD` shares one
// with its command, an agent under systemd or Kubernetes is weighed by its cgroup.)
constexpr int kAgentNice = 10;

// Sets every thread of this process to at least `nice` (Linux: nice is per thread; threads started
// later inherit it). The number of threads it could not set.
size_t lower_priority(int nice) {
  size_t failed = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return 1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const auto tid = static_cast<id_t>(std::strtoul(e->d_name, nullptr, 10));
    errno = 0;
    int now = getpriority(PRIO_PROCESS, tid);
    if (errno != 0) continue;  // gone
    if (now < nice && setpriority(PRIO_PROCESS, tid, nice) != 0) ++failed;
  }
  closedir(d);
  return failed;
}

}  // namespace

void NodePipeline::drop_privileges_and_start_threads() {
  // After the command of `record -- CMD` was forked (it keeps the priority it was started with),
  // before the sources' threads start (they inherit this one's).
  if (size_t failed = lower_priority(kAgentNice); failed > 0)
    log_ << opts_.log_prefix << "warning: " << failed << " thread(s) kept their priority (nice " << kAgentNice << " asked)\n";
  if (auto dropped = drop_to_runtime_capabilities(); !dropped)
    log_ << opts_.log_prefix << "warning: cannot drop capabilities: " << dropped.error().message << "\n";
  else if (dropped->dropped)
    log_ << opts_.log_prefix << "capabilities kept: " << capability_names(dropped->kept) << "\n";
  for (auto& src : sources_) src->start_threads();
}

Status NodePipeline::begin(store::Writer& sink, const std::string& command) {
  ByteWriter args;
  args.str(command);
  control(CaptureControl::kBegin, args);
  sink_ = &sink;
  store::RecordingInfo info;
  info.node = opts_.node;
  info.command = command;
  info.started_ns = tape_.unix_ns();
  info.sample_hz = opts_.frequency_hz;
  info.window_s = opts_.window_s;
  auto rec = sink_->begin_recording(info);
  if (!rec) return rec.error();
  recording_ = *rec;
  return {};
}

void NodePipeline::start_clock() {
  if (clock_started_) return;
  clock_started_ = true;
  started_ = window_started_ = last_refresh_ = tape_.mono_ns();
  window_start_unix_ = tape_.unix_ns();
  window_start_mono_ = tape_.mono_ns();
  cpu_at_start_ = budget_cpu_mark_ = self_cpu_seconds();
}

Status NodePipeline::add_target(uint32_t pid) {
  ByteWriter args;
  args.u32(pid);
  control(CaptureControl::kAddTarget, args);
  if (auto st = sampler_->add_target(pid); !st) return st.error().environment();
  return {};
}

Status NodePipeline::watch(uint32_t pid, bool preexisting) {
  ByteWriter args;
  args.u32(pid);
  args.u8(preexisting ? 1 : 0);
  control(CaptureControl::kWatch, args);
  if (auto st = sampler_->add_target(pid); !st) return st.error().environment();
  see_process(pid, 0, "", /*refresh=*/false, preexisting);
  return {};
}

void NodePipeline::announce(uint32_t pid, uint32_t ppid, const std::string& comm, bool preexisting) {
  ByteWriter args;
  args.u32(pid);
  args.u32(ppid);
  args.str(comm);
  args.u8(preexisting ? 1 : 0);
  control(CaptureControl::kAnnounce, args);
  see_process(pid, ppid, comm, /*refresh=*/false, preexisting);
}

void NodePipeline::note_reaped_cpu_ns(uint64_t ns) {
  ByteWriter args;
  args.u64(ns);
  control(CaptureControl::kReapedCpu, args);
  reaped_cpu_ns_ = std::max(reaped_cpu_ns_, ns);
}

void NodePipeline::forget_gone_pids() {
  control(CaptureControl::kForgetGone);
  for (auto it = known_.begin(); it != known_.end();) it = live_.count(*it) ? std::next(it) : known_.erase(it);
}

void NodePipeline::on_sample(const SampleEvent& e) {
  profile_.add(e);
  samples_seen_++;
  // Every thread of a watched process is a target; a sample from a pid not yet announced is a
  // child whose fork event is still on its way.
  if (!known_.count(e.pid)) see_process(e.pid, 0, "", /*refresh=*/false, /*preexisting=*/false);
  // A late sample of a process already forgotten (its exit came first) counts no thread, and what
  // normalizing it made again (its re-read rate, unwinding state) goes: an entry made for it here
  // would never be erased.
  if (!live_.count(e.pid)) {
    normalizer_.forget_process(e.pid);
    return;
  }
  auto& tids = threads_[e.pid];
  if (tids.size() >= kMaxThreadsPerProcess && !tids.count(e.tid)) {
    // Counted so far and started over: a thread seen again past this point is counted twice.
    threads_gone_ += tids.size();
    tids.clear();
  }
  tids.insert(e.tid);
}

void NodePipeline::on_proc(const ProcEvent& e) {
  switch (e.type) {
    case ProcEvent::Type::kFork:
      live_.insert(e.pid);
      see_process(e.pid, e.ppid, e.comm, /*refresh=*/false, /*preexisting=*/false);
      break;
    case ProcEvent::Type::kExec:
      normalizer_.process_exec(e.pid);  // first: see_process learns the new image's maps
      see_process(e.pid, 0, e.comm, /*refresh=*/true, /*preexisting=*/false);
      break;
    case ProcEvent::Type::kExit:
      forget(e.pid);
      break;
  }
}

void NodePipeline::see_process(uint32_t pid, uint32_t ppid, const std::string& comm, bool refresh, bool preexisting) {
  if (known_.count(pid) && !refresh) return;
  if (known_.insert(pid).second) processes_seen_++;
  live_.insert(pid);
  auto info = tape_.process_info(pid, opts_.node);
  store::ProcessInfo p;
  if (info) {
    p = *info;
  } else {  // gone already: keep what the kernel told us
    p.pid = pid;
    p.ppid = ppid;
    p.node = opts_.node;
    p.comm = comm;
    p.command = "[" + comm + "]";
    p.start_ns = tape_.unix_ns();
  }
  pending_processes_[pid] = p;
  if (opts_.flight_recorder) flight_.note_process(p);
  for (auto& src : sources_) src->on_process(p);
  if (!cpu_first_.count(pid)) {
    // Processes that ran before the watch count from now; children from zero.
    auto cpu = tape_.process_cpu_ns(pid);
    cpu_first_[pid] = preexisting && cpu ? *cpu : 0;
    cpu_last_[pid] = cpu ? *cpu : 0;
  }
  if (info) normalizer_.learn_process(pid);
}

void NodePipeline::forget(uint32_t pid) {
  if (!live_.erase(pid)) return;
  refresh_cpu(pid);  // an exiting process can still be read until it is reaped
  auto first = cpu_first_.find(pid);
  if (first != cpu_first_.end()) {
    uint64_t last = cpu_last_[pid];
    cpu_gone_ns_ += last > first->second ? last - first->second : 0;
    cpu_first_.erase(first);
    cpu_last_.erase(pid);
  }
  auto t = threads_.find(pid);
  if (t != threads_.end()) {
    threads_gone_ += t->second.size();
    threads_.erase(t);
  }
  normalizer_.forget_process(pid);
  for (auto& src : sources_) src->on_process_exit(pid);
  if (opts_.flight_recorder) flight_.note_exit(pid);
  // known_ keeps the pid until forget_gone_pids(): a late sample of the dying process must not
  // announce it again.
}

void NodePipeline::refresh_cpu(uint32_t pid) {
  if (auto cpu = tape_.process_cpu_ns(pid)) cpu_last_[pid] = *cpu;
}

void NodePipeline::refresh_watched() {
  for (auto it = live_.begin(); it != live_.end();) {
    uint32_t pid = *it++;  // forget() erases it
    if (!tape_.process_exists(pid)) forget(pid);
    else refresh_cpu(pid);
  }
}

uint64_t NodePipeline::target_cpu_ns() const {
  uint64_t ns = cpu_gone_ns_;
  for (const auto& [pid, first] : cpu_first_) {
    auto last = cpu_last_.find(pid);
    if (last != cpu_last_.end() && last->second > first) ns += last->second - first;
  }
  return std::max(ns, reaped_cpu_ns_);  // rusage of a reaped child also counts its reaped descendants
}

double NodePipeline::elapsed_s() const {
  if (!clock_started_) return 0;
  // Not taped: the shell's own question (when to stop), answered by the control stream in replay.
  uint64_t now = monotonic_now_ns();
  return static_cast<double>(now > started_ ? now - started_ : 0) / 1e9;
}

Status NodePipeline::step(int timeout_ms) {
  ByteWriter args;
  args.u32(static_cast<uint32_t>(timeout_ms));
  control(CaptureControl::kStep, args);
  start_clock();
  auto n = sampler_->poll(timeout_ms, *this);
  if (!n) return n.error();
  for (auto& src : sources_) {
    // One layer failing to read costs that layer, never the run.
    if (auto st = src->poll(); !st) log_ << opts_.log_prefix << src->name() << ": " << st.error().message << "\n";
  }
  uint64_t now = tape_.mono_ns();
  if (now - last_refresh_ >= kRefreshNs) {
    last_refresh_ = now;
    refresh_watched();
  }
  // A window also closes when it holds kMaxWindowStacks distinct stacks: memory stays bounded.
  if (static_cast<double>(now - window_started_) / 1e9 >= opts_.window_s ||
      profile_.distinct_stacks() >= kMaxWindowStacks) {
    if (auto st = close_window(); !st) return st;
    window_started_ = now;
  }
  return {};
}

Status NodePipeline::close_window(bool last) {
  uint64_t end_unix = tape_.unix_ns();
  // Windows stay on the run's timeline (process_info.h); a step is said once, and counted.
  if (clock_watch_.look())
    log_ << opts_.log_prefix << "warning: the wall clock stepped; it is now "
         << static_cast<double>(clock_watch_.offset_ns) / 1e9
         << " s from this run's timeline, which keeps counting from the start (a restart takes the clock again)\n";
  if (auto st = sink_->begin(); !st) return st;
  for (const auto& [pid, p] : pending_processes_) {
    if (auto st = sink_->put_process(recording_, p); !st) return st;
  }
  pending_processes_.clear();
  // The window's samples were taken at the rate and unwinding the budget set when the window before
  // closed (apply_budget below changes them for the next one).
  const store::WindowFidelity fidelity{sampling_hz_, normalizer_.snapshot_unwinding() ? store::kUnwindingCfi
                                                                                       : store::kUnwindingFramePointers};
  auto written = profile_.write(*sink_, recording_, window_start_unix_, end_unix, fidelity);
  if (!written) return written.error();
  for (int64_t id : written->stack_ids) {
    if (stored_stacks_.size() >= kMaxCountedStacks) break;
    stored_stacks_.insert(id);
  }
  samples_stored_ += written->samples;
  if (written->samples > 0) windows_with_samples_++;
  WindowContext ctx;
  ctx.recording = recording_;
  ctx.start_ns = window_start_unix_;
  ctx.end_ns = end_unix;
  ctx.mono_start_ns = window_start_mono_;
  ctx.mono_end_ns = tape_.mono_ns();
  ctx.last = last;
  for (auto& src : sources_) {
    if (auto st = src->flush(*sink_, ctx); !st) return st.error().context(src->name());
  }
  // Symbolizing loads symbol tables (a one-time cost per build id): during the run only when
  // asked, else once at the end, off the target's time.
  symbolize_s_ = 0;
  if (opts_.symbolize_each_window && opts_.symbolize) {
    if (auto st = symbolize_new_frames(); !st) return st;
  }
  apply_budget(ctx, symbolize_s_);
  // For the shipper, commit seals the window's batch: also the heartbeat when it is empty.
  if (auto st = sink_->commit(); !st) return st;
  windows_++;
  window_start_unix_ = end_unix;
  window_start_mono_ = ctx.mono_end_ns;
  return {};
}

// Compares this window's agent cost with the watched processes' CPU and steps the unwinding method
// and the sampling rate down or up (cost_budget.h). One-time work -- a module's unwind table built
// or loaded into the kernel, the build ids of the files a process maps read, its CPython
// recognized, frames symbolized for the first time -- is paid once per module or process in a
// run, not per sample: it stays out of the share (else the first window of every job would turn
// CFI unwinding off), and is counted as agent.one_time_s. Recorded as per-window node metrics.
void NodePipeline::apply_budget(const WindowContext& ctx, double symbolize_s) {
  double cpu = self_cpu_seconds();
  double bpf = static_cast<double>(sampler_->counters().bpf_run_ns + sources_kernel_cost_ns()) / 1e9;
  const auto u = normalizer_.unwind_counters();
  uint64_t one_time_ns = u.table_build_ns + u.kernel_table_ns + u.learn_once_ns;
  double one_time = static_cast<double>(one_time_ns - std::min(one_time_ns, one_time_mark_ns_)) / 1e9 + symbolize_s;
  one_time_mark_ns_ = one_time_ns;
  one_time_total_s_ += one_time;
  uint64_t target_ns = target_cpu_ns();
  double cost = std::max(0.0, (cpu - budget_cpu_mark_) + (bpf - budget_bpf_mark_) - one_time);
  double target = static_cast<double>(target_ns - std::min(target_ns, budget_target_mark_)) / 1e9;
  budget_cpu_mark_ = cpu;
  budget_bpf_mark_ = bpf;
  budget_target_mark_ = target_ns;
  int before = budget_.level();
  int useless_before = budget_.useless_steps();
  double wall = static_cast<double>(ctx.mono_end_ns - std::min(ctx.mono_end_ns, ctx.mono_start_ns)) / 1e9;
  int level = budget_.update(cost, target, wall);
  if (budget_.useless_steps() != useless_before) {
    const auto& u = budget_.last_useless();
    log_ << opts_.log_prefix << "cost: level " << u.level << " cut the share only from " << percent(u.before) << " to "
         << percent(u.at_level) << " (less than " << static_cast<int>(CostBudget::kMinSaving * 100)
         << "%): back to level " << level << " for " << static_cast<int>(CostBudget::kHoldSeconds / 60)
         << " min; the rest of the cost is what no level controls\n";
  }
  if (level != before) {
    normalizer_.set_snapshot_unwinding(CostBudget::cfi_at(level));
    for (auto& src : sources_) src->set_cost_level(level);
    const unsigned hz = CostBudget::rate_at(level, opts_.frequency_hz);
    // A rate the sampler could not take leaves the one it has; the windows say which they had.
    if (auto st = sampler_->set_frequency(hz); st) sampling_hz_ = hz;
    else log_ << opts_.log_prefix << st.error().message << "\n";
    log_ << opts_.log_prefix << "cost " << percent(budget_.last_share()) << " of the targets' CPU (budget "
         << percent(budget_.budget()) << "): " << (level > before ? "stepping down" : "stepping up") << " to level "
         << level << " (" << CostBudget::rate_at(level, opts_.frequency_hz) << " Hz, "
         << (CostBudget::cfi_at(level) ? "CFI unwinding" : "frame pointers") << ")\n";
  }
  std::vector<store::Metric> m = {{0, "agent.cost_share", "", budget_.last_share()},
                                  {0, "agent.budget_level", "", static_cast<double>(level)},
                                  {0, "agent.budget_held", "", budget_.held() ? 1.0 : 0.0},
                                  {0, "agent.one_time_s", "", one_time}};
  (void)sink_->put_metrics(recording_, ctx.start_ns, ctx.end_ns, m);
}

Status NodePipeline::symbolize_new_frames() {
  double t0 = thread_cpu_seconds();
  auto frames = sink_->unsymbolized_frames();
  if (!frames) return frames.error();
  if (frames->empty()) return {};
  std::vector<Frame> fs;
  fs.reserve(frames->size());
  for (auto& r : *frames) fs.push_back(r.frame);
  symbolizer_->symbolize(fs);
  for (size_t i = 0; i < fs.size(); ++i) (*frames)[i].frame = std::move(fs[i]);
  auto st = sink_->update_frame_symbols(*frames);
  symbolize_s_ += thread_cpu_seconds() - t0;
  return st;
}

SamplerCounters NodePipeline::counters() const { return sampler_->counters(); }

uint64_t NodePipeline::sources_kernel_cost_ns() const {
  uint64_t ns = 0;
  for (const auto& src : sources_) ns += src->kernel_cost_ns();
  return ns;
}

void NodePipeline::source_stats(std::vector<std::pair<std::string, double>>& out) const {
  for (const auto& src : sources_) src->stats(out);
}

uint64_t NodePipeline::probe_hits() const {
  std::vector<std::pair<std::string, double>> stats;
  source_stats(stats);
  double hits = 0;
  for (const auto& [k, v] : stats)
    if (k == "gpu_comm.probe_entries" || k == "gpu_comm.launch_hits") hits += v;
  return static_cast<uint64_t>(hits);
}

Result<PipelineTotals> NodePipeline::finish(const std::vector<std::pair<std::string, double>>& extra_stats) {
  control(CaptureControl::kFinish);
  start_clock();  // a run stopped before its first step still closes one window
  // Take what the kernel already produced, then close the last window.
  for (int i = 0; i < 3; ++i) {
    auto n = sampler_->poll(0, *this);
    if (!n || *n == 0) break;
  }
  for (uint32_t pid : live_) refresh_cpu(pid);
  PipelineTotals t;
  double cpu_end_of_run = self_cpu_seconds();
  t.agent_cpu_s = cpu_end_of_run - cpu_at_start_;
  t.wall_s = elapsed_s();
  t.target_cpu_s = static_cast<double>(target_cpu_ns()) / 1e9;
  t.sources_kernel_s = static_cast<double>(sources_kernel_cost_ns()) / 1e9;
  if (auto st = close_window(/*last=*/true); !st) return st.error();
  if (auto st = sink_->begin(); !st) return st.error();
  if (opts_.symbolize) {
    if (auto st = symbolize_new_frames(); !st) return st.error();
  }
  t.agent_cpu_after_s = self_cpu_seconds() - cpu_end_of_run;
  t.counters = sampler_->counters();
  t.samples_seen = samples_seen_;
  t.samples_stored = samples_stored_;
  t.windows = windows_;
  t.windows_with_samples = windows_with_samples_;
  t.processes = processes_seen_;
  t.threads = threads_gone_;
  for (const auto& [pid, tids] : threads_) t.threads += tids.size();
  t.distinct_stacks = stored_stacks_.size();
  auto stats = run_stats(t);
  stats.insert(stats.end(), extra_stats.begin(), extra_stats.end());
  for (const auto& [k, v] : stats) {
    if (auto st = sink_->put_stat(recording_, k, v); !st) return st.error();
  }
  if (auto st = sink_->end_recording(recording_, tape_.unix_ns()); !st) return st.error();
  if (auto st = sink_->commit(); !st) return st.error();
  return t;
}

// The run's closing stats (the store's stats table): the sampler's, the unwinder's, the budget's,
// each source's.
std::vector<std::pair<std::string, double>> NodePipeline::run_stats(const PipelineTotals& t) const {
  const auto& c = t.counters;
  std::vector<std::pair<std::string, double>> stats = {
      {"samples", static_cast<double>(c.samples)},
      {"samples_emitted", static_cast<double>(c.emitted)},
      {"samples_stored", static_cast<double>(t.samples_stored)},
      {"ringbuf_drops", static_cast<double>(c.ringbuf_drops)},
      {"kstack_errors", static_cast<double>(c.kstack_errors)},
      {"ustack_errors", static_cast<double>(c.ustack_errors)},
      {"copies_skipped", static_cast<double>(c.copies_skipped)},
      {"proc_event_drops", static_cast<double>(c.proc_drops)},
      {"agent_cpu_s", t.agent_cpu_s},
      {"agent_cpu_after_s", t.agent_cpu_after_s},
      {"agent_one_time_s", one_time_total_s_},
      {"budget.share", budget_.budget()},
      {"budget.max_level", static_cast<double>(budget_.max_level())},
      {"budget.steps_down", static_cast<double>(budget_.steps_down())},
      {"budget.useless_steps", static_cast<double>(budget_.useless_steps())},
      {"bpf_run_s", static_cast<double>(c.bpf_run_ns) / 1e9},
      {"sources_kernel_cost_s", static_cast<double>(sources_kernel_cost_ns()) / 1e9},
      {"target_cpu_s", t.target_cpu_s},
      {"wall_s", t.wall_s},
      {"wall_clock_steps", static_cast<double>(clock_watch_.steps)},
      {"wall_clock_offset_s", static_cast<double>(clock_watch_.offset_ns) / 1e9},
  };
  const auto u = normalizer_.unwind_counters();
  for (const auto& [k, v] : std::vector<std::pair<std::string, double>>{
           {"unwind_snapshot_samples", static_cast<double>(u.snapshot_unwinds)},
           {"unwind_snapshot_complete", static_cast<double>(u.snapshot_complete)},
           {"unwind_fp_fallbacks", static_cast<double>(u.fp_fallbacks)},
           {"unwind_fp_chains_cut", static_cast<double>(u.fp_chains_cut)},
           {"unwind_fp_frames_cut", static_cast<double>(u.fp_frames_cut)},
           {"unwind_fp_unchecked", static_cast<double>(u.fp_unchecked)},
           {"maps_rereads", static_cast<double>(u.maps_rereads)},
           {"maps_rereads_refused", static_cast<double>(u.maps_rereads_refused)},
           {"file_cache_prunes", static_cast<double>(u.file_cache_prunes)},
           {"unwind_node_s", static_cast<double>(u.unwind_ns) / 1e9},
           {"unwind_table_bytes", static_cast<double>(u.table_bytes)},
           {"unwind_table_peak_bytes", static_cast<double>(u.table_peak_bytes)},
           {"unwind_table_budget_bytes", static_cast<double>(u.table_budget_bytes)},
           {"unwind_table_builds", static_cast<double>(u.table_builds)},
           {"unwind_table_evictions", static_cast<double>(u.table_evictions)},
           {"python_processes", static_cast<double>(u.python_processes)},
           {"python_frames", static_cast<double>(u.python_frames)},
           {"python_unresolved", static_cast<double>(u.python_unresolved)},
           {"python_samples", static_cast<double>(c.py_samples)},
           {"python_no_thread", static_cast<double>(c.py_no_thread)},
           {"python_read_errors", static_cast<double>(c.py_read_errors)},
           {"snapshot_errors", static_cast<double>(c.snapshot_errors)},
           {"unwind_kernel_walks", static_cast<double>(u.kernel_walks)},
           {"unwind_kernel_complete", static_cast<double>(u.kernel_complete)},
           {"unwind_kernel_modules", static_cast<double>(u.kernel_modules)},
           {"unwind_kernel_rows", static_cast<double>(u.kernel_rows)},
           {"unwind_kernel_table_bytes", static_cast<double>(u.kernel_rows * sizeof(strata_unwind_row))},
           {"unwind_kernel_cfi_bytes", static_cast<double>(u.kernel_cfi_bytes)},
           {"unwind_kernel_refused", static_cast<double>(u.kernel_refused)},
           {"unwind_kernel_mappings_dropped", static_cast<double>(u.kernel_mappings_dropped)},
           {"unwind_kernel_mapping_refused", static_cast<double>(u.kernel_mapping_refused)},
           {"unwind_kernel_table_s", static_cast<double>(u.kernel_table_ns) / 1e9},
           {"unwind_table_build_s", static_cast<double>(u.table_build_ns) / 1e9},
           {"unwind_walk_s", static_cast<double>(u.walk_ns) / 1e9},
           {"bpf_sample_run_s", static_cast<double>(c.bpf_sample_run_ns) / 1e9},
           {"kcfi_frames", static_cast<double>(c.kcfi_frames)},
           {"kcfi_page_index_bytes", static_cast<double>(c.kcfi_pages * sizeof(uint32_t))},
           {"kcfi_fp_frames", static_cast<double>(c.kcfi_fp_frames)}})
    stats.emplace_back(k, v);
  if (c.kcfi_walks > 0) {  // why the kernel's walks stopped (enum strata_kcfi_stop)
    static const char* names[] = {"end", "no_proc", "no_mapping", "no_row", "bad_frame", "read_err", "max_depth"};
    for (size_t i = 0; i < 7; ++i) stats.emplace_back(std::string("kcfi_stop_") + names[i], static_cast<double>(c.kcfi_stops[i]));
  }
  for (size_t i = 0; i < u.stops.size(); ++i) {
    stats.emplace_back(std::string("unwind_stop_") + unwind::stop_reason_name(static_cast<unwind::StopReason>(i)),
                       static_cast<double>(u.stops[i]));
  }
  source_stats(stats);
  return stats;
}

}  // namespace strata::agent
