#include "agent/recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <map>
#include <ostream>
#include <set>
#include <sstream>
#include <unordered_map>

#include "agent/cost_budget.h"
#include "agent/gpu/cupti_env.h"
#include "agent/normalizer.h"
#include "agent/window_profile.h"
#include "agent/limits.h"
#include "agent/privileges.h"
#include "agent/process_info.h"
#include "agent/sources.h"
#include "store/store.h"
#include "symbolize/symbolizer.h"

namespace strata::agent {
namespace {

volatile sig_atomic_t g_stop = 0;
void on_stop_signal(int) { g_stop = 1; }

double cpu_seconds_self() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Finds CMD in PATH as execvp would; empty when it cannot be run.
std::string resolve_command(const std::string& cmd) {
  auto runnable = [](const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
  };
  if (cmd.find('/') != std::string::npos) return runnable(cmd) ? cmd : "";
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    std::string p = (dir.empty() ? "." : dir) + "/" + cmd;
    if (runnable(p)) return p;
  }
  return "";
}

class Recorder final : public EventSink {
 public:
  Recorder(const RecordOptions& opts, std::ostream& log) : opts_(opts), log_(log) {
    node_ = opts.node.empty() ? node_name() : opts.node;
  }

  Result<RecordSummary> run() {
    // Validate everything the user gave before touching the kernel or the store.
    std::string exe;
    if (!opts_.command.empty()) {
      exe = resolve_command(opts_.command[0]);
      if (exe.empty()) return Error{"command not found or not executable: " + opts_.command[0]};
    }
    for (uint32_t pid : opts_.pids) {
      if (!process_exists(pid)) return Error{"no such process: " + std::to_string(pid)};
    }
    if (auto st = check_bpf_permissions(); !st) return st.error().environment();

    auto store = store::Store::open_sqlite(opts_.output, store::Store::Mode::kCreateOrAppend);
    if (!store) return store.error();
    store_ = std::move(*store);

    SamplerOptions so;
    so.frequency_hz = opts_.frequency_hz;
    so.sample_cpu = opts_.layers.count("cpu") > 0;
    auto sampler = OnCpuSampler::start(so);
    if (!sampler) return sampler.error().environment();
    sampler_ = std::move(*sampler);
    normalizer_.set_python_hook([this](uint32_t pid, const strata_py_offsets* o) {
      (void)sampler_->set_python_process(pid, o);  // a full map only costs that process its Python frames
    });
    // Mode 3: the kernel unwinds with CFI from tables the normalizer derives and loads.
    if (sampler_->user_stack_mode() == STRATA_USTACK_KERNEL_CFI) {
      normalizer_.set_kernel_unwind(KernelUnwindHooks{
          [this](const strata_unwind_row* rows, size_t n) { return sampler_->load_unwind_module(rows, n); },
          [this](uint32_t pid, const strata_proc_mappings* m) { (void)sampler_->set_process_mappings(pid, m); }});
    }
    SourceEnv env;
    env.targets_map_fd = sampler_->targets_map_fd();
    env.target_bits_fd = sampler_->target_bits_fd();
    env.normalizer = &normalizer_;
    env.frequency_hz = opts_.frequency_hz;
    auto started = make_sources(opts_.layers, env);
    sources_ = std::move(started.sources);
    for (const auto& w : started.warnings) log_ << "strata: warning: " << w << "\n";
    for (const auto& src : sources_) {
      if (auto st = sampler_->add_wake_fd(src->wake_fd()); !st) return st.error().context(src->name());
    }

    store::RecordingInfo info;
    info.node = node_;
    info.started_ns = unix_now_ns();
    info.sample_hz = opts_.frequency_hz;
    info.window_s = opts_.window_s;
    if (!opts_.command.empty()) {
      for (const auto& a : opts_.command) info.command += (info.command.empty() ? "" : " ") + a;
    } else {
      info.command = "-p";
      for (size_t i = 0; i < opts_.pids.size(); ++i) info.command += (i ? "," : " ") + std::to_string(opts_.pids[i]);
    }
    auto rec = store_->begin_recording(info);
    if (!rec) return rec.error();
    recording_ = *rec;

    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;  // no SA_RESTART: poll returns at once
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);

