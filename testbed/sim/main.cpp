// strata-sim: launches N ranks of a training-like job on the testbed's stand-in GPUs, injects one
// fault, prints per-rank step times, and writes the ground truth.
//
//   strata-sim run --ranks N --steps S [--fault KIND[:rank=R,start_step=K,key=value...]]
//                  [--python | --python-exe PY] [--mode ddp|fsdp] [--pp P] [--tp T] [--seed N]
//                  [--truth FILE.json]
//                  [--hang-timeout SEC] [--scale F] [--quiet]
//   strata-sim agents --server URL --nodes N --ranks-per-node R --steps S [--fault KIND:node=K,local_rank=L]
//                  [--same-pids] [--speed F] [--history 1d] [--truth FILE.json] ... (testbed/sim/agents.h)
//
// Exit: 0 ok (a hang fault stopped by the hang timeout is ok), 1 bad usage/spec, 2 environment
// (a fault cannot be set up here), 3 the job failed (a rank died, or an unexpected hang),
// 128+signal when interrupted. Whatever a fault set up is torn down on every path.
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/listen.h"
#include "testbed/common/testbed_env.h"
#include "testbed/sim/agents.h"
#include "testbed/sim/faults.h"
#include "testbed/sim/spec.h"

#ifndef STRATA_SIM_RANK_PY
#define STRATA_SIM_RANK_PY ""
#endif

namespace testbed::sim {
namespace {

// How long strata-sim waits, after a rank fails, for its peers' failures that follow from it
// (a peer's closed connection is seen within milliseconds; a loaded machine may take longer).
constexpr uint64_t kRootCauseGraceNs = 500'000'000;


namespace fs = std::filesystem;

int g_signal_pipe[2] = {-1, -1};
volatile sig_atomic_t g_signal = 0;

void on_signal(int sig) {
  g_signal = sig;
  char c = 1;
  (void)!::write(g_signal_pipe[1], &c, 1);
}

struct StepStat {
  int step;
  double step_ms, load_ms, compute_ms, comm_ms;
  int collectives;  // collective calls the rank made in the step
  double cpu_ms, runq_ms;  // CPU time of the rank's threads, and their run-queue wait
};

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int report_fd = -1;
  std::string partial;  // an unfinished line from the pipe
  std::vector<StepStat> steps;
  std::map<std::string, long> calls;  // API calls and driver-launched kernels the rank made (end of run)
  bool exited = false;
  int status = 0;
};

struct Means {
  int n = 0;
  double step = 0, load = 0, compute = 0, comm = 0, cpu = 0, runq = 0;
};

Means means(const Rank& r, int from, int to) {
  Means m;
  for (const auto& s : r.steps) {
    if (s.step < from || s.step >= to) continue;
    ++m.n;
    m.step += s.step_ms;
    m.load += s.load_ms;
    m.compute += s.compute_ms;
    m.comm += s.comm_ms;
    m.cpu += s.cpu_ms;
    m.runq += s.runq_ms;
  }
  if (m.n > 0) {
    m.step /= m.n;
    m.load /= m.n;
    m.compute /= m.n;
    m.comm /= m.n;
    m.cpu /= m.n;
    m.runq /= m.n;
  }
  return m;
}

std::string exe_dir() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "." : p.parent_path().string();
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    o += c;
  }
  return o;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

class Sim {
 public:
  explicit Sim(Options o) : opts_(std::move(o)) {}

