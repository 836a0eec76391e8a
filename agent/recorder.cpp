#include "agent/recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "agent/capture.h"
#include "agent/gpu/cupti_env.h"
#include "agent/pipeline.h"
#include "agent/privileges.h"
#include "agent/process_info.h"
#include "store/store.h"

namespace strata::agent {
namespace {

volatile sig_atomic_t g_stop = 0;
void on_stop_signal(int) { g_stop = 1; }

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

// `strata record` is the node pipeline with the SQLite store as its sink, watching the command it
// starts (or the pids it is given) until they end.
class Recorder {
 public:
  Recorder(const RecordOptions& opts, std::ostream& log)
      : opts_(opts), log_(log), pipeline_(pipeline_options(opts, &tape_), log) {}

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
    if (!opts_.save_events.empty()) {
      CaptureHeader h;
      h.node = opts_.node.empty() ? node_name() : opts_.node;
      h.frequency_hz = opts_.frequency_hz;
      h.window_s = opts_.window_s;
      h.layers = opts_.layers;
      h.raw_device_records = true;  // as pipeline_options() leaves it
      h.unwind_table_bytes = opts_.unwind_table_bytes;
      auto w = CaptureWriter::create(opts_.save_events, h);
      if (!w) return w.error();
      capture_ = std::move(*w);
      tape_ = Tape(capture_.get());
    }
    if (auto st = pipeline_.start(); !st) return st.error();

    std::string command;
    if (!opts_.command.empty()) {
      for (const auto& a : opts_.command) command += (command.empty() ? "" : " ") + a;
    } else {
      command = "-p";
      for (size_t i = 0; i < opts_.pids.size(); ++i) command += (i ? "," : " ") + std::to_string(opts_.pids[i]);
    }
    if (auto st = pipeline_.begin(*store_, command); !st) return st.error();

    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;  // no SA_RESTART: poll returns at once
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);

    for (uint32_t pid : opts_.pids) {
      if (auto st = pipeline_.watch(pid, /*preexisting=*/true); !st) return st.error();
    }
    if (!opts_.command.empty()) {
      if (auto st = spawn(exe); !st) return st.error();
    }
    // Everything privileged at start-up is done, and no thread has started yet: keep only what
    // recording needs, bounding set included. The command was forked above with this process's
    // privileges, so it runs as it would without strata.
    pipeline_.drop_privileges_and_start_threads();
    return loop();
  }

 private:
  static PipelineOptions pipeline_options(const RecordOptions& o, Tape* tape) {
    PipelineOptions p;
    p.tape = tape;
    p.node = o.node;
    p.frequency_hz = o.frequency_hz;
    p.budget_share = o.budget_share;
    p.window_s = o.window_s;
    p.layers = o.layers;
    p.unwind_table_bytes = o.unwind_table_bytes;
    p.symbolize_each_window = o.symbolize_each_window;
    return p;
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
    if (auto st = pipeline_.add_target(static_cast<uint32_t>(pid)); !st) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return st.error();
    }
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
    pipeline_.announce(static_cast<uint32_t>(pid), static_cast<uint32_t>(getpid()), opts_.command[0],
                       /*preexisting=*/false);
    return {};
  }

  // True when the command has ended (and is reaped).
  bool reap_child() {
    if (child_ <= 0) return false;
    int status = 0;
    rusage ru{};
    if (wait4(child_, &status, WNOHANG, &ru) != child_) return false;
    summary_.command_exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    summary_.command_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    pipeline_.note_reaped_cpu_ns(
        (static_cast<uint64_t>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1'000'000ull +
         static_cast<uint64_t>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec)) * 1000ull);
    child_ = -1;
    return true;
  }

  Result<RecordSummary> loop() {
    bool done = false;
    while (!done) {
      if (auto st = pipeline_.step(200); !st) return st.error();
      done = g_stop || reap_child() || (opts_.command.empty() && pipeline_.live_processes() == 0) ||
             (opts_.duration_s > 0 && pipeline_.elapsed_s() >= opts_.duration_s);
    }
    auto t = pipeline_.finish();
    if (!t) return t.error();
    if (capture_) {
      // The recording is whole either way; an incomplete capture is said, not fatal.
      if (auto st = capture_->close(); !st)
        log_ << "strata: warning: --save-events " << opts_.save_events << ": " << st.error().message << "\n";
      else
        log_ << "strata: events saved to " << opts_.save_events << " (" << capture_->bytes() << " bytes before compression)\n";
    }
    summary_.counters = t->counters;
    summary_.samples_stored = t->samples_stored;
    summary_.windows = t->windows_with_samples;
    summary_.processes = t->processes;
    summary_.threads = t->threads;
    summary_.distinct_stacks = t->distinct_stacks;
    summary_.agent_cpu_s = t->agent_cpu_s;
    summary_.agent_cpu_after_s = t->agent_cpu_after_s;
    summary_.target_cpu_s = t->target_cpu_s;
    summary_.wall_s = t->wall_s;
    summary_.sources_kernel_s = t->sources_kernel_s;
    return summary_;
  }

  RecordOptions opts_;
  std::ostream& log_;
  std::unique_ptr<store::Store> store_;  // the sink: declared first, so it outlives the pipeline
  std::unique_ptr<CaptureWriter> capture_;  // --save-events; with the tape, outlives the pipeline
  Tape tape_;                               // live; writing to capture_ when there is one
  NodePipeline pipeline_;
  pid_t child_ = -1;
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
  // The whole kernel side: the sampler's BPF programs, the other layers' and their uprobe traps.
  double bpf_s = static_cast<double>(c.bpf_run_ns) / 1e9 + s.sources_kernel_s;
  out << std::fixed << std::setprecision(3) << "strata: agent CPU " << s.agent_cpu_s * 1000 << " ms + BPF "
      << bpf_s * 1000 << " ms" << (c.bpf_stats ? "" : " (BPF stats unavailable)");
  if (s.target_cpu_s > 0) {
    out << " = " << percent((s.agent_cpu_s + bpf_s) / s.target_cpu_s) << " of the target's "
        << std::setprecision(2) << s.target_cpu_s << " s CPU";
  }
  out << " (wall " << std::setprecision(1) << s.wall_s << " s; then " << std::setprecision(0)
      << s.agent_cpu_after_s * 1000 << " ms to close the last window and symbolize)\n";
}

}  // namespace strata::agent