    for (uint32_t pid : opts_.pids) {
      if (auto st = sampler_->add_target(pid); !st) return st.error().environment();
      see_process(pid, 0, "");
    }
    if (!opts_.command.empty()) {
      if (auto st = spawn(exe); !st) return st.error();
    }
    // Everything privileged at start-up is done: keep only what recording needs (the bounding set
    // stays, so the command above runs with the privileges it would have without strata).
    if (auto dropped = drop_to_runtime_capabilities(/*drop_bounding=*/false); !dropped)
      log_ << "strata: warning: cannot drop capabilities: " << dropped.error().message << "\n";
    return loop();
  }

  void on_sample(const SampleEvent& e) override {
    profile_.add(e);
    threads_.insert((static_cast<uint64_t>(e.pid) << 32) | e.tid);
    if (!known_.count(e.pid)) see_process(e.pid, 0, "");
  }

  void on_proc(const ProcEvent& e) override {
    switch (e.type) {
      case ProcEvent::Type::kFork:
        live_.insert(e.pid);
        see_process(e.pid, e.ppid, e.comm);
        break;
      case ProcEvent::Type::kExec:
        see_process(e.pid, 0, e.comm, /*refresh=*/true);
        normalizer_.learn_process(e.pid);
        break;
      case ProcEvent::Type::kExit:
        refresh_cpu(e.pid);
        live_.erase(e.pid);
        normalizer_.forget_process(e.pid);
        for (auto& src : sources_) src->on_process_exit(e.pid);
        break;
    }
  }

 private:
  void see_process(uint32_t pid, uint32_t ppid, const std::string& comm, bool refresh = false) {
    if (known_.count(pid) && !refresh) return;
    known_.insert(pid);
    live_.insert(pid);
    auto info = read_process_info(pid, node_);
    store::ProcessInfo p;
    if (info) {
      p = *info;
    } else {  // gone already: keep what the kernel told us
      p.pid = pid;
      p.ppid = ppid;
      p.node = node_;
      p.comm = comm;
      p.command = "[" + comm + "]";
      p.start_ns = unix_now_ns();
    }
    pending_processes_[pid] = p;
    for (auto& src : sources_) src->on_process(p);
    if (!cpu_first_.count(pid)) {
      // Processes that existed before the recording count from now; children from zero.
      bool preexisting = std::find(opts_.pids.begin(), opts_.pids.end(), pid) != opts_.pids.end();
      auto cpu = process_cpu_ns(pid);
      cpu_first_[pid] = preexisting && cpu ? *cpu : 0;
      cpu_last_[pid] = cpu ? *cpu : 0;
    }
    if (info) normalizer_.learn_process(pid);
  }

  void refresh_cpu(uint32_t pid) {
    if (auto cpu = process_cpu_ns(pid)) cpu_last_[pid] = *cpu;
  }