  int run() {
    run_dir_ = testbed_dir() + "/sim-" + std::to_string(::getpid());
    fs::create_directories(run_dir_);
    gpus_ = map_gpu_state();
    if (gpus_ != nullptr) {
      // A fresh node: every device healthy, as many as the job uses.
      gpus_->num_devices = std::max<uint32_t>(gpus_->num_devices, static_cast<uint32_t>(std::min(opts_.ranks, 16)));
      for (int r = 0; r < opts_.ranks; ++r) {
        auto& d = gpus_->dev[r];
        d.hang = 0;
        d.slowdown = 1.0f;
        d.throttle_reasons = 0;
        d.net_rate_bps = 0;
        d.hw_faults = 0;
        d.xid = 0;
      }
    }
    if (!write_data()) return finish(2, "cannot write the data file in " + run_dir_);
    injector_ = std::make_unique<FaultInjector>(opts_, run_dir_, gpus_);
    if (auto st = injector_->prepare(); !st.ok()) {
      return finish(2, "cannot set up fault " + opts_.fault.name + ": " + st.error().message);
    }
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return finish(2, "pipe failed");
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::sigaction(SIGHUP, &sa, nullptr);

    if (!opts_.quiet) print_header();
    start_ns_ = monotonic_ns();
    std::string err = launch_all();
    if (!err.empty()) return finish(2, err);
    if (opts_.fault.kind != FaultKind::kNone && opts_.fault.start_step == 0) activate();
    return finish(supervise(), failure_);
  }

 private:
  bool write_data() {
    // The shared dataset: 8 MiB of seeded bytes, read in 512 KiB batches.
    std::mt19937 rng(opts_.seed);
    std::ofstream out(run_dir_ + "/data.bin", std::ios::binary);
    std::vector<char> block(1 << 20);
    for (int i = 0; i < 8; ++i) {
      for (auto& b : block) b = static_cast<char>(rng());
      out.write(block.data(), static_cast<std::streamsize>(block.size()));
    }
    return static_cast<bool>(out);
  }