  Status spawn(const std::string& exe) {
    int go[2], err[2];
    if (pipe2(go, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return Error::from_errno("pipe", errno);
    // The GPU timing source on real GPUs: CUPTI injected at cuInit (only if the GPU layer is on).
    std::vector<std::string> extra_env;
    if (opts_.layers.count("gpu")) extra_env = cupti_injection_env();
    pid_t pid = fork();
    if (pid < 0) return Error::from_errno("fork", errno);
    if (pid == 0) {
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      char c;
      // Wait until the parent watches us, so the first instructions are sampled too.
      while (read(go[0], &c, 1) < 0 && errno == EINTR) {
      }
      for (const auto& kv : extra_env) putenv(const_cast<char*>(kv.c_str()));
      std::vector<char*> argv;
      for (const auto& a : opts_.command) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(exe.c_str(), argv.data());
      int e = errno;
      (void)!write(err[1], &e, sizeof e);
      _exit(127);
    }
    close(go[0]);
    close(err[1]);
    child_ = pid;
    if (auto st = sampler_->add_target(static_cast<uint32_t>(pid)); !st) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return st.error().environment();
    }
    cpu_first_[static_cast<uint32_t>(pid)] = 0;
    (void)!write(go[1], "g", 1);
    close(go[1]);
    int child_errno = 0;
    ssize_t n;
    while ((n = read(err[0], &child_errno, sizeof child_errno)) < 0 && errno == EINTR) {
    }
    close(err[0]);
    if (n == sizeof child_errno) {
      waitpid(pid, nullptr, 0);
      child_ = -1;
      return Error{"cannot run " + opts_.command[0] + ": " + std::strerror(child_errno)};
    }
    see_process(static_cast<uint32_t>(pid), static_cast<uint32_t>(getpid()), opts_.command[0]);
    return {};
  }

  Result<RecordSummary> loop() {
    using clock = std::chrono::steady_clock;
    auto start = clock::now();
    auto window_start = start;
    auto last_cpu_refresh = start;
    window_start_unix_ = unix_now_ns();
    window_start_mono_ = monotonic_now_ns();
    budget_cpu_mark_ = cpu_seconds_self();
    double cpu0 = cpu_seconds_self();
    bool done = false;
    while (!done) {
      auto n = sampler_->poll(200, *this);
      if (!n) return n.error();
      for (auto& src : sources_) {
        if (auto st = src->poll(); !st) return st.error().context(src->name());
      }
      auto now = clock::now();
      if (g_stop) done = true;
      if (child_ > 0) {
        int status = 0;
        rusage ru{};
        if (wait4(child_, &status, WNOHANG, &ru) == child_) {
          summary_.command_exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          child_cpu_ns_ = (static_cast<uint64_t>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1'000'000ull +
                           static_cast<uint64_t>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec)) * 1000ull;
          child_ = -1;
          done = true;
        }
      }
      if (now - last_cpu_refresh >= std::chrono::seconds(1)) {
        last_cpu_refresh = now;
        for (auto it = live_.begin(); it != live_.end();) {
          if (!process_exists(*it)) {
            it = live_.erase(it);
            continue;
          }
          refresh_cpu(*it);
          ++it;
        }
        if (opts_.command.empty() && live_.empty()) done = true;
      }
      if (opts_.duration_s > 0 && std::chrono::duration<double>(now - start).count() >= opts_.duration_s) done = true;
      // A window also closes when it holds kMaxWindowStacks distinct stacks: memory stays bounded.
      if (std::chrono::duration<double>(now - window_start).count() >= opts_.window_s ||
          profile_.distinct_stacks() >= kMaxWindowStacks) {
        if (auto st = flush_window(); !st) return st.error();
        window_start = now;
      }
    }
    // Take what the kernel already produced, then close the last window.
    for (int i = 0; i < 3; ++i) {
      auto n = sampler_->poll(0, *this);
      if (!n || *n == 0) break;
    }
    for (uint32_t pid : live_) refresh_cpu(pid);
    summary_.agent_cpu_s = cpu_seconds_self() - cpu0;
    double cpu_end_of_run = cpu_seconds_self();
    summary_.wall_s = std::chrono::duration<double>(clock::now() - start).count();
    if (auto st = flush_window(); !st) return st.error();
    if (auto st = store_->begin(); !st) return st.error();
    if (auto st = symbolize_new_frames(); !st) return st.error();
    if (auto st = store_->commit(); !st) return st.error();
    summary_.agent_cpu_after_s = cpu_seconds_self() - cpu_end_of_run;

    summary_.counters = sampler_->counters();
    uint64_t target_ns = 0;
    for (auto& [pid, first] : cpu_first_) target_ns += cpu_last_[pid] > first ? cpu_last_[pid] - first : 0;
    if (child_cpu_ns_ > target_ns) target_ns = child_cpu_ns_;  // rusage also counts reaped descendants
    summary_.target_cpu_s = static_cast<double>(target_ns) / 1e9;
    summary_.processes = known_.size();
    summary_.threads = threads_.size();
    const auto& c = summary_.counters;
    if (auto st = store_->begin(); !st) return st.error();
    std::vector<std::pair<std::string, double>> stats = {
        {"samples", static_cast<double>(c.samples)},
        {"samples_emitted", static_cast<double>(c.emitted)},
        {"samples_stored", static_cast<double>(summary_.samples_stored)},
        {"ringbuf_drops", static_cast<double>(c.ringbuf_drops)},
        {"kstack_errors", static_cast<double>(c.kstack_errors)},
        {"ustack_errors", static_cast<double>(c.ustack_errors)},
        {"proc_event_drops", static_cast<double>(c.proc_drops)},
        {"agent_cpu_s", summary_.agent_cpu_s},
        {"agent_cpu_after_s", summary_.agent_cpu_after_s},
        {"budget.share", budget_.budget()},
        {"budget.max_level", static_cast<double>(budget_.max_level())},
        {"budget.steps_down", static_cast<double>(budget_.steps_down())},
        {"bpf_run_s", static_cast<double>(c.bpf_run_ns) / 1e9},
        {"target_cpu_s", summary_.target_cpu_s},
        {"wall_s", summary_.wall_s},
        {"wall_clock_steps", static_cast<double>(clock_watch_.steps)},
        {"wall_clock_offset_s", static_cast<double>(clock_watch_.offset_ns) / 1e9},
    };
    const auto u = normalizer_.unwind_counters();
    for (const auto& [k, v] : std::vector<std::pair<std::string, double>>{
             {"unwind_snapshot_samples", static_cast<double>(u.snapshot_unwinds)},
             {"unwind_snapshot_complete", static_cast<double>(u.snapshot_complete)},
             {"unwind_fp_fallbacks", static_cast<double>(u.fp_fallbacks)},
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
    for (const auto& src : sources_) src->stats(stats);
    for (const auto& [k, v] : stats) {
      if (auto st = store_->put_stat(recording_, k, v); !st) return st.error();
    }
    if (auto st = store_->end_recording(recording_, unix_now_ns()); !st) return st.error();
    if (auto st = store_->commit(); !st) return st.error();
    return summary_;
  }

  Status flush_window() {
    uint64_t end_unix = unix_now_ns();
    clock_watch_.look();  // the window's times come from the timeline, whatever the wall clock did
    if (auto st = store_->begin(); !st) return st;
    for (const auto& [pid, p] : pending_processes_) {
      if (auto st = store_->put_process(recording_, p); !st) return st;
    }
    pending_processes_.clear();
    auto written = profile_.write(*store_, recording_, window_start_unix_, end_unix);
    if (!written) return written.error();
    stored_stacks_.insert(written->stack_ids.begin(), written->stack_ids.end());
    summary_.samples_stored += written->samples;
    if (written->samples > 0) summary_.windows++;
    WindowContext ctx;
    ctx.recording = recording_;
    ctx.start_ns = window_start_unix_;
    ctx.end_ns = end_unix;
    ctx.mono_start_ns = window_start_mono_;
    ctx.mono_end_ns = monotonic_now_ns();
    for (auto& src : sources_) {
      if (auto st = src->flush(*store_, ctx); !st) return st.error().context(src->name());
    }
    apply_budget(ctx);
    // Symbolizing loads symbol tables (a one-time cost per build id): during the run only when
    // asked, else once at the end, off the target's time.
    if (opts_.symbolize_each_window) {
      if (auto st = symbolize_new_frames(); !st) return st;
    }
    if (auto st = store_->commit(); !st) return st;
    summary_.distinct_stacks = stored_stacks_.size();
    window_start_unix_ = end_unix;
    window_start_mono_ = ctx.mono_end_ns;
    return {};
  }

  // Compares this window's agent cost with the targets' CPU and steps the unwinding method and the
  // sampling rate down or up (agent/cost_budget.h). Recorded as per-window metrics of the node.
  void apply_budget(const WindowContext& ctx) {
    double cpu = cpu_seconds_self();
    double bpf = static_cast<double>(sampler_->counters().bpf_run_ns) / 1e9;
    uint64_t target_ns = 0;
    for (auto& [pid, first] : cpu_first_) target_ns += cpu_last_[pid] > first ? cpu_last_[pid] - first : 0;
    double cost = (cpu - budget_cpu_mark_) + (bpf - budget_bpf_mark_);
    double target = static_cast<double>(target_ns - std::min(target_ns, budget_target_mark_)) / 1e9;
    budget_cpu_mark_ = cpu;
    budget_bpf_mark_ = bpf;
    budget_target_mark_ = target_ns;
    int before = budget_.level();
    double wall = static_cast<double>(ctx.mono_end_ns - ctx.mono_start_ns) / 1e9;
    int level = budget_.update(cost, target, wall);
    if (level != before) {
      normalizer_.set_snapshot_unwinding(level == CostBudget::kFull);
      (void)sampler_->set_frequency(CostBudget::rate_at(level, opts_.frequency_hz));
      log_ << "strata: cost " << budget_.last_share() * 100 << "% of the targets' CPU (budget "
           << budget_.budget() * 100 << "%): " << (level > before ? "stepping down" : "stepping up") << " to level "
           << level << " (" << CostBudget::rate_at(level, opts_.frequency_hz) << " Hz, "
           << (level == CostBudget::kFull ? "CFI unwinding" : "frame pointers") << ")\n";
    }
    std::vector<store::Metric> m = {{0, "agent.cost_share", "", budget_.last_share()},
                                    {0, "agent.budget_level", "", static_cast<double>(level)}};
    (void)store_->put_metrics(recording_, ctx.start_ns, ctx.end_ns, m);
  }

  Status symbolize_new_frames() {
    auto frames = store_->unsymbolized_frames();
    if (!frames) return frames.error();
    if (frames->empty()) return {};
    std::vector<Frame> fs;
    fs.reserve(frames->size());
    for (auto& r : *frames) fs.push_back(r.frame);
    symbolizer_->symbolize(fs);
    for (size_t i = 0; i < fs.size(); ++i) (*frames)[i].frame = std::move(fs[i]);
    return store_->update_frame_symbols(*frames);
  }

  CostBudget budget_;
  double budget_cpu_mark_ = 0, budget_bpf_mark_ = 0;
  uint64_t budget_target_mark_ = 0;

  RecordOptions opts_;
  std::ostream& log_;
  std::string node_;
  std::unique_ptr<store::Store> store_;
  std::unique_ptr<OnCpuSampler> sampler_;
  std::unique_ptr<symbolize::Symbolizer> symbolizer_ = symbolize::make_caching_symbolizer();
  Normalizer normalizer_{opts_.unwind_table_bytes};  // after opts_
  int64_t recording_ = 0;
  pid_t child_ = -1;
  uint64_t child_cpu_ns_ = 0;
  uint64_t window_start_unix_ = 0;
  uint64_t window_start_mono_ = 0;
  WallClockWatch clock_watch_;
  std::vector<std::unique_ptr<Source>> sources_;

  std::set<uint32_t> known_;
  std::set<uint32_t> live_;
  std::set<uint64_t> threads_;
  std::set<int64_t> stored_stacks_;
  std::map<uint32_t, store::ProcessInfo> pending_processes_;
  std::unordered_map<uint32_t, uint64_t> cpu_first_, cpu_last_;

  WindowProfile profile_{normalizer_};  // after normalizer_
  RecordSummary summary_;
};

}  // namespace

Result<RecordSummary> run_record(const RecordOptions& opts, std::ostream& log) {
  Recorder r(opts, log);
  return r.run();
}

void print_summary(const RecordSummary& s, const std::string& output, std::ostream& out) {
  const auto& c = s.counters;
  out << "strata: " << s.samples_stored << " samples from " << s.processes << " process(es), " << s.threads
      << " thread(s), " << s.distinct_stacks << " distinct stacks, " << s.windows << " window(s) -> " << output
      << "\n";
  uint64_t lost = c.ringbuf_drops;
  out << "strata: lost " << lost << " samples (ring buffer full: " << c.ringbuf_drops
      << "); incomplete stacks: kernel " << c.kstack_errors << ", user " << c.ustack_errors << "\n";
  double bpf_s = static_cast<double>(c.bpf_run_ns) / 1e9;
  out << std::fixed << std::setprecision(3) << "strata: agent CPU " << s.agent_cpu_s * 1000 << " ms + BPF "
      << bpf_s * 1000 << " ms" << (c.bpf_stats ? "" : " (BPF stats unavailable)");
  if (s.target_cpu_s > 0) {
    out << " = " << std::setprecision(3) << 100.0 * (s.agent_cpu_s + bpf_s) / s.target_cpu_s
        << "% of the target's " << std::setprecision(2) << s.target_cpu_s << " s CPU";
  }
  out << " (wall " << std::setprecision(1) << s.wall_s << " s; then " << std::setprecision(0)
      << s.agent_cpu_after_s * 1000 << " ms to close the last window and symbolize)\n";
}

}  // namespace strata::agent