  std::string launch_all() {
    int port = strata::free_listen_port();
    if (port < 0) return "no free TCP port for MASTER_PORT";
    std::string lib_dir = fs::weakly_canonical(fs::path(exe_dir()) / ".." / "testbed" / "lib").string();
    std::string rank_bin = exe_dir() + "/strata-sim-rank";
    std::string rank_py = exe_dir() + "/../testbed/sim/rank.py";
    if (!fs::exists(rank_py)) rank_py = STRATA_SIM_RANK_PY;
    std::string python = opts_.python_exe.empty() ? "python3" : opts_.python_exe;
    for (int r = 0; r < opts_.ranks; ++r) {
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) return "pipe failed";
      RankSetup setup = injector_->rank_setup(r);
      std::map<std::string, std::string> env = {
          {"RANK", std::to_string(r)},
          {"LOCAL_RANK", std::to_string(r)},
          {"WORLD_SIZE", std::to_string(opts_.ranks)},
          {"LOCAL_WORLD_SIZE", std::to_string(opts_.ranks)},
          {"MASTER_ADDR", injector_->master_addr()},
          {"MASTER_PORT", std::to_string(port)},
          {"TORCHELASTIC_RUN_ID", "strata-sim-" + std::to_string(::getpid())},
          {"STRATA_SIM_STEPS", std::to_string(opts_.steps)},
          {"STRATA_SIM_MODE", opts_.mode},
          {"STRATA_SIM_PP", std::to_string(opts_.pp)},
          {"STRATA_SIM_TP", std::to_string(opts_.tp)},
          {"STRATA_SIM_SCALE", std::to_string(opts_.scale)},
          {"STRATA_SIM_SEED", std::to_string(opts_.seed)},
          {"STRATA_SIM_DATA", run_dir_ + "/data.bin"},
          {"STRATA_SIM_REPORT_FD", "3"},
          {"STRATA_SIM_DRIVER_API", opts_.driver_api ? "1" : "0"},
          {"STRATA_SIM_MEMORY_CALLS", opts_.memory_calls ? "1" : "0"},
          {"STRATA_TESTBED_DIR", testbed_dir()},
          {"STRATA_TESTBED_LIB", lib_dir},
      };
      for (const auto& [k, v] : setup.env) env[k] = v;
      const char* ld = std::getenv("LD_LIBRARY_PATH");
      env["LD_LIBRARY_PATH"] = lib_dir + (ld && *ld ? ":" + std::string(ld) : "");

      pid_t parent = ::getpid();
      pid_t pid = ::fork();
      if (pid < 0) return "fork failed";
      if (pid == 0) {
        // The child: become the rank. Errors go to stderr and exit 126 (the sim reports them).
        ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);  // never outlive the sim
        if (::getppid() != parent) ::_exit(126);
        ::dup2(fds[1], 3);
        for (const auto& procs : setup.cgroup_procs) {
          int fd = ::open(procs.c_str(), O_WRONLY);
          std::string me = std::to_string(::getpid());
          if (fd < 0 || ::write(fd, me.data(), me.size()) < 0) {
            std::fprintf(stderr, "strata-sim: rank %d cannot join %s: %s\n", r, procs.c_str(), std::strerror(errno));
            ::_exit(126);
          }
          ::close(fd);
        }
        if (!setup.netns.empty()) {
          int fd = ::open(("/run/netns/" + setup.netns).c_str(), O_RDONLY);
          if (fd < 0 || ::setns(fd, CLONE_NEWNET) != 0) {
            std::fprintf(stderr, "strata-sim: rank %d cannot enter netns %s: %s\n", r, setup.netns.c_str(),
                         std::strerror(errno));
            ::_exit(126);
          }
        }
        if (!setup.cpus.empty()) {
          cpu_set_t set;
          CPU_ZERO(&set);
          for (int c : setup.cpus) CPU_SET(c, &set);
          ::sched_setaffinity(0, sizeof(set), &set);
        }
        for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        ::sigaction(SIGINT, &dfl, nullptr);
        ::sigaction(SIGTERM, &dfl, nullptr);
        ::sigaction(SIGHUP, &dfl, nullptr);
        // Ctrl-C reaches the sim, which stops the ranks in order; ranks ignore the terminal's. A
        // session of its own, as a rank started over srun or ssh has: with autogroup scheduling each
        // rank then weighs as much as any other session on the machine, instead of the job's ranks
        // sharing one weight with the shell that started the sim (so a busy machine slows them alike).
        ::setsid();
        if (opts_.python) {
          ::execlp(python.c_str(), python.c_str(), rank_py.c_str(), static_cast<char*>(nullptr));
        } else {
          ::execl(rank_bin.c_str(), "strata-sim-rank", static_cast<char*>(nullptr));
        }
        std::fprintf(stderr, "strata-sim: cannot start rank %d (%s): %s\n", r,
                     opts_.python ? python.c_str() : rank_bin.c_str(), std::strerror(errno));
        ::_exit(127);
      }
      ::close(fds[1]);
      Rank rank;
      rank.rank = r;
      rank.pid = pid;
      rank.report_fd = fds[0];
      ranks_.push_back(rank);
    }
    return "";
  }

  void activate() {
    const FaultSpec& f = opts_.fault;
    std::vector<pid_t> pids;
    for (const auto& r : ranks_) pids.push_back(r.pid);
    injector_->set_rank_pids(pids);
    if (auto st = injector_->activate(ranks_[f.rank].pid); !st.ok()) {
      std::fprintf(stderr, "strata-sim: fault %s could not start: %s\n", f.name.c_str(), st.error().message.c_str());
      activate_error_ = st.error().message;
    }
  }

  void parse_lines(Rank& r, const char* buf, size_t n) {
    r.partial.append(buf, n);
    size_t pos;
    while ((pos = r.partial.find('\n')) != std::string::npos) {
      std::string line = r.partial.substr(0, pos);
      r.partial.erase(0, pos + 1);
      StepStat s{};
      int rank_no = 0;
      if (std::sscanf(line.c_str(), "step %d %d %lf %lf %lf %lf %d %lf %lf", &rank_no, &s.step, &s.step_ms,
                      &s.load_ms, &s.compute_ms, &s.comm_ms, &s.collectives, &s.cpu_ms, &s.runq_ms) >= 6) {
        r.steps.push_back(s);
        last_progress_ns_ = monotonic_ns();
        const FaultSpec& f = opts_.fault;
        if (f.kind != FaultKind::kNone && r.rank == f.rank && s.step == f.start_step - 1) activate();
        continue;
      }
      char name[128];
      long count = 0;
      if (std::sscanf(line.c_str(), "calls %d %127s %ld", &rank_no, name, &count) == 3) r.calls[name] = count;
    }
  }

  // Runs until every rank is done, one fails, a hang, or a signal. Returns the exit code.
  int supervise() {
    last_progress_ns_ = monotonic_ns();
    for (;;) {
      std::vector<pollfd> fds;
      std::vector<Rank*> owners;
      for (auto& r : ranks_) {
        if (r.report_fd >= 0) {
          fds.push_back(pollfd{r.report_fd, POLLIN, 0});
          owners.push_back(&r);
        }
      }
      fds.push_back(pollfd{g_signal_pipe[0], POLLIN, 0});
      ::poll(fds.data(), fds.size(), 200);
      for (size_t i = 0; i + 1 < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        char buf[4096];
        ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
        if (n > 0) {
          parse_lines(*owners[i], buf, static_cast<size_t>(n));
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          ::close(owners[i]->report_fd);
          owners[i]->report_fd = -1;
        }
      }
      if (g_signal != 0) {
        interrupted_ = true;
        failure_ = std::string("interrupted by ") + strsignal(g_signal) + "; stopping the ranks";
        stop_ranks();
        return 128 + g_signal;
      }
      reap(false);
      if (const Rank* failed = first_failure()) {
        // A rank's death makes its peers fail too (a closed connection) within milliseconds: wait that
        // long, then name the rank that died of a signal, the cause, over those that exited after it.
        const uint64_t until = monotonic_ns() + kRootCauseGraceNs;
        while (monotonic_ns() < until && !std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.exited; })) {
          ::usleep(10000);
          reap(false);
        }
        failed = first_failure();
        failure_ = "rank " + std::to_string(failed->rank) + " (pid " + std::to_string(failed->pid) + ") failed: " +
                   describe(failed->status) + "; stopping the other ranks";
        stop_ranks();
        return 3;
      }
      bool all_done = std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.exited; });
      if (all_done) {
        drain();
        return 0;
      }
      double idle_s = static_cast<double>(monotonic_ns() - last_progress_ns_) / 1e9;
      if (idle_s > opts_.hang_timeout_s) {
        stopped_by_hang_ = true;
        stop_ranks();
        if (stops_device(opts_.fault)) {
          note_ = "no step finished for " + num(opts_.hang_timeout_s) + " s after the injected hang; run stopped";
          return 0;
        }
        failure_ = "no rank finished a step for " + num(opts_.hang_timeout_s) + " s (hang); stopped the ranks";
        return 3;
      }
    }
  }

  static std::string describe(int status) {
    if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
    return "status " + std::to_string(status);
  }

  // The rank whose failure to report: one killed by a signal first (the others' failures follow from
  // it), else the first that exited non-zero; nullptr while none failed.
  const Rank* first_failure() const {
    const Rank* exited_badly = nullptr;
    for (const auto& r : ranks_) {
      if (!r.exited || (WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0)) continue;
      if (WIFSIGNALED(r.status)) return &r;
      if (!exited_badly) exited_badly = &r;
    }
    return exited_badly;
  }

  void reap(bool block) {
    for (auto& r : ranks_) {
      if (r.exited) continue;
      int status = 0;
      pid_t p = ::waitpid(r.pid, &status, block ? 0 : WNOHANG);
      if (p == r.pid) {
        r.exited = true;
        r.status = status;
      }
    }
  }

  void drain() {
    for (auto& r : ranks_) {
      if (r.report_fd < 0) continue;
      char buf[4096];
      ssize_t n;
      while ((n = ::read(r.report_fd, buf, sizeof(buf))) > 0) parse_lines(r, buf, static_cast<size_t>(n));
      ::close(r.report_fd);
      r.report_fd = -1;
    }
  }

  // SIGTERM, a grace period, then SIGKILL; every rank reaped.
  void stop_ranks() {
    for (auto& r : ranks_) {
      if (!r.exited) ::kill(r.pid, SIGTERM);
    }
    uint64_t deadline = monotonic_ns() + 2'000'000'000ull;
    while (monotonic_ns() < deadline) {
      reap(false);
      if (std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.exited; })) break;
      ::usleep(20000);
    }
    for (auto& r : ranks_) {
      if (!r.exited) ::kill(r.pid, SIGKILL);
    }
    reap(true);
    drain();
  }

  // Step 0 warms up (connections, first allocations): out of the baseline when there is more.
  static int baseline_from(int fault_from) { return fault_from > 1 ? 1 : 0; }

  void print_header() {
    const FaultSpec& f = opts_.fault;
    std::printf("strata-sim: %d ranks x %d steps (%s, %s ranks)", opts_.ranks, opts_.steps, opts_.mode.c_str(),
                opts_.python ? "python" : "C++");
    if (opts_.pp > 1 || opts_.tp > 1) std::printf(" pp=%d tp=%d dp=%d", opts_.pp, opts_.tp, opts_.ranks / (opts_.pp * opts_.tp));
    if (f.kind == FaultKind::kNone) {
      std::printf(", no fault\n");
    } else {
      std::string where = f.all_ranks ? std::string("every rank") : "rank " + std::to_string(f.rank);
      std::printf(", fault %s on %s from step %d (%s/%s) via %s\n", f.name.c_str(), where.c_str(), f.start_step,
                  fault_layer(f.kind), fault_cause(f), injector_->mechanism().c_str());
    }
    std::fflush(stdout);
  }

  void print_table() {
    int from = opts_.fault.kind == FaultKind::kNone ? 0 : opts_.fault.start_step;
    std::printf("%-5s %-8s %6s %9s %9s %11s %9s %8s %8s   (means over steps %d..%d; baseline step_ms before)\n",
                "rank", "pid", "steps", "step_ms", "load_ms", "compute_ms", "comm_ms", "cpu_ms", "runq_ms", from,
                opts_.steps - 1);
    double lo = 1e30, hi = 0;
    for (const auto& r : ranks_) {
      Means m = means(r, from, opts_.steps);
      Means b = means(r, baseline_from(from), from);
      std::printf("%-5d %-8d %6zu %9.1f %9.1f %11.1f %9.1f %8.1f %8.1f", r.rank, r.pid, r.steps.size(), m.step,
                  m.load, m.compute, m.comm, m.cpu, m.runq);
      if (b.n > 0) std::printf("   (baseline %.1f)", b.step);
      std::printf("\n");
      if (m.n > 0) {
        lo = std::min(lo, m.step);
        hi = std::max(hi, m.step);
      }
    }
    if (hi > 0) std::printf("step time spread across ranks: %.1f%%\n", (hi - lo) / hi * 100);
    std::printf("wall time: %.1f s\n", static_cast<double>(monotonic_ns() - start_ns_) / 1e9);
  }

  bool write_truth(int code) {
    if (opts_.truth_path.empty()) return true;
    const FaultSpec& f = opts_.fault;
    std::ostringstream o;
    o << "{\n  \"fault\": {\"kind\": \"" << f.name << "\"";
    if (f.kind != FaultKind::kNone) {
      o << ", \"scope\": \"" << (f.all_ranks ? "job" : "rank") << "\", \"rank\": " << (f.all_ranks ? -1 : f.rank);
      // Every rank it acts on (slow-cpu: all on the slower core); a finding on any of them locates it.
      if (auto on = injector_->acted_on(opts_.ranks); on.size() > 1) {
        o << ", \"ranks\": [";
        for (size_t i = 0; i < on.size(); ++i) o << (i ? ", " : "") << on[i];
        o << "]";
      }
      o << ", \"layer\": \"" << fault_layer(f.kind) << "\", \"cause\": \""
        << fault_cause(f) << "\", \"culprit\": \"" << json_escape(injector_->culprit())
        << "\", \"start_step\": " << f.start_step << ", \"mechanism\": \"" << json_escape(injector_->mechanism())
        << "\", \"activated\": " << (injector_->active() ? "true" : "false");
      if (!activate_error_.empty()) o << ", \"activation_error\": \"" << json_escape(activate_error_) << "\"";
      o << ", \"params\": {";
      bool first = true;
      for (const auto& [k, v] : f.params) {
        o << (first ? "" : ", ") << "\"" << k << "\": " << v;
        first = false;
      }
      o << "}, \"details\": {";
      first = true;
      for (const auto& [k, v] : injector_->details()) {
        o << (first ? "" : ", ") << "\"" << k << "\": \"" << json_escape(v) << "\"";
        first = false;
      }
      o << "}";
    }
    o << "},\n  \"ranks\": " << opts_.ranks << ", \"steps\": " << opts_.steps << ", \"mode\": \"" << opts_.mode
      << "\", \"pp\": " << opts_.pp << ", \"tp\": " << opts_.tp << ", \"program\": \"" << (opts_.python ? "python" : "cpp") << "\", \"seed\": " << opts_.seed
      << ",\n  \"exit_code\": " << code << ", \"stopped_by_hang_timeout\": " << (stopped_by_hang_ ? "true" : "false")
      << ", \"interrupted\": " << (interrupted_ ? "true" : "false") << ",\n  \"pids\": {";
    for (size_t i = 0; i < ranks_.size(); ++i) {
      o << (i ? ", " : "") << "\"" << ranks_[i].rank << "\": " << ranks_[i].pid;
    }
    o << "},\n  \"per_rank\": [\n";
    int from = f.kind == FaultKind::kNone ? 0 : f.start_step;
    for (size_t i = 0; i < ranks_.size(); ++i) {
      const Rank& r = ranks_[i];
      Means m = means(r, from, opts_.steps), b = means(r, baseline_from(from), from);
      long collectives = 0;
      for (const auto& st : r.steps) collectives += st.collectives;
      o << "    {\"rank\": " << r.rank << ", \"pid\": " << r.pid << ", \"steps_done\": " << r.steps.size()
        << ", \"collectives\": " << collectives << ", \"calls\": {";
      bool first_call = true;
      for (const auto& [name, count] : r.calls) {
        o << (first_call ? "" : ", ") << "\"" << json_escape(name) << "\": " << count;
        first_call = false;
      }
      o << "}"
        << ", \"fault_window\": {\"step_ms\": " << num(m.step) << ", \"load_ms\": " << num(m.load)
        << ", \"compute_ms\": " << num(m.compute) << ", \"comm_ms\": " << num(m.comm)
        << ", \"cpu_ms\": " << num(m.cpu) << ", \"runq_ms\": " << num(m.runq) << "}"
        << ", \"baseline\": {\"step_ms\": " << num(b.step) << ", \"load_ms\": " << num(b.load)
        << ", \"compute_ms\": " << num(b.compute) << ", \"comm_ms\": " << num(b.comm)
        << ", \"cpu_ms\": " << num(b.cpu) << ", \"runq_ms\": " << num(b.runq) << "}"
        << ",\n     \"step_ms\": [";
      for (size_t s = 0; s < r.steps.size(); ++s) o << (s ? "," : "") << num(r.steps[s].step_ms);
      // Per step as well, for medians: one slow step (the machine is shared) must not decide a test.
      o << "],\n     \"steps_detail\": {";
      const std::pair<const char*, double StepStat::*> fields[] = {
          {"load_ms", &StepStat::load_ms}, {"compute_ms", &StepStat::compute_ms}, {"comm_ms", &StepStat::comm_ms},
          {"cpu_ms", &StepStat::cpu_ms},   {"runq_ms", &StepStat::runq_ms}};
      for (size_t fi = 0; fi < std::size(fields); ++fi) {
        o << (fi ? ", " : "") << "\"" << fields[fi].first << "\": [";
        for (size_t s = 0; s < r.steps.size(); ++s) o << (s ? "," : "") << num(r.steps[s].*fields[fi].second);
        o << "]";
      }
      o << "}}" << (i + 1 < ranks_.size() ? "," : "") << "\n";
    }
    o << "  ]\n}\n";
    std::ofstream out(opts_.truth_path);
    out << o.str();
    return static_cast<bool>(out);
  }

  int finish(int code, const std::string& failure) {
    // Ranks first (they may sit in a cgroup or namespace), then what the fault set up.
    if (!ranks_.empty()) stop_ranks();
    if (injector_) injector_->teardown();
    for (const auto& r : ranks_) {
      std::error_code ec;
      fs::remove(timeline_dir() + "/" + std::to_string(r.pid) + ".timeline", ec);
    }
    std::error_code ec;
    fs::remove_all(run_dir_, ec);
    if (!opts_.quiet && !ranks_.empty()) print_table();
    if (!note_.empty()) std::printf("strata-sim: %s\n", note_.c_str());
    std::fflush(stdout);
    if (!write_truth(code)) {
      std::fprintf(stderr, "strata-sim: cannot write %s\n", opts_.truth_path.c_str());
      if (code == 0) code = 2;
    }
    if (!failure.empty()) std::fprintf(stderr, "strata-sim: %s\n", failure.c_str());
    return code;
  }

  Options opts_;
  std::string run_dir_;
  strata_gpu_state* gpus_ = nullptr;
  std::unique_ptr<FaultInjector> injector_;
  std::vector<Rank> ranks_;
  uint64_t start_ns_ = 0;
  uint64_t last_progress_ns_ = 0;
  bool stopped_by_hang_ = false;
  bool interrupted_ = false;
  std::string failure_, note_, activate_error_;
};

}  // namespace
}  // namespace testbed::sim

int main(int argc, char** argv) {
  using namespace testbed::sim;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 3 && args[0] == "__hog") run_hog(std::atoi(args[1].c_str()), std::atoi(args[2].c_str()));
  CLI::App app{"Launches N ranks of a training-like job on the testbed's stand-in GPUs, injects one fault, "
               "prints per-rank step times, and writes the ground truth.",
               "strata-sim"};
  app.footer("Exit codes: 0 ok (a hang fault stopped by the hang timeout is ok), 1 bad usage or spec, 2 environment\n"
             "(a fault cannot be set up here), 3 the job failed (a rank died, or an unexpected hang), 128+signal\n"
             "when interrupted.");
  app.require_subcommand(1);
  CLI::App* run = app.add_subcommand("run", "run the job (strata-sim run --help)");
  RunArgs run_args;
  add_run_options(*run, run_args);
  CLI::App* agents = app.add_subcommand(
      "agents", "N simulated node agents ship a synthetic job (stacks, OS and NVML metrics, steps, collectives, GPU "
                "activity, health) to `strata serve` through the agent's shipper, one agent per node; global rank = "
                "node * R + local rank (strata-sim agents --help)");
  agents->footer("Exit codes: 0 every batch acknowledged, 1 bad usage or spec, 2 the truth file cannot be written,\n"
                 "3 batches left unacknowledged (see --drain-timeout), refused by the collector, or dropped.");
  AgentsArgs agents_args;
  add_agents_options(*agents, agents_args);
  std::reverse(args.begin(), args.end());  // CLI11 takes the arguments last first
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    // A subcommand's help names its parent ("Usage: strata-sim run [OPTIONS]", not "Usage: run").
    std::cout << (run->parsed() ? run->help("strata-sim") : agents->parsed() ? agents->help("strata-sim") : app.help());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string why = e.what();
    // CLI11 checks for the required subcommand before it looks at what it could not place, so
    // `strata-sim --bogus` would answer "A subcommand is required": name what it did not expect.
    if (!run->parsed() && !agents->parsed() && !app.remaining().empty())
      why = CLI::ExtrasError(app.remaining()).what();
    std::replace(why.begin(), why.end(), '\n', ' ');
    std::fprintf(stderr, "strata-sim: %s (see strata-sim --help)\n", why.c_str());
    return 1;
  }
  if (agents->parsed()) return run_agents(agents_args);
  auto opts = finish_run(run_args);
  if (!opts.ok()) {
    std::fprintf(stderr, "strata-sim: %s\n", opts.error().message.c_str());
    return 1;
  }
  // Marks every process this run starts (ranks, hogs), so leftovers can be found by tests.
  ::setenv("STRATA_SIM_PID", std::to_string(::getpid()).c_str(), 1);
  Sim sim(*opts);
  return sim.run();
}
