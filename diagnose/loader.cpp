#include "diagnose/loader.h"
#include "diagnose/peer_groups.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "diagnose/baseline.h"
#include "diagnose/engine.h"
#include "diagnose/stats.h"

namespace strata::diagnose {

namespace {

constexpr double kNsPerMs = 1e6;

double ms_of(uint64_t ns) { return static_cast<double>(ns) / kNsPerMs; }

// A process: (node, pid). Pids repeat across nodes (and ranks in containers often have identical
// pids), so every join of rows to ranks is by both; a restarted rank's new process is told apart
// by which process the loader picked per rank (the latest start).
// The node is a view of a string the load holds while the key is in use (a row's, a process
// record's or a rank's, none of which move during a load): the loops below
// look a process up once per row, millions of times in a round at 8,000 ranks (with copies of the
// node's name, and a std::map of the same in peer_groups, a load over 3.7M held rows took 1.20 s;
// 0.86 s without: bench/load_window.cpp).
struct Proc {
  std::string_view node;
  uint32_t pid = 0;
  bool operator==(const Proc& o) const { return pid == o.pid && node == o.node; }
};
struct ProcHash {
  size_t operator()(const Proc& p) const { return std::hash<std::string_view>{}(p.node) * 31 + p.pid; }
};
template <typename V>
using ByProc = std::unordered_map<Proc, V, ProcHash>;

struct RankSource {
  store::ProcessInfo proc;
  std::vector<store::StepRecord> steps;  // after warm-up, in order
  size_t all_steps = 0;
  uint64_t first_step_ns = 0;  // its first step's start, warm-up steps included (0: no step)
  // How much longer its warm-up steps took than its first steps after them (their median): the
  // part of them that is start-up (first allocations, a compile), not the job's own pace.
  uint64_t warmup_excess_ns = 0;
};

// The first steps after warm-up whose median is a rank's pace when its warm-up is weighed.
constexpr size_t kPaceSteps = 10;

PhaseStats phase(const std::vector<store::StepRecord>& steps, size_t from, size_t to) {
  PhaseStats p;
  to = std::min(to, steps.size());
  if (from >= to) return p;
  std::vector<double> dur;
  double wait = 0, dev = 0, idle = 0;
  size_t dev_n = 0;
  for (size_t i = from; i < to; ++i) {
    const auto& s = steps[i];
    dur.push_back(ms_of(s.end_ns - s.start_ns));
    // Device time of collective kernels is the wait for peers; the host's time in the call also
    // holds its own queued compute, so it is the fallback only.
    wait += ms_of(s.device_known ? s.device_collective_ns : s.collective_ns);
    if (s.device_known) {
      dev += ms_of(s.device_compute_ns);
      idle += ms_of(s.gpu_idle_ns);
      ++dev_n;
    }
  }
  double n = static_cast<double>(to - from);
  p.steps = static_cast<uint32_t>(to - from);
  p.step_ms = median(dur);
  p.step_mad_ms = robust_sigma(dur, p.step_ms);
  p.wait_ms = wait / n;
  if (dev_n == to - from) {
    p.device_compute_ms = dev / n;
    p.gpu_idle_ms = idle / n;
  }
  return p;
}

// Steps [from, to) as points of the rank's series: the latest kMaxSeriesStepsPerPhase of them.
void append_series(std::vector<StepPoint>& out, const std::vector<store::StepRecord>& steps, size_t from, size_t to,
                   bool in_window) {
  to = std::min(to, steps.size());
  from = std::max(from, to > kMaxSeriesStepsPerPhase ? to - kMaxSeriesStepsPerPhase : 0);
  for (size_t i = from; i < to; ++i) {
    const auto& s = steps[i];
    StepPoint p;
    p.step_ms = static_cast<float>(ms_of(s.end_ns - s.start_ns));
    // As phase() counts it: device time of collective kernels when known, else the host's.
    p.wait_ms = static_cast<float>(ms_of(s.device_known ? s.device_collective_ns : s.collective_ns));
    if (s.device_known) {
      p.device_compute_ms = static_cast<float>(ms_of(s.device_compute_ns));
      p.gpu_idle_ms = static_cast<float>(ms_of(s.gpu_idle_ns));
    }
    p.in_window = in_window;
    out.push_back(p);
  }
}

// The system call a kernel frame enters ("__x64_sys_pread64" -> "pread64()"), else empty. Some
// entries are tail calls that leave no __x64_sys_ frame (preadv enters as do_preadv, read as
// ksys_read): their helpers name the call too. A page fault's entry is named as a call too
// (kPageFaultCall): a thread blocked in one waits for memory it touched, not for a call it made.
std::string syscall_of(const std::string& fn) {
  for (std::string_view entry : {"asm_exc_page_fault", "exc_page_fault", "do_page_fault", "do_mem_abort"}) {
    if (fn == entry) return kPageFaultCall;
  }
  for (const char* prefix : {"__x64_sys_", "__arm64_sys_", "__se_sys_", "ksys_"}) {
    std::string p = prefix;
    if (fn.rfind(p, 0) == 0) return fn.substr(p.size()) + "()";
  }
  static const std::pair<std::string_view, std::string_view> kHelpers[] = {
      {"do_preadv", "preadv()"}, {"do_pwritev", "pwritev()"}, {"do_readv", "readv()"},
      {"do_writev", "writev()"}, {"do_sys_openat2", "openat()"}, {"do_fsync", "fsync()"}};
  for (const auto& [helper, call] : kHelpers) {
    if (fn == helper) return std::string(call);
  }
  return {};
}

// A Python function is one function whatever line runs: keyed by file and function
// ("rank.py:slow_augment"; the line is not part of it), so the same name in two files is two
// functions. A frame whose code object could not be read stays "[unknown]". Native frames: their
// display name.
std::string python_key(const Frame& f) {
  if (f.kind != FrameKind::kPython || f.function.empty()) return f.display_name();
  if (f.function == "[unknown]" || f.file.empty()) return f.function;
  auto slash = f.file.rfind('/');
  return f.file.substr(slash == std::string::npos ? 0 : slash + 1) + ":" + f.function;
}

// A Python source file installed with the interpreter or a package, not the program's own: the
// standard library ("/usr/lib/python3.11/...", a virtualenv's or conda's ".../lib/python3.10/..."),
// packages ("site-packages", Debian's "dist-packages") and the interpreter's frozen modules
// ("<frozen runpy>").
bool python_library_file(std::string_view file) {
  for (std::string_view dir : {"/site-packages/", "/dist-packages/", "/lib/python2", "/lib/python3"}) {
    if (file.find(dir) != std::string_view::npos) return true;
  }
  return file.rfind("<frozen ", 0) == 0;
}

// The CUDA runtime's own libraries (runtime and driver API, by file name): a memory call's frames
// inside them are the call itself, not where the program makes it.
bool cuda_runtime_module(std::string_view module) {
  auto slash = module.rfind('/');
  std::string_view base = module.substr(slash == std::string_view::npos ? 0 : slash + 1);
  for (std::string_view lib : {"libcudart.so", "libcuda.so"}) {
    if (base.substr(0, lib.size()) == lib) return true;
  }
  return false;
}

// A user-level call path, root first: kernel frames say how the thread waited, not where the
// program's time went, and the uprobe trampoline is strata's own. Off-CPU paths keep the system
// call, since a blocked thread's user stack may be missing. With `job`, the path's names that are
// Python functions and frames of the CUDA runtime go into its sets (JobWindow::python_functions,
// cuda_runtime_frames): a path is names only, and only the frame's module says the second.
std::string call_path(const Stack& stack, bool keep_syscall, JobWindow* job) {
  std::string path;
  std::string last_call;
  for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
    if (it->kind == FrameKind::kKernel) {
      std::string sc = keep_syscall ? syscall_of(it->function) : std::string();
      if (sc.empty() || last_call == sc) continue;  // one entry per call (x86's fault has two frames)
      if (!path.empty()) path += ';';
      path += sc;
      last_call = sc;
      continue;
    }
    if (it->module.rfind("[uprobes", 0) == 0) continue;
    std::string name = python_key(*it);
    for (char& ch : name) {
      if (ch == ';') ch = ':';
    }
    if (job && it->kind == FrameKind::kPython && !unresolved_frame(name)) {
      job->python_functions.insert(name);
      if (python_library_file(it->file)) job->python_library_functions.insert(name);
    }
    if (job && it->kind == FrameKind::kNative)
      (cuda_runtime_module(it->module) ? job->cuda_runtime_frames : job->frames_outside_runtime).insert(name);
    if (!path.empty()) path += ';';
    path += name;
    last_call.clear();
  }
  return path.empty() ? "[kernel]" : path;
}

// glibc's shared object ("/lib/x86_64-linux-gnu/libc.so.6", or an older "libc-2.31.so"): its
// frames are the call's wrapper, not where the program makes the call.
bool libc_module(std::string_view module) {
  return module.find("/libc.so") != std::string_view::npos || module.find("/libc-") != std::string_view::npos;
}

// For an on-CPU stack inside a system call: "pread64()|main;load_batch", the call and the user
// frames (root first) down to the function that made it, else empty. The caller is the deepest
// Python frame when the stack has one (the interpreter's own C frames are not where the program
// reads), else the deepest native frame that is not libc's wrapper or strata's uprobe trampoline.
std::string syscall_caller(const Stack& stack) {
  std::string sc;
  size_t i = 0;
  for (; i < stack.size() && stack[i].kind == FrameKind::kKernel; ++i) {
    // A fault inside a system call (copying to the user's buffer) is in that call.
    if (sc.empty() || sc == kPageFaultCall) {
      std::string s = syscall_of(stack[i].function);
      if (!s.empty()) sc = s;
    }
  }
  if (sc.empty()) return {};
  size_t native = stack.size(), python = stack.size();
  for (size_t k = i; k < stack.size(); ++k) {
    const Frame& f = stack[k];
    if (f.kind == FrameKind::kPython) {
      if (python == stack.size() && !f.function.empty()) python = k;
      continue;
    }
    if (native != stack.size() || f.kind == FrameKind::kKernel || f.module.rfind("[uprobes", 0) == 0) continue;
    if (!libc_module(f.module) && f.function.rfind("__", 0) != 0) native = k;
  }
  size_t caller = python != stack.size() ? python : native;
  if (caller == stack.size()) return {};
  std::string path;
  for (size_t k = stack.size(); k-- > caller;) {
    const Frame& f = stack[k];
    if (f.kind == FrameKind::kKernel || f.module.rfind("[uprobes", 0) == 0) continue;
    if (python != stack.size() && f.kind != FrameKind::kPython) continue;  // the Python program's frames only
    std::string name = python_key(f);
    for (char& ch : name) {
      if (ch == ';' || ch == '|') ch = ':';
    }
    path += (path.empty() ? "" : ";") + name;
  }
  return sc + "|" + path;
}

// The stacks of one kind over one span for every process at once, read once per load and shared
// by the ranks (issue 16). Read rank by rank, each query picked the span's windows of every node and
// probed each for the rank's pid: a load's profile reads grew with ranks x nodes, 85% of a
// 1,600-rank round's time (perf, `strata diagnose --last 80s` on a 200 x 8 store: 18 s), and at
// 8,000 ranks a round outlasted the run. One query per (span, kind) returns the same rows (its
// grouping keeps node and pid apart) and the same span, indexed here by process: the reader must
// name each sample's node (SQLite and ClickHouse do; the remote reader, which fetches one process's
// profile through the query API, is not one the loader reads).
struct SpanProfile {
  Profile prof;
  ByProc<std::vector<uint32_t>> by_proc;  // indices into prof.samples
  const std::vector<uint32_t>& samples_of(const std::string& node, uint32_t pid) const {
    static const std::vector<uint32_t> kNone;
    auto it = by_proc.find({node, pid});
    return it == by_proc.end() ? kNone : it->second;
  }
};

class ProfileCache {
 public:
  explicit ProfileCache(store::Reader& s) : s_(s) {}
  // `f` names a span, a recording and a kind, and may name a node (then the profile is that node's
  // processes': a span that is one node's own windows, as the past's is); never a process (the
  // profile is every process's).
  Result<const SpanProfile*> get(const store::ProfileFilter& f) {
    Key key{f.from_ns, f.to_ns, f.recording, static_cast<int>(f.kind), f.node};
    if (auto it = by_key_.find(key); it != by_key_.end()) return it->second.get();
    store::ProfileFilter all = f;
    all.pid.reset();
    all.tid.reset();
    all.rank.reset();
    auto prof = s_.load_profile(all);
    if (!prof) return prof.error();
    return (by_key_[key] = indexed(std::move(*prof))).get();
  }

  // Reads the profiles of `fs` not read yet in one go (store::Reader::load_profiles): the past of
  // every node of a job, which get() then finds here. Each as get() would read it.
  Status prefetch(const std::vector<store::ProfileFilter>& fs) {
    std::vector<store::ProfileFilter> missing;
    std::set<Key> asked;
    for (const auto& f : fs) {
      Key key{f.from_ns, f.to_ns, f.recording, static_cast<int>(f.kind), f.node};
      if (by_key_.count(key) || !asked.insert(key).second) continue;
      store::ProfileFilter all = f;
      all.pid.reset();
      all.tid.reset();
      all.rank.reset();
      missing.push_back(std::move(all));
    }
    if (missing.size() < 2) return {};  // get() reads it when asked
    auto profs = s_.load_profiles(missing);
    if (!profs) return profs.error();
    for (size_t i = 0; i < missing.size(); ++i) {
      const auto& f = missing[i];
      by_key_[Key{f.from_ns, f.to_ns, f.recording, static_cast<int>(f.kind), f.node}] = indexed(std::move((*profs)[i]));
    }
    return {};
  }

 private:
  static std::unique_ptr<SpanProfile> indexed(Profile&& prof) {
    auto sp = std::make_unique<SpanProfile>();
    sp->prof = std::move(prof);
    for (size_t i = 0; i < sp->prof.samples.size(); ++i) {
      const auto& smp = sp->prof.samples[i];
      sp->by_proc[{smp.node, smp.pid}].push_back(static_cast<uint32_t>(i));
    }
    return sp;
  }

  using Key = std::tuple<std::optional<uint64_t>, std::optional<uint64_t>, std::optional<int64_t>, int, std::optional<std::string>>;
  store::Reader& s_;
  std::map<Key, std::unique_ptr<SpanProfile>> by_key_;
};

// What a read of a profile fills: the per-function times, the system calls' callers, or both.
enum class ProfileUse { kAll, kTimes, kCallers };

// `span`: what is read (the recording, and the time span asked for).
// `before_ns`: only the windows that end by then (the job's healthy past, into `past`); a window
// that reaches past it holds the window being diagnosed too, and is no past.
// `pid`: the rank's, or one of its workers' on the rank's node (then every path is rooted at
// kWorkerFrame).
Status load_profile(ProfileCache& profiles, const store::RowQuery& span, JobWindow& job, RankWindow& r, store::CountKind kind,
                    double steps, const std::vector<store::StepRecord>& rank_steps, Stats* stats,
                    std::optional<uint64_t> before_ns = std::nullopt, RankPast* past = nullptr, uint32_t pid = 0,
                    ProfileUse use = ProfileUse::kAll) {
  const bool worker = pid != 0 && pid != r.pid;
  const std::string root = worker ? std::string(kWorkerFrame) + ";" : std::string();
  store::ProfileFilter f;
  f.from_ns = span.from_ns;
  f.to_ns = span.to_ns;
  if (before_ns && (!f.to_ns || *before_ns < *f.to_ns)) f.to_ns = before_ns;
  f.recording = span.recording;
  f.kind = kind;
  // The past is a span of the rank's own node's windows (other nodes' windows start elsewhere):
  // read that node's stacks only, so a store of many nodes reads each node's past once.
  if (past) f.node = r.node;
  auto whole = profiles.get(f);
  if (!whole) return whole.error();
  const Profile* prof = &(*whole)->prof;
  // pids repeat across nodes; a worker runs on its rank's node
  const std::vector<uint32_t>& mine = (*whole)->samples_of(r.node, worker ? pid : r.pid);
  if (stats) stats->samples += mine.size(), stats->profiles++;
  if (before_ns && prof->start_ns + prof->duration_ns > *before_ns) return {};
  // Per step of the span the profile's windows cover: a span of windows that starts later than
  // the steps read (the stretch after a change point) is divided by its own steps.
  if (prof->duration_ns > 0) {
    size_t covered = 0;
    for (const auto& st : rank_steps) covered += st.start_ns >= prof->start_ns && st.start_ns < prof->start_ns + prof->duration_ns;
    if (covered > 0) steps = static_cast<double>(covered);
  }
  Values& out = past ? (kind == store::CountKind::kOnCpu ? past->oncpu : past->offcpu)
                     : (kind == store::CountKind::kOnCpu ? r.oncpu : r.offcpu);
  // On-CPU counts are samples of their windows' period each (the cost budget lowers the rate in
  // some windows: a 24 Hz sample is ~41 ms of CPU, a 99 Hz one ~10 ms); off-CPU counts are microseconds.
  const double default_unit_ms = kind == store::CountKind::kOnCpu ? 1000.0 / 99 : 1e-3;
  auto unit_ms = [&](const ProfileSample& smp) {
    if (kind != store::CountKind::kOnCpu) return default_unit_ms;
    const uint64_t period = prof->period_of(smp);
    return period > 0 ? static_cast<double>(period) / kNsPerMs : default_unit_ms;
  };
  const bool offcpu = kind == store::CountKind::kOffCpu;
  std::unordered_map<uint32_t, NameId> path_of;
  for (uint32_t i : mine) {
    const ProfileSample& smp = prof->samples[i];
    if (smp.stack_index >= prof->stacks.size()) continue;
    const Stack& stack = prof->stacks[smp.stack_index];
    // Off-CPU, only blocking that is a cause by itself (I/O, D state); sleeping on a futex or a
    // timer is waiting for the job's own threads and peers.
    if (offcpu) {
      bool blocked = false;
      for (const auto& fr : stack) blocked |= fr.function == "[io]" || fr.function == "[uninterruptible]";
      if (!blocked) continue;
    }
    auto it = path_of.find(smp.stack_index);
    if (it == path_of.end())
      it = path_of.emplace(smp.stack_index, job.names.id(root + call_path(stack, offcpu, &job))).first;
    const double ms = static_cast<double>(smp.count) * unit_ms(smp) / steps;
    if (use != ProfileUse::kCallers) out.push_back({it->second, ms});
    if (!offcpu && !past && use != ProfileUse::kTimes) {
      std::string sc = syscall_caller(stack);
      if (worker && !sc.empty()) sc.insert(sc.find('|') + 1, root);
      if (!sc.empty()) r.syscall_callers.push_back({job.names.id(sc), ms});
    }
  }
  normalize(out);
  normalize(r.syscall_callers);
  return {};
}

// Metrics of one process (a rank and its workers) over the windows that overlap a stretch.
struct Acc {
  std::array<double, kOsCount> sum{};
  std::array<bool, kOsCount> seen{};
  std::set<std::pair<uint64_t, uint64_t>> windows;
  std::map<std::string, double> neighbours, kernels;
  std::map<std::string, TcpLink> links;  // by "local>remote"
  std::map<std::string, double> placement;  // os.cpu_time_by_cpu_us by CPU (the process's own, not its workers')
  std::map<std::string, double> irq_sources;  // ms by RankWindow::irq_sources' names
  double bio_lat_sum = 0;
  int bio_lat_n = 0;
  double agent_ms = 0;  // the agent's own run time on the rank's CPUs
  bool agent_seen = false;
  // Device-memory calls by window, then API name: host ms, calls, MB, as recorded.
  std::map<std::pair<uint64_t, uint64_t>, std::map<std::string, std::array<double, 3>>> memory;
  // The share of each window the agent probed memory calls in (api.memory_coverage; absent: all of
  // it): past its budget it probes them in bursts only, and its sums cover that share.
  std::map<std::pair<uint64_t, uint64_t>, double> memory_coverage;
  bool gpu_seen = false;  // the GPU probes watched the process: no memory call recorded is none made
};

// The device-memory calls a rank's host thread waits in (agent/runtimes/runtimes.cpp's api_name
// spells them): allocation and release, and synchronous copies. cudaMemcpyAsync is not one: it
// returns at once.
enum class MemoryCall { kNone, kAlloc, kSyncCopy };
MemoryCall memory_call(const std::string& api) {
  for (const char* a : {"cudaMalloc", "cudaFree", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAlloc", "cuMemFree"}) {
    if (api == a) return MemoryCall::kAlloc;
  }
  return api == "cudaMemcpy" ? MemoryCall::kSyncCopy : MemoryCall::kNone;
}

// Memory calls per step of one process: what its windows recorded over the time they were probed,
// times its step time. kUnknown where the GPU probes never watched it. Windows that began before
// `from` (the analysis window's start: they straddle the change) are left out when later ones were
// probed: their healthy stretch, probed throughout before the calls passed the agent's budget,
// would outweigh the short bursts after it and pull the estimate back to the healthy rate.
void fill_memory(const Acc& a, double step_ms, uint64_t from, std::array<double, kOsCount>& os, Values* by_ms,
                 Values* by_calls, Values* by_mb, Names& names) {
  if (!a.gpu_seen || !known(step_ms)) return;
  auto probed = [&](const std::pair<uint64_t, uint64_t>& w) {
    auto c = a.memory_coverage.find(w);
    return ms_of(w.second - w.first) * (c == a.memory_coverage.end() ? 1.0 : std::clamp(c->second, 0.0, 1.0));
  };
  double inside_ms = 0;
  for (const auto& w : a.windows) inside_ms += w.first >= from ? probed(w) : 0;
  const bool inside_only = inside_ms > 0;
  double probed_ms = 0;
  std::map<std::string, std::array<double, 3>> sums;
  for (const auto& w : a.windows) {
    if (inside_only && w.first < from) continue;
    probed_ms += probed(w);
    auto m = a.memory.find(w);
    if (m == a.memory.end()) continue;
    for (const auto& [api, v] : m->second) {
      for (size_t i = 0; i < v.size(); ++i) sums[api][i] += v[i];
    }
  }
  if (probed_ms <= 0) return;  // never probed in these windows: unknown, not none
  const double per_step = step_ms / probed_ms;
  for (Os m : {Os::kAllocApi, Os::kAllocCalls, Os::kSyncCopyApi, Os::kSyncCopyCalls, Os::kSyncCopyMb}) os[static_cast<size_t>(m)] = 0;
  for (const auto& [api, v] : sums) {
    const bool alloc = memory_call(api) == MemoryCall::kAlloc;
    os[static_cast<size_t>(alloc ? Os::kAllocApi : Os::kSyncCopyApi)] += v[0] * per_step;
    os[static_cast<size_t>(alloc ? Os::kAllocCalls : Os::kSyncCopyCalls)] += v[1] * per_step;
    if (!alloc) os[static_cast<size_t>(Os::kSyncCopyMb)] += v[2] * per_step;
    if (by_ms) by_ms->push_back({names.id(api), v[0] * per_step});
    if (by_calls) by_calls->push_back({names.id(api), v[1] * per_step});
    if (by_mb) by_mb->push_back({names.id(api), v[2] * per_step});
  }
  for (Values* v : {by_ms, by_calls, by_mb}) {
    if (v) normalize(*v);
  }
}

// Where a sampled memory call was made (its stack leaf first): the innermost Python function when
// the stack has one (the interpreter's C frames are not where the program calls), else the
// innermost resolved native frame outside the CUDA runtime, libc and strata's uprobe trampoline.
// Empty when none is resolved: a raw address names nothing a person can search for.
std::string memory_call_site_of(const Stack& stack) {
  for (const Frame& f : stack) {
    if (f.kind != FrameKind::kPython || f.function.empty()) continue;
    std::string name = python_key(f);
    if (!unresolved_frame(name)) return name;
  }
  for (const Frame& f : stack) {
    if (f.kind != FrameKind::kNative || f.function.empty() || f.module.rfind("[uprobes", 0) == 0) continue;
    if (cuda_runtime_module(f.module) || libc_module(f.module)) continue;
    std::string name = f.display_name();
    if (!unresolved_frame(name)) return name;
  }
  return {};
}

// The sampled memory calls of the job's ranks (store launch rows named "[API]"), by API and call
// site (RankWindow::memory_call_sites), in the windows that overlap the analysis window from
// `from_ns` on; as fill_memory does, a process's windows that began before `from_ns` (they
// straddle the change) are left out when later ones hold sampled calls.
Status load_memory_call_sites(store::Reader& s, const store::RowQuery& span, uint64_t from_ns, JobWindow& job,
                              const ByProc<RankWindow*>& by_proc, Stats* stats) {
  store::RowQuery q = span;
  q.from_ns = std::max(span.from_ns.value_or(0), from_ns);
  q.prefix = "[";  // memory calls' rows; launches are named by their kernel
  auto samples = s.query_launch_samples(q);
  if (!samples) return samples.error();
  if (stats) stats->samples += samples->rows.size();
  ByProc<bool> inside;  // the process has sampled calls in windows that began at or after from_ns
  auto api_of = [](const std::string& name) { return name.size() > 2 ? name.substr(1, name.size() - 2) : std::string(); };
  for (const auto& row : samples->rows) {
    if (row.start_ns >= from_ns && memory_call(api_of(row.sample.kernel)) != MemoryCall::kNone)
      inside[{row.node, row.sample.pid}] = true;
  }
  std::vector<std::string> site_of(samples->stacks.size());
  std::vector<bool> resolved(samples->stacks.size(), false);
  for (const auto& row : samples->rows) {
    auto it = by_proc.find({row.node, row.sample.pid});
    if (it == by_proc.end() || row.stack_index >= samples->stacks.size()) continue;
    const std::string api = api_of(row.sample.kernel);
    if (memory_call(api) == MemoryCall::kNone) continue;
    if (inside.count({row.node, row.sample.pid}) && row.start_ns < from_ns) continue;
    if (!resolved[row.stack_index]) {
      site_of[row.stack_index] = memory_call_site_of(samples->stacks[row.stack_index]);
      resolved[row.stack_index] = true;
    }
    const std::string& site = site_of[row.stack_index];
    if (site.empty()) continue;
    it->second->memory_call_sites.push_back({job.names.id(api + "|" + site), static_cast<double>(row.sample.count)});
  }
  for (auto& r : job.ranks) normalize(r.memory_call_sites);
  return {};
}

// One OS metric of a process into its rank's sums; false when `name` is not one of these.
bool add_os(Acc& a, const std::string& n, const std::string& label, double value) {
  auto add = [&](Os o, double v) {
    a.sum[static_cast<size_t>(o)] += v;
    a.seen[static_cast<size_t>(o)] = true;
  };
  if (n == "os.cpu_time_us") add(Os::kCpu, value / 1e3);
  else if (n == "os.runq_wait_us") add(Os::kRunqWait, value / 1e3);
  else if (n == "os.cgroup_throttled_us") add(Os::kThrottled, value / 1e3);
  else if (n == "os.direct_reclaim_us" || n == "os.compaction_stall_us") add(Os::kReclaim, value / 1e3);
  else if (n == "os.blocked_us") {
    if (label == "io" || label == "uninterruptible") add(Os::kBlockedIo, value / 1e3);
    else a.seen[static_cast<size_t>(Os::kBlockedIo)] = true;
  } else if (n == "os.irq_time_us" || n == "os.softirq_time_us") {
    add(Os::kIrq, value / 1e3);
    a.irq_sources[n == "os.irq_time_us" ? "IRQ " + label : label + " softirq"] += value / 1e3;
  }
  else if (n == "os.major_faults") add(Os::kMajorFaults, value);
  else if (n == "os.bio_latency_us.mean") a.bio_lat_sum += value / 1e3, ++a.bio_lat_n;
  else return false;
  return true;
}

// Each side of a change in the job's step time holds at least this many steps (find_change_point):
// a median of three is not moved by one stray step (a GC pause).
constexpr size_t kChangeMinSide = 3;

}  // namespace

size_t find_change_point(const std::vector<double>& s, double min_rise) {
  // Of the splits where the median rises significantly (a few steps on each side), the one whose two
  // medians fit the series best: the least sum of absolute deviations from them, the classic
  // two-segment cost, robust like the medians to single slow steps (a GC pause) that a mean would
  // chase. Not the split of the largest rise: that one leans towards the fastest steps, wherever
  // they are. A few fast steps right after the warm-up (before other load, or before the job's
  // buckets settled) rise the most to everything after them, healthy steps included: a PyTorch DDP
  // job of 2 ranks whose links all slowed at iteration 25 of 60 got its change point at iteration
  // 7, its baseline the 4 steps of 47 ms before it, and a window of 18 healthy steps of 55-106 ms
  // and the 35 slow ones; its collectives' growth then read as hosts that slowed (no finding).
  if (s.size() < 2 * kChangeMinSide + 1) return 0;
  size_t best = 0;
  double best_rise = 0, best_cost = 0;
  for (size_t k = kChangeMinSide; k + kChangeMinSide <= s.size(); ++k) {
    std::vector<double> before(s.begin(), s.begin() + static_cast<long>(k));
    std::vector<double> after(s.begin() + static_cast<long>(k), s.end());
    double mb = median(before), ma = median(after);
    // The rise must stand out from the uncertainty of the two medians (about 1.25 sigma/sqrt(n)
    // each, each side with its own sigma), not from single steps' noise: a noisy job still shows a
    // sustained change. The after side's own sigma: a few quiet steps first and a machine whose
    // speed then drifted up and back (a healthy 3-rank gloo job: 4 steps of 101-138 ms, then
    // 16 of 128-288 and 22 of 103-201) is no change, while the before side's sigma alone (7 ms)
    // made its 23 ms rise a job-wide network-slow on a healthy job.
    const double sigma_b = robust_sigma(before, mb), sigma_a = robust_sigma(after, ma);
    double se = 1.25 * std::sqrt(sigma_b * sigma_b / static_cast<double>(k) +
                                 sigma_a * sigma_a / static_cast<double>(s.size() - k));
    double rise = ma - mb;
    if (!(rise >= std::max({min_rise * mb, 4 * se, 1.0}))) continue;
    double cost = 0;
    for (double x : before) cost += std::abs(x - mb);
    for (double x : after) cost += std::abs(x - ma);
    if (best == 0 || cost < best_cost) {
      best_cost = cost;
      best_rise = rise;
      best = k;
    }
  }
  if (best == 0) return 0;
  // The median split lands anywhere in the first slow run: walk back to its first slow step.
  std::vector<double> before(s.begin(), s.begin() + static_cast<long>(best));
  double mb = median(before);
  while (best > kChangeMinSide && s[best - 1] > mb + 0.5 * best_rise) --best;
  return best;
}

// Steps so long that fewer than find_change_point's three slow steps fill a window: a fault that
// makes a 250 ms step take 15-20 s (two CPU hogs on a rank's CPU, measured on a held-out PyTorch
// DDP job) gave three slow steps after 55 s, and a finding a minute after the fault began. The
// step in flight at the data's end is evidence too: it has lasted at least as long as the data
// shows past the rank's last step. A single long step is a one-off (a checkpoint's save, a long
// GC pause) when the step after it is back to normal; when the step in flight has already run long
// too, the slowness persists. So a change is also where the last one or two completed steps and
// the step in flight are each at least kLongStepFactor times the median of the steps before (and
// clear of those steps' noise), and together have lasted at least a window (the time three
// slow steps of a job whose steps are short fill well within; for short steps, the three-step rule
// is as fast).
constexpr double kLongStepFactor = 3.0;  // beyond the 2x this machine's speed drifts within minutes
constexpr size_t kLongStepMinBase = 5;   // steps before the change: a median that a stray step cannot move

size_t find_long_step_change(const std::vector<double>& s, double in_flight_ms, double window_ms) {
  if (window_ms <= 0) return 0;
  // From kChangeMinSide slow steps on, find_change_point decides.
  for (size_t k = 1; k < kChangeMinSide && k + kLongStepMinBase <= s.size(); ++k) {
    const size_t first = s.size() - k;
    std::vector<double> before(s.begin(), s.begin() + static_cast<long>(first));
    const double mb = median(before);
    const double bar = std::max(kLongStepFactor * mb, mb + 4 * robust_sigma(before, mb));
    if (!(in_flight_ms >= bar)) return 0;
    double lasted = in_flight_ms;
    bool slow = true;
    for (size_t i = first; i < s.size(); ++i) {
      slow = slow && s[i] >= bar;
      lasted += s[i];
    }
    if (!slow) return 0;
    if (s[first - 1] >= bar) continue;  // the slow run began earlier: one more step
    return lasted >= window_ms ? first : 0;
  }
  return 0;
}

namespace {

// find_long_step_change over the job's steps, with the step in flight at the data's end: from
// each rank's last step to the end of its latest metric window (median over the ranks, as the
// job's steps are), counted only while a rank of the job is inside a collective there (its peers
// wait for the step to finish). A job done training is inside none: its teardown after a long
// last step (a final checkpoint's save) is no step in flight. 0: no such change.
size_t long_step_change(const std::vector<RankSource>& src, std::span<const store::Store::MetricRow> rows,
                        const std::vector<double>& job_steps) {
  ByProc<size_t> rank_of;
  for (size_t i = 0; i < src.size(); ++i) rank_of[{src[i].proc.node, src[i].proc.pid}] = i;
  std::vector<uint64_t> seen_until(src.size(), 0);
  uint64_t window_ns = 0;
  std::vector<std::pair<size_t, uint64_t>> inside;  // (rank, the window end where it was inside a collective)
  // A process's rows of one window are adjacent (the span's order): one lookup per window.
  const store::Store::MetricRow* group = nullptr;
  size_t group_rank = SIZE_MAX;
  for (const auto& m : rows) {
    if (!group || m.start_ns != group->start_ns || m.end_ns != group->end_ns || m.metric.pid != group->metric.pid ||
        m.node != group->node) {
      group = &m;
      auto it = rank_of.find({m.node, m.metric.pid});
      group_rank = it == rank_of.end() ? SIZE_MAX : it->second;
      if (group_rank != SIZE_MAX && m.end_ns > seen_until[group_rank]) {
        seen_until[group_rank] = m.end_ns;
        window_ns = std::max(window_ns, m.end_ns - std::min(m.end_ns, m.start_ns));
      }
    }
    if (group_rank != SIZE_MAX && m.metric.name == store::kInFlightMetric) {
      auto call = store::parse_in_flight_label(m.metric.label);
      if (call && call->library != "cuda") inside.emplace_back(group_rank, m.end_ns);
    }
  }
  const bool in_step = std::any_of(inside.begin(), inside.end(), [&](const auto& x) { return x.second == seen_until[x.first]; });
  if (!in_step) return 0;
  std::vector<double> in_flight;
  for (size_t i = 0; i < src.size(); ++i) {
    if (!src[i].steps.empty() && seen_until[i] > 0)
      in_flight.push_back(ms_of(seen_until[i] - std::min(seen_until[i], src[i].steps.back().end_ns)));
  }
  return in_flight.empty() ? 0 : find_long_step_change(job_steps, median(in_flight), ms_of(window_ns));
}

}  // namespace

// A synchronous job's ranks finish every iteration together (each waits for the others in the
// iteration's collectives), so over the time they all cover they complete the same number of
// iterations, give or take the one cut by either end of that time. The agent finds each process's
// steps by itself, from its own collective pattern (agent/comm/step_detector.h); when every call of
// an iteration looks alike (DDP's buckets on gloo, whose byte counts are not read), the cut is
// chosen from the gaps between calls. An older detector settled on its first calls and cut at a
// fraction of the iteration: PyTorch DDP/gloo with 3 buckets per iteration got 57 steps on one rank
// and 38 on the other over the same 40 iterations. Today's detector judges 16 cycles of every
// candidate and re-checks (39 and 39 on the same calls), but stores recorded by older agents, and
// a rank whose gaps stay ambiguous, still hold such cuts. Per-step figures of ranks cut differently
// do not compare (the fraction's "steps" look short and idle), so such a rank is re-cut at the
// boundaries of the rank whose steps are longest. The detector prefers the largest step length that
// shows one dominant gap in 80% of cycles, so a too-long cut (a multiple) needs boundaries that
// alternate in strength for a whole run; it is not corrected here.
// A rank is cut differently when it has more steps than the reference beyond both bounds:
// the two ends of the common time can each add one step ...
constexpr size_t kStepCutEdgeSteps = 2;
// ... and a fraction j/k of an iteration of k repeats (k <= the detector's 8) gives at least 8/7 as
// many steps (+14%); 10% lies between that and the same count.
constexpr double kStepCutExcess = 0.1;
// The reference must hold a few steps in the common time for counts to say anything.
constexpr size_t kMinStepsToAlign = 3;

std::vector<size_t> align_step_cuts(std::vector<std::vector<store::StepRecord>>& steps) {
  std::vector<size_t> recut;
  uint64_t from = 0, to = UINT64_MAX;
  size_t with_steps = 0;
  for (const auto& st : steps) {
    if (st.empty()) continue;
    ++with_steps;
    from = std::max(from, st.front().start_ns);
    to = std::min(to, st.back().end_ns);
  }
  if (with_steps < 2 || from >= to) return recut;
  std::vector<size_t> count(steps.size(), 0);
  size_t ref = steps.size();
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i].empty()) continue;
    for (const auto& s : steps[i]) count[i] += s.start_ns >= from && s.end_ns <= to;
    if (ref == steps.size() || count[i] < count[ref]) ref = i;
  }
  if (count[ref] < kMinStepsToAlign) return recut;
  const double allowed = std::max(static_cast<double>(kStepCutEdgeSteps), kStepCutExcess * static_cast<double>(count[ref]));
  const auto& ref_steps = steps[ref];
  for (size_t i = 0; i < steps.size(); ++i) {
    const auto& own = steps[i];
    if (i == ref || own.empty() || static_cast<double>(count[i]) <= static_cast<double>(count[ref]) + allowed) continue;
    // The reference's steps inside this rank's own time (its progress never reaches further), each
    // given the rank's own collective and device time by overlap: what fell in that interval.
    std::vector<store::StepRecord> cut;
    size_t j = 0;  // the first own step that may overlap the current reference step
    for (const auto& r : ref_steps) {
      if (r.start_ns < own.front().start_ns || r.end_ns > own.back().end_ns || r.end_ns <= r.start_ns) continue;
      store::StepRecord s;
      s.pid = own.front().pid;
      s.node = own.front().node;
      s.step = r.step;
      s.start_ns = r.start_ns;
      s.end_ns = r.end_ns;
      s.device_known = true;
      double coll = 0, dev_coll = 0, dev_comp = 0, idle = 0;
      while (j < own.size() && own[j].end_ns <= r.start_ns) ++j;
      for (size_t k = j; k < own.size() && own[k].start_ns < r.end_ns; ++k) {
        const auto& o = own[k];
        uint64_t lo = std::max(o.start_ns, r.start_ns), hi = std::min(o.end_ns, r.end_ns);
        if (hi <= lo || o.end_ns <= o.start_ns) continue;
        double share = static_cast<double>(hi - lo) / static_cast<double>(o.end_ns - o.start_ns);
        coll += share * static_cast<double>(o.collective_ns);
        dev_coll += share * static_cast<double>(o.device_collective_ns);
        dev_comp += share * static_cast<double>(o.device_compute_ns);
        idle += share * static_cast<double>(o.gpu_idle_ns);
        s.device_known = s.device_known && o.device_known;
      }
      s.collective_ns = static_cast<uint64_t>(std::llround(coll));
      s.device_collective_ns = static_cast<uint64_t>(std::llround(dev_coll));
      s.device_compute_ns = static_cast<uint64_t>(std::llround(dev_comp));
      s.gpu_idle_ns = static_cast<uint64_t>(std::llround(idle));
      cut.push_back(std::move(s));
    }
    if (cut.empty()) continue;
    steps[i] = std::move(cut);
    recut.push_back(i);
  }
  return recut;
}

namespace {

// NVML's hardware series of one GPU (agent/gpu/nvml_source.h) over the analysis window: counters
// of new errors are summed, link widths and generations kept at their highest (a link idles at a
// lower generation to save power; a degraded one never reaches its full one), a lost GPU stays lost.
void add_gpu_health(GpuState& g, const std::string& name, double v) {
  auto sum = [&](double& dst) { dst = known(dst) ? dst + v : v; };
  auto highest = [&](double& dst) { dst = known(dst) ? std::max(dst, v) : v; };
  if (name == "gpu.ecc_uncorrected") sum(g.ecc_uncorrected);
  else if (name == "gpu.ecc_corrected") sum(g.ecc_corrected);
  else if (name == "gpu.retired_pages") sum(g.retired_pages);
  else if (name == "gpu.pcie_replays") sum(g.pcie_replays);
  else if (name == "gpu.nvlink_errors") sum(g.nvlink_errors);
  else if (name == "gpu.pcie_link_gen") highest(g.pcie_gen);
  else if (name == "gpu.pcie_link_width") highest(g.pcie_width);
  else if (name == "gpu.pcie_link_max_width") highest(g.pcie_max_width);
  else if (name == "gpu.lost" && v > 0) g.lost = true;
  else if (name == "gpu.xid" && v > 0 && v < 1e6) g.xids.push_back(static_cast<unsigned>(v));
}

void copy_gpu_health(const GpuState& from, GpuState& to) {
  to.ecc_uncorrected = from.ecc_uncorrected;
  to.ecc_corrected = from.ecc_corrected;
  to.retired_pages = from.retired_pages;
  to.pcie_replays = from.pcie_replays;
  to.nvlink_errors = from.nvlink_errors;
  to.pcie_gen = from.pcie_gen;
  to.pcie_width = from.pcie_width;
  to.pcie_max_width = from.pcie_max_width;
  to.lost = from.lost;
  to.xids = from.xids;
  std::sort(to.xids.begin(), to.xids.end());
  to.xids.erase(std::unique(to.xids.begin(), to.xids.end()), to.xids.end());
}

// The stall's stacks kept per rank and kind: what a hung rank was doing is in its few heaviest
// paths; the rest is noise that would make every rank's window heavier to hold.
constexpr size_t kStallStacks = 5;

// A window of the job's healthy past may begin before the baseline's first step by this share of
// its length. The agent's first window starts with the agent, before the ranks' first steps: a job
// started beside it has a few hundred ms of start-up in a 10 s window, and its rates per step are
// off by at most that share (a tenth), far under what the past is compared for (a cause explains a
// quarter of a loss). Without it, a fault two windows into a job (an 8-rank sim, 90 steps of 173 ms:
// 16 s) has no OS past at all, and a job-wide I/O stall of +2.3 s per step went unexplained.
constexpr double kMaxPastWarmupShare = 0.1;

// A rank's stacks of one kind from `from_ns` on, as ms by call path (every off-CPU wait, not only
// I/O), its heaviest kStallStacks paths. `pid`: the rank's, or one of its workers' (its paths then
// rooted at kWorkerFrame: a data loader worker that stopped is where a rank's hang often is).
// Read through the cache as one node's profile from `from_ns` (every rank of a node starts its
// stall at the same window of that node's agent): one read per node and kind, not per process
// and kind. Per process, a hang round at 8,000 ranks made 32,000 reads (ranks and their workers,
// on- and off-CPU) and took twice as long as the rounds before it.
Status load_stall_stacks(ProfileCache& profiles, const store::RowQuery& span, uint64_t from_ns, JobWindow& job, RankWindow& r,
                         store::CountKind kind, Stats* stats, uint32_t pid) {
  const std::string root = pid != r.pid ? std::string(kWorkerFrame) + ";" : std::string();
  store::ProfileFilter f;
  f.from_ns = from_ns;
  f.to_ns = span.to_ns;
  f.node = r.node;
  f.recording = span.recording;
  f.kind = kind;
  auto whole = profiles.get(f);
  if (!whole) return whole.error();
  const Profile* prof = &(*whole)->prof;
  const std::vector<uint32_t>& mine = (*whole)->samples_of(r.node, pid);
  if (stats) stats->samples += mine.size(), stats->profiles++;
  const bool offcpu = kind == store::CountKind::kOffCpu;
  std::map<std::string, double> by_path;
  for (uint32_t i : mine) {
    const ProfileSample& smp = prof->samples[i];
    if (smp.stack_index >= prof->stacks.size()) continue;
    const Stack& stack = prof->stacks[smp.stack_index];
    // As load_profile weighs them: on-CPU samples are their window's period each, off-CPU counts µs.
    double unit_ms = 1e-3;
    if (!offcpu) {
      const uint64_t period = prof->period_of(smp);
      unit_ms = period > 0 ? static_cast<double>(period) / kNsPerMs : 1000.0 / 99;
    }
    by_path[root + call_path(stack, offcpu, nullptr)] += static_cast<double>(smp.count) * unit_ms;
  }
  std::vector<std::pair<double, std::string>> top;
  for (auto& [path, ms] : by_path) top.emplace_back(ms, path);
  std::sort(top.begin(), top.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (top.size() > kStallStacks) top.resize(kStallStacks);
  Values& out = offcpu ? r.stall_offcpu : r.stall_oncpu;
  for (const auto& [ms, path] : top) out.push_back({job.names.id(path), ms});
  normalize(out);
  return {};
}

// Processes that train without a RANK in their environment: a job started with
// torch.multiprocessing.spawn (or any launcher that hands each rank its number as an argument) sets
// it, if at all, after its exec, where /proc/PID/environ never shows it. Its ranks are still the
// processes that train (their collectives repeat in steps): those without a RANK that share a parent
// on a node are one job's ranks, numbered by start order (spawn starts rank 0 first, so the numbers
// are the job's own where it spawns in order; the notes say which pid each one is, since nothing
// guarantees it). Their descendants without a RANK that do not train (DataLoader workers) are their
// rank's, as children that inherit a RANK would be. Processes with a RANK are left as they are.
// Rewrites `procs` in place; the notes say what was inferred.
void infer_ranks(std::vector<store::ProcessInfo>& procs, const std::function<bool(const store::ProcessInfo&)>& trains,
                 std::vector<std::string>& notes) {
  std::map<std::pair<std::string, uint32_t>, std::vector<size_t>> groups;  // (node, parent) -> ranks
  ByProc<size_t> index;
  for (size_t i = 0; i < procs.size(); ++i) {
    index[{procs[i].node, procs[i].pid}] = i;
    if (procs[i].rank < 0 && trains(procs[i])) groups[{procs[i].node, procs[i].ppid}].push_back(i);
  }
  std::set<size_t> inferred;
  for (auto& [key, members] : groups) {
    const auto& [node, parent] = key;
    inferred.insert(members.begin(), members.end());
    std::sort(members.begin(), members.end(), [&](size_t a, size_t b) {
      return std::tie(procs[a].start_ns, procs[a].pid) < std::tie(procs[b].start_ns, procs[b].pid);
    });
    std::string job = procs[members[0]].job;
    if (job.empty()) {
      auto up = index.find({node, parent});
      job = job_of_ranks_without_rank(up != index.end() ? procs[up->second].comm : std::string(), parent);
    }
    std::string which;
    for (size_t k = 0; k < members.size(); ++k) {
      auto& p = procs[members[k]];
      p.rank = static_cast<int>(k);
      p.world_size = static_cast<int>(members.size());
      p.job = job;
      which += (k ? ", " : "") + std::to_string(k) + " = pid " + std::to_string(p.pid);
    }
    notes.push_back("no process of job " + job + " has a RANK in its environment (a launcher such as "
                    "torch.multiprocessing.spawn passes it as an argument): its ranks are the " +
                    std::to_string(members.size()) + " processes that train under pid " + std::to_string(parent) +
                    (node.empty() ? "" : " on " + node) + ", numbered by start order (rank " + which +
                    "); the job may number them otherwise");
  }
  if (groups.empty()) return;
  for (auto& p : procs) {
    if (p.rank >= 0) continue;
    auto up = index.find({p.node, p.ppid});
    for (int depth = 0; depth < 64 && up != index.end() && procs[up->second].rank < 0; ++depth)
      up = index.find({p.node, procs[up->second].ppid});
    if (up == index.end() || !inferred.count(up->second)) continue;  // below a RANK of its own: as before
    p.rank = procs[up->second].rank;
    p.job = procs[up->second].job;
  }
}

}  // namespace

std::string job_of_ranks_without_rank(const std::string& parent_comm, uint32_t parent) {
  return (parent_comm.empty() ? std::string("job") : parent_comm) + "-" + std::to_string(parent);
}

namespace {

// Why a store holds no step, for the person who asked: steps come from the collectives a job's ranks
// repeat every iteration, so a store with no collective holds a job that never called one (one
// process training alone, without torch.distributed) or none at all.
Error no_step_error(store::Reader& s, std::optional<int64_t> rec) {
  store::RowQuery one;
  one.recording = rec;
  one.limit = 1;
  auto calls = s.query_collectives(one);
  if (calls && calls->empty())
    return Error{"no training step in the store: strata finds a job's steps in the collectives (NCCL, gloo) its ranks "
                 "repeat every iteration, and no recorded process called one (a job that does not use torch.distributed "
                 "has no steps to compare); its profile is in `strata report`"};
  return Error{"no training step in the store: its collectives repeat no pattern of iterations yet (too few calls, or "
               "no two alike)"};
}

}  // namespace

Result<std::vector<store::ProcessInfo>> processes_with_ranks(store::Reader& store) {
  auto procs = store.processes();
  if (!procs) return procs.error();
  if (std::none_of(procs->begin(), procs->end(), [](const store::ProcessInfo& p) { return p.rank < 0; })) return procs;
  auto latest = store.latest_step_ns();
  if (!latest) return latest.error();
  if (!*latest) return procs;  // no steps: nothing trains
  store::RowQuery recent;
  recent.from_ns = **latest > kTrainerLookbackNs ? **latest - kTrainerLookbackNs : 0;
  recent.any_order = true;
  auto steps = store.query_steps(recent);
  if (!steps) return steps.error();
  std::set<std::pair<std::string, uint32_t>> trainers;
  for (const auto& s : *steps) trainers.insert({s.node, s.pid});
  std::vector<std::string> notes;
  infer_ranks(*procs, [&](const store::ProcessInfo& p) { return trainers.count({p.node, p.pid}) > 0; }, notes);
  return procs;
}

uint64_t row_end(const store::Store::MetricRow& r) { return r.end_ns; }
uint64_t row_end(const store::StepRecord& r) { return r.end_ns; }
uint64_t row_end(const store::CollectiveRecord& r) { return std::max(r.exit_ns, r.enter_ns + 1); }
uint64_t row_end(const store::DeviceActivity& r) { return r.end_ns; }

namespace {

// The order of the stores' span queries (SQLite's ORDER BY; ties as they come), kept by a refresh
// so that held rows and new ones read as one query of the span would.
auto span_key(const store::Store::MetricRow& r) {
  return std::tie(r.start_ns, r.node, r.metric.pid, r.metric.name, r.metric.label);
}
auto span_key(const store::StepRecord& r) { return std::tie(r.start_ns, r.node, r.pid); }
auto span_key(const store::CollectiveRecord& r) { return std::tie(r.enter_ns, r.node, r.pid); }

// Where a row begins: the first field of its span_key (the rows of a span query are in that order).
uint64_t row_start(const store::Store::MetricRow& r) { return r.start_ns; }
uint64_t row_start(const store::StepRecord& r) { return r.start_ns; }
uint64_t row_start(const store::CollectiveRecord& r) { return r.enter_ns; }
uint64_t row_start(const store::DeviceActivity& r) { return r.start_ns; }

}  // namespace

namespace detail {

// Held rows that end in (from_ns, cut_ns], then the new ones (all end after cut_ns) merged in by
// the query's order (a kind read in any order, device activity, has no span_key: appended). What
// it costs follows what is dropped and added, not what is held (HeldRows says why).
template <typename Row>
void merge_rows(HeldRows<Row>& held, std::vector<Row>& fresh, uint64_t from_ns, uint64_t cut_ns) {
  constexpr bool kOrdered = requires(const Row& r) { span_key(r); };
  auto& v = held.rows_;
  // Rows that end at or before from_ns: in key order they begin at or before it too, so only the
  // rows up to the first that begins later are looked at. The last dropped one found, the rows
  // kept before it move up behind it (few: those that began before from_ns and end after it),
  // and everything before them is the dead prefix.
  {
    size_t last = SIZE_MAX;
    for (size_t i = held.first_; i < v.size(); ++i) {
      if (kOrdered && !held.ends_before_start_ && row_start(v[i]) > from_ns) break;
      if (row_end(v[i]) <= from_ns) last = i;
    }
    if (last != SIZE_MAX) {
      size_t w = last + 1;
      for (size_t i = last + 1; i-- > held.first_;) {
        if (row_end(v[i]) > from_ns && --w != i) v[w] = std::move(v[i]);
      }
      for (size_t i = held.first_; i < w; ++i) v[i] = Row{};  // their strings' memory goes now
      held.first_ = w;
    }
  }
  // Rows that end after cut_ns (a read by time gets them again): they begin at most longest_ns_
  // before it, so the look starts there.
  if (cut_ns != UINT64_MAX) {
    size_t lo = held.first_;
    if (kOrdered && !held.ends_before_start_ && cut_ns > held.longest_ns_) {
      const uint64_t earliest = cut_ns - held.longest_ns_;
      lo = static_cast<size_t>(
          std::partition_point(v.begin() + static_cast<long>(held.first_), v.end(),
                               [&](const Row& r) { return row_start(r) < earliest; }) -
          v.begin());
    }
    size_t w = lo;
    for (size_t i = lo; i < v.size(); ++i) {
      if (row_end(v[i]) > cut_ns) continue;
      if (w != i) v[w] = std::move(v[i]);
      ++w;
    }
    v.erase(v.begin() + static_cast<long>(w), v.end());
  }
  for (const auto& r : fresh) {
    if (row_end(r) < row_start(r)) held.ends_before_start_ = true;
    else held.longest_ns_ = std::max(held.longest_ns_, row_end(r) - row_start(r));
  }
  if (held.empty()) {
    v.clear();
    held.first_ = 0;
  }
  // Memory: a span of 8,000 ranks holds millions of rows (~0.5 GB), so the vector stays within an
  // eighth of the rows it holds (kSlackDivisor). The dead prefix goes when it is over that, or
  // before the vector would grow: the live rows move within memory the vector already has (a move
  // in place; what cost a round its CPU was fresh memory's page faults). The first cut of this
  // (doubling, a prefix up to half, the reads' vectors kept at their largest) put the collector's
  // peak RSS at 3.4 GB in the 8,000-rank bench, against 2.0 GB before.
  constexpr size_t kSlackDivisor = 8;
  if (held.first_ > 0 && (held.first_ > v.size() / kSlackDivisor || v.size() + fresh.size() > v.capacity())) {
    v.erase(v.begin(), v.begin() + static_cast<long>(held.first_));
    held.first_ = 0;
  }
  if (fresh.empty()) return;
  const size_t read = fresh.size();
  if (v.empty()) {
    v.swap(fresh);  // a whole read: its vector becomes the held one (no second copy of the span)
  } else if constexpr (kOrdered) {
    auto less = [](const Row& a, const Row& b) { return span_key(a) < span_key(b); };
    // The held rows after the first new one's key (std::merge is stable: of equal keys the held
    // row, written earlier, comes first) are merged with the new rows; those before stay put.
    const auto pos = std::upper_bound(v.begin() + static_cast<long>(held.first_), v.end(), fresh.front(), less);
    std::vector<Row> tail(std::make_move_iterator(pos), std::make_move_iterator(v.end()));
    v.erase(pos, v.end());
    const size_t need = v.size() + tail.size() + fresh.size();
    if (need > v.capacity()) v.reserve(need + need / kSlackDivisor);
    std::merge(std::make_move_iterator(tail.begin()), std::make_move_iterator(tail.end()),
               std::make_move_iterator(fresh.begin()), std::make_move_iterator(fresh.end()), std::back_inserter(v),
               less);
  } else {
    const size_t need = v.size() + fresh.size();
    if (need > v.capacity()) v.reserve(need + need / kSlackDivisor);
    v.insert(v.end(), std::make_move_iterator(fresh.begin()), std::make_move_iterator(fresh.end()));
  }
  fresh.clear();
  // The read's vector is kept for the next read, unless it is far larger than reads are now (a
  // late batch, a span read again whole): then its memory goes.
  constexpr size_t kKeepReadFactor = 4;
  if (fresh.capacity() > kKeepReadFactor * std::max<size_t>(read, 4096)) std::vector<Row>().swap(fresh);
}

// The four kinds a span holds (and the tests'):
template void merge_rows(HeldRows<store::Store::MetricRow>&, std::vector<store::Store::MetricRow>&, uint64_t, uint64_t);
template void merge_rows(HeldRows<store::StepRecord>&, std::vector<store::StepRecord>&, uint64_t, uint64_t);
template void merge_rows(HeldRows<store::CollectiveRecord>&, std::vector<store::CollectiveRecord>&, uint64_t, uint64_t);
template void merge_rows(HeldRows<store::DeviceActivity>&, std::vector<store::DeviceActivity>&, uint64_t, uint64_t);

}  // namespace detail

Status refresh_span_rows(store::Reader& s, SpanRows& rows, std::optional<int64_t> recording, uint64_t from_ns,
                         std::optional<uint64_t> changed_from_ns, Stats* stats, const std::atomic<bool>* cancel,
                         bool use_write_seqs, const JobMembers* members) {
  const Error kCancelled{"the load was cancelled (the collector is stopping)"};
  auto cancelled = [&] { return cancel && cancel->load(std::memory_order_relaxed); };
  // How far each table was written, before any read: the reads stop there (what is written during
  // them is the next refresh's), so no row is read twice.
  std::optional<store::WriteSeqs> seqs;
  if (use_write_seqs) {
    auto w = s.write_seqs();
    if (!w) return w.error();
    seqs = *w;
  }
  // The held rows are of the processes asked for: all of them, where every process's are held or
  // wanted; else each one asked for is among those held (a process that joined the job since, a
  // restarted rank, had its earlier rows left out: the span is read again).
  auto holds_members = [&] {
    if (!members || !rows.members) return !members && !rows.members;
    for (const auto& [node, pids] : *members) {
      auto held = rows.members->find(node);
      if (held == rows.members->end()) return false;
      for (uint32_t pid : pids) {
        if (!held->second.count(pid)) return false;
      }
    }
    return true;
  };
  const bool same = rows.valid && rows.recording == recording && from_ns >= rows.from_ns && holds_members();
  // kSince: the rows written since the last refresh (by write sequence); kFromTime: the rows that
  // end at or after changed_from_ns (a store without write sequences); kWhole: the span.
  enum class How { kWhole, kSince, kFromTime } how = How::kWhole;
  if (same && seqs && rows.seqs && seqs->steps >= rows.seqs->steps && seqs->collectives >= rows.seqs->collectives &&
      seqs->device >= rows.seqs->device && seqs->metrics >= rows.seqs->metrics) {
    how = How::kSince;  // (a table that went back was emptied and refilled: read whole)
  } else if (same && !seqs && rows.seqs == std::nullopt && changed_from_ns && *changed_from_ns > from_ns + 1) {
    how = How::kFromTime;
  }
  if (how == How::kFromTime && *changed_from_ns == UINT64_MAX) {  // nothing written since: the start moves
    rows.read.clear();  // (a read that failed half way left rows there)
    detail::merge_rows(rows.metrics, rows.read.metrics, from_ns, UINT64_MAX);
    detail::merge_rows(rows.steps, rows.read.steps, from_ns, UINT64_MAX);
    detail::merge_rows(rows.collectives, rows.read.collectives, from_ns, UINT64_MAX);
    detail::merge_rows(rows.device, rows.read.device, from_ns, UINT64_MAX);
    rows.from_ns = from_ns;
    return {};
  }
  // Held rows that end after cut_ns are replaced by what is read.
  const uint64_t cut_ns = how == How::kFromTime ? *changed_from_ns - 1 : how == How::kSince ? UINT64_MAX : from_ns;
  const std::optional<store::WriteSeqs> since = rows.seqs;
  if (how == How::kWhole) {
    rows = SpanRows{};
    if (members) rows.members = *members;
  }
  rows.valid = false;  // until every kind is read
  // Other processes' rows go as they are read (RowQuery::keep_process); a node's own (pid 0) stay
  // where the job runs.
  std::function<bool(std::string_view, uint32_t)> keep;
  if (rows.members) {
    keep = [&kept = *rows.members, stats](std::string_view node, uint32_t pid) {
      auto it = kept.find(node);
      const bool mine = it != kept.end() && (pid == 0 || it->second.count(pid));
      if (!mine && stats) ++stats->passed_over;
      return mine;
    };
  }
  auto query = [&](int64_t store::WriteSeqs::*table) {
    store::RowQuery q;
    q.keep_process = keep;
    q.recording = recording;
    q.from_ns = how == How::kFromTime ? cut_ns : from_ns;
    if (how == How::kSince) q.after_seq = (*since).*table;
    if (seqs) q.upto_seq = (*seqs).*table;
    return q;
  };
  // Each kind into its kept vector (SpanRows::read), emptied first: a read that failed half way
  // left rows there.
  SpanRows::Read& got = rows.read;
  got.clear();
  if (cancelled()) return kCancelled;
  if (auto st = s.append_metrics(query(&store::WriteSeqs::metrics), got.metrics); !st) return st.error();
  if (stats) stats->metrics += got.metrics.size();
  if (cancelled()) return kCancelled;
  if (auto st = s.append_steps(query(&store::WriteSeqs::steps), got.steps); !st) return st.error();
  if (stats) stats->steps += got.steps.size();
  if (cancelled()) return kCancelled;
  if (auto st = s.append_collectives(query(&store::WriteSeqs::collectives), got.collectives); !st) return st.error();
  if (stats) stats->collectives += got.collectives.size();
  store::RowQuery any = query(&store::WriteSeqs::device);
  any.any_order = true;
  if (cancelled()) return kCancelled;
  if (auto st = s.append_device_activity(any, got.device); !st) return st.error();
  if (stats) stats->device += got.device.size();
  detail::merge_rows(rows.metrics, got.metrics, from_ns, cut_ns);
  detail::merge_rows(rows.steps, got.steps, from_ns, cut_ns);
  detail::merge_rows(rows.collectives, got.collectives, from_ns, cut_ns);
  detail::merge_rows(rows.device, got.device, from_ns, cut_ns);
  rows.recording = recording;
  rows.from_ns = from_ns;
  rows.seqs = seqs;
  rows.valid = true;
  return {};
}

Result<JobWindow> load_job_window(store::Reader& s, const LoadOptions& opt) {
  // Checked before each read (and each rank's): a read in progress runs to its end.
  auto cancelled = [&] { return opt.cancel && opt.cancel->load(std::memory_order_relaxed); };
  const Error kCancelled{"the load was cancelled (the collector is stopping)"};
  if (cancelled()) return kCancelled;
  auto rec_r = s.latest_recording();
  if (!rec_r) return rec_r.error();
  if (!*rec_r) return Error{"the store holds no recording"};
  std::optional<int64_t> rec = **rec_r;
  if (opt.all_recordings) rec.reset();
  Stats* stats = opt.stats;
  std::optional<uint64_t> from_ns = opt.from_ns;
  if (!from_ns && opt.last_ns) {
    // The latest stretch ends at the latest step the store holds: an index lookup, not a scan.
    auto latest = s.latest_step_ns(rec);
    if (!latest) return latest.error();
    if (!*latest) return no_step_error(s, rec);
    from_ns = **latest > *opt.last_ns ? **latest - *opt.last_ns : 0;
  }
  auto procs = s.processes(rec);
  if (!procs) return procs.error();
  ProfileCache profiles(s);  // each span's stacks read once for every rank

  // Every read below is of this span (the whole store when none is given).
  store::RowQuery span;
  span.recording = rec;
  span.from_ns = from_ns;
  span.to_ns = opt.to_ns;
  // The metrics first: their windows say how far the store has seen the job (observed_until_ns),
  // the steps and collectives how far it progressed. A collector's round reads while agents keep
  // writing, without a snapshot; read in this order, newer rows can only add progress, so a round
  // never sees "observed later than the last progress" that was not so (read the other way, a
  // round that took minutes saw minutes of metrics past the last step it had read: a false hang).
  // A collector's round has them held (SpanRows), up to date: no read.
  const SpanRows* held = opt.rows && !opt.to_ns && from_ns && opt.rows->covers(rec, *from_ns) ? opt.rows : nullptr;
  std::vector<store::Store::MetricRow> read_metrics;
  std::vector<store::StepRecord> read_steps;
  std::vector<store::CollectiveRecord> read_colls;
  std::vector<store::DeviceActivity> read_dev;
  // One read of the span, where the rows are not held: cancellation checked first, rows counted.
  auto read_span = [&](auto query, uint64_t Stats::*counted, auto& out) -> Status {
    if (cancelled()) return kCancelled;
    auto r = query();
    if (!r) return r.error();
    if (stats) stats->*counted += r->size();
    out = std::move(*r);
    return {};
  };
  if (!held) {
    if (auto st = read_span([&] { return s.query_metrics(span); }, &Stats::metrics, read_metrics); !st) return st.error();
    if (auto st = read_span([&] { return s.query_steps(span); }, &Stats::steps, read_steps); !st) return st.error();
  }
  const std::span<const store::Store::MetricRow> rows = held ? held->metrics.view() : read_metrics;
  const std::span<const store::StepRecord> steps_r = held ? held->steps.view() : read_steps;
  ByProc<std::vector<store::StepRecord>> steps_by_proc;
  for (auto& st : steps_r) steps_by_proc[{st.node, st.pid}].push_back(st);

  std::vector<std::string> data_notes;
  infer_ranks(*procs, [&](const store::ProcessInfo& p) { return steps_by_proc.count({p.node, p.pid}) > 0; },
              data_notes);

  // Jobs and their ranks. Children inherit RANK (a launcher's shell, a data-loader worker): the
  // rank is the process that trains (has steps); among those, a restarted rank's latest.
  std::map<std::string, std::map<int, store::ProcessInfo>> jobs;
  // The job itself, never its own neighbour: processes with a RANK (ranks, and children that
  // inherit it: data-loader workers) and their recorded ancestors (the launcher). Other recorded
  // processes (something the launcher started beside the ranks without a RANK) can be neighbours.
  ByProc<bool> job_procs;  // a set: (node, pid) of the job's processes
  ByProc<uint32_t> parent_of;
  ByProc<std::string> recorded_name;  // a recorded process's name (after its exec)
  for (const auto& p : *procs) {
    parent_of[{p.node, p.pid}] = p.ppid;
    if (p.rank >= 0) job_procs[{p.node, p.pid}] = true;
    if (!p.comm.empty()) recorded_name[{p.node, p.pid}] = p.comm;
  }
  for (const auto& p : *procs) {
    if (p.rank < 0) continue;
    Proc up{p.node, p.ppid};
    for (int depth = 0; depth < 64 && up.pid && parent_of.count(up) && job_procs.emplace(up, true).second; ++depth)
      up.pid = parent_of[up];
  }
  auto trains = [&](const store::ProcessInfo& p) { return steps_by_proc.count({p.node, p.pid}) > 0; };
  for (const auto& p : *procs) {
    if (p.rank < 0) continue;
    auto& slot = jobs[p.job][p.rank];
    bool better = slot.pid == 0 || (trains(p) && !trains(slot)) ||
                  (trains(p) == trains(slot) && p.start_ns > slot.start_ns);
    if (better) slot = p;
  }
  if (jobs.empty()) return Error{"no training job in the store: no recorded process has a RANK or trains (repeats collectives in steps)"};
  if (steps_r.empty() && (from_ns || opt.to_ns)) return Error{"no training step in the time span asked for"};
  const std::map<int, store::ProcessInfo>* ranks = nullptr;
  std::string job_name;
  for (const auto& [name, rs] : jobs) {
    if (!opt.job.empty() ? name == opt.job : (!ranks || rs.size() > ranks->size())) {
      ranks = &rs;
      job_name = name;
    }
  }
  if (!ranks) {
    std::string known_jobs;
    for (const auto& [name, rs] : jobs) known_jobs += (known_jobs.empty() ? "" : ", ") + name;
    return Error{"no job '" + opt.job + "' in the store (jobs: " + known_jobs + ")"};
  }

  std::vector<RankSource> src;
  for (const auto& [rank, p] : *ranks) {
    RankSource rs;
    rs.proc = p;
    auto& st = steps_by_proc[{p.node, p.pid}];
    std::sort(st.begin(), st.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
    rs.all_steps = st.size();
    if (!st.empty()) rs.first_step_ns = st.front().start_ns;
    // Start-up steps are the process's first ones (numbered from 1), also when a span starts later.
    size_t skip = 0;
    while (skip < st.size() && st[skip].step <= static_cast<uint64_t>(std::max(0, opt.warmup_steps))) ++skip;
    rs.steps.assign(st.begin() + static_cast<long>(skip), st.end());
    if (skip > 0 && skip < st.size()) {
      auto ns = [](const store::StepRecord& x) { return static_cast<double>(x.end_ns - std::min(x.end_ns, x.start_ns)); };
      std::vector<double> pace;
      for (size_t k = skip; k < st.size() && pace.size() < kPaceSteps; ++k) pace.push_back(ns(st[k]));
      const double typical = median(std::move(pace));
      for (size_t k = 0; k < skip; ++k) {
        if (ns(st[k]) > typical) rs.warmup_excess_ns += static_cast<uint64_t>(ns(st[k]) - typical);
      }
    }
    src.push_back(std::move(rs));
  }
  // Ranks whose steps the agent cut at a fraction of the iteration are re-cut like their peers.
  {
    std::vector<std::vector<store::StepRecord>> cuts;
    std::vector<size_t> before;
    for (auto& rs : src) {
      before.push_back(rs.steps.size());
      cuts.push_back(std::move(rs.steps));
    }
    for (size_t i : align_step_cuts(cuts)) {
      const auto& p = src[i].proc;
      data_notes.push_back("rank " + std::to_string(p.rank) + (p.node.empty() ? "" : " (node " + p.node + ")") +
                               ": the agent cut " + std::to_string(before[i]) +
                               " steps where its peers have fewer over the same time (a fraction of the "
                               "iteration); re-cut at its peers' boundaries into " + std::to_string(cuts[i].size()) +
                               " steps: its per-step figures are the loader's, not the agent's");
    }
    for (size_t i = 0; i < src.size(); ++i) src[i].steps = std::move(cuts[i]);
  }

  // The job's step time per step index (median over ranks), and where it rose.
  size_t len = 0;
  for (const auto& rs : src) len = std::max(len, rs.steps.size());
  std::vector<double> job_steps;
  for (size_t k = 0; k < len; ++k) {
    std::vector<double> v;
    for (const auto& rs : src) {
      if (k < rs.steps.size()) v.push_back(ms_of(rs.steps[k].end_ns - rs.steps[k].start_ns));
    }
    job_steps.push_back(median(v));
  }
  size_t cp = find_change_point(job_steps);
  if (size_t lcp = long_step_change(src, rows, job_steps); lcp > cp) cp = lcp;

  JobWindow job;
  job.data_notes = std::move(data_notes);
  job.job = job_name;
  job.start_ns = UINT64_MAX;
  for (auto& rs : src) {
    RankWindow r;
    r.rank = rs.proc.rank;
    r.pid = rs.proc.pid;
    r.node = rs.proc.node;
    r.process = rs.proc.comm;
    if (cp > 0) {
      r.base = phase(rs.steps, 0, cp);
      r.now = phase(rs.steps, cp, rs.steps.size());
    } else {
      // No change: the whole run is both the window and its own baseline (nothing got slower).
      r.now = phase(rs.steps, 0, rs.steps.size());
      r.base = r.now;
    }
    size_t first = cp > 0 ? cp : 0;
    // The latest steps of each phase for the second opinion over time; without a change point
    // every step is the window's (there is no baseline before it).
    append_series(r.series, rs.steps, 0, first, false);
    append_series(r.series, rs.steps, first, rs.steps.size(), true);
    if (first < rs.steps.size()) {
      job.start_ns = std::min(job.start_ns, rs.steps[first].start_ns);
      job.end_ns = std::max(job.end_ns, rs.steps.back().end_ns);
      r.last_progress_ns = rs.steps.back().end_ns;
    }
    job.ranks.push_back(std::move(r));
  }
  if (job.start_ns == UINT64_MAX) job.start_ns = 0;

  // Collective progress: completion on the device; an NCCL call's host return is only an enqueue.
  if (!held) {
    if (auto st = read_span([&] { return s.query_collectives(span); }, &Stats::collectives, read_colls); !st)
      return st.error();
  }
  const std::span<const store::CollectiveRecord> colls = held ? held->collectives.view() : read_colls;
  ByProc<RankWindow*> by_proc;
  for (auto& r : job.ranks) by_proc[{r.node, r.pid}] = &r;
  // A rank's workers: recorded processes that inherited a RANK and descend from a rank's process on
  // the same node (DataLoader workers). Their time is the rank's.
  ByProc<RankWindow*> worker_of;
  for (const auto& p : *procs) {
    if (p.rank < 0 || by_proc.count({p.node, p.pid})) continue;
    Proc up{p.node, p.ppid};
    for (int depth = 0; depth < 64 && up.pid && !by_proc.count(up) && parent_of.count(up); ++depth)
      up.pid = parent_of[up];
    auto owner = by_proc.find(up);
    if (owner == by_proc.end() || owner->second->rank != p.rank) continue;
    worker_of[{p.node, p.pid}] = owner->second;
    owner->second->workers.push_back(p.pid);
  }
  for (const auto& c : colls) {
    auto it = by_proc.find({c.node, c.pid});
    if (it == by_proc.end()) continue;
    uint64_t done = c.device_end_ns > 0 ? c.device_end_ns : (c.library == "nccl" ? 0 : c.exit_ns);
    it->second->last_progress_ns = std::max(it->second->last_progress_ns, done);
    // How far the rank got on each communicator: its latest call by sequence number (by entry
    // time where calls are not numbered).
    auto& comms = it->second->comms;
    const std::string& comm = c.comm_id;
    auto cp_it = std::find_if(comms.begin(), comms.end(), [&](const CommProgress& p) { return p.comm == comm; });
    if (cp_it == comms.end()) {
      comms.push_back({});
      cp_it = comms.end() - 1;
      cp_it->comm = comm;
    }
    CommProgress& p = *cp_it;
    ++p.calls;
    if (done > 0) ++p.completed;
    bool later = c.seq > 0 ? c.seq > p.last_seq || (c.seq == p.last_seq && c.enter_ns > p.last_enter_ns)
                           : c.enter_ns >= p.last_enter_ns;
    if (p.calls == 1 || later) {
      p.last_seq = c.seq;
      p.last_op = c.op;
      p.last_bytes = c.bytes;
      p.last_enter_ns = c.enter_ns;
      p.last_completed = done > 0;
    }
  }
  if (auto comms = s.communicators(rec)) {
    const IndexOf index_of = [&](std::string_view node, uint32_t pid) -> std::optional<size_t> {
      auto it = by_proc.find({node, pid});
      if (it == by_proc.end()) return std::nullopt;
      return static_cast<size_t>(it->second - job.ranks.data());
    };
    for (const auto& c : *comms) {
      if (c.nranks == static_cast<int>(job.ranks.size()) && index_of(c.node, c.pid)) job.communicator = c.comm_id;
    }
    job.peer_group = peer_groups(job.ranks.size(), index_of, *comms, colls);
  }
  // Kernel time per kernel name from the device timeline, when there is one: exact per stretch
  // (the window being diagnosed, and the healthy past before it), where the metric windows may
  // span both.
  std::vector<std::map<std::string, double>> kernels_now(job.ranks.size()), kernels_past(job.ranks.size());
  // One read of the span for every rank (not one per rank: each would look through every rank's
  // rows of the span in the time index).
  store::RowQuery any_order = span;
  any_order.any_order = true;  // summed per process below: the order is of no use
  if (!held) {
    if (auto st = read_span([&] { return s.query_device_activity(any_order); }, &Stats::device, read_dev); !st)
      return st.error();
  }
  const std::span<const store::DeviceActivity> dev_all = held ? held->device.view() : read_dev;
  {
    std::vector<uint64_t> now_from(job.ranks.size()), past_from(job.ranks.size());
    for (size_t i = 0; i < job.ranks.size(); ++i) {
      const auto& st = src[i].steps;
      now_from[i] = st.empty() ? 0 : st[cp > 0 && cp < st.size() ? cp : 0].start_ns;
      past_from[i] = st.empty() ? 0 : st.front().start_ns;
    }
    // Summed by the name's view first (the rows outlive the sums), then by name in order: a map
    // of names looked up per row compared long kernel names a dozen times a row.
    std::vector<std::unordered_map<std::string_view, double>> now_by(job.ranks.size()), past_by(job.ranks.size());
    // Device rows come as the agents sent them (read in any order): a process's are adjacent, and
    // the rank is looked up once per run of them.
    const store::DeviceActivity* run = nullptr;  // the first row of the current run
    RankWindow* run_rank = nullptr;
    for (const auto& d : dev_all) {
      if (!run || run->pid != d.pid || run->node != d.node) {
        run = &d;
        auto it = by_proc.find({d.node, d.pid});
        run_rank = it == by_proc.end() ? nullptr : it->second;
      }
      if (!run_rank) continue;
      RankWindow& r = *run_rank;
      const auto i = static_cast<size_t>(&r - job.ranks.data());
      r.last_device_ns = std::max(r.last_device_ns, d.end_ns);
      if (d.kind != "kernel" || src[i].steps.empty()) continue;
      double dur = ms_of(d.end_ns > d.start_ns ? d.end_ns - d.start_ns : 0);
      if (d.start_ns >= now_from[i]) now_by[i][d.name] += dur;
      else if (cp > 0 && d.start_ns >= past_from[i]) past_by[i][d.name] += dur;
    }
    for (size_t i = 0; i < job.ranks.size(); ++i) {
      kernels_now[i].insert(now_by[i].begin(), now_by[i].end());
      kernels_past[i].insert(past_by[i].begin(), past_by[i].end());
    }
  }

  // Metrics: rates over the recording windows that overlap the analysis window, times the rank's
  // step time, give time per step. (`rows` were read first, above.)
  ByProc<Acc> acc, past_acc;
  // The healthy past starts at the baseline's first step (after warm-up).
  uint64_t past_from_ns = UINT64_MAX;
  for (const auto& rs : src) {
    if (!rs.steps.empty()) past_from_ns = std::min(past_from_ns, rs.steps.front().start_ns);
  }
  // A recording window of the past that began before that step holds some of the job's start, and
  // is warm-up unless the job's start in it is a small share of it (kMaxPastWarmupShare): the time
  // before the first step (the processes' launch, imports, connections) and what the warm-up steps
  // took beyond the job's pace (the slowest rank's; a first step that compiles for a minute is
  // start-up, two steps that took 0.9 s where the job's pace is 0.33 s hold 0.55 s of it). Not
  // the whole warm-up steps: an 8-rank sim on 2 CPUs spent 0.22 s before its first step and
  // 0.88 s in its two warm-up steps, 11% of its first window, and its job-wide I/O stall two
  // windows in had no OS past and went unexplained.
  uint64_t first_step_ns = UINT64_MAX, warmup_excess_ns = 0;
  for (const auto& rs : src) {
    if (rs.first_step_ns) first_step_ns = std::min(first_step_ns, rs.first_step_ns);
    warmup_excess_ns = std::max(warmup_excess_ns, rs.warmup_excess_ns);
  }
  if (first_step_ns > past_from_ns) first_step_ns = past_from_ns;
  auto warm_up = [&](const auto& row) {
    if (row.start_ns >= past_from_ns) return false;
    const double len = row.end_ns > row.start_ns ? static_cast<double>(row.end_ns - row.start_ns) : 0;
    const double before_steps = row.start_ns < first_step_ns ? static_cast<double>(first_step_ns - row.start_ns) : 0;
    return before_steps + static_cast<double>(warmup_excess_ns) > kMaxPastWarmupShare * len;
  };
  struct Gpu {
    double clock = 0, max_clock = 0;
    int clock_n = 0;
    std::map<std::string, std::pair<double, int>> reasons;
    GpuState health;  // the hardware series (model.h), summed / lowest over the window
  };
  // By (node, "gpuN"), both views of the rows' strings: every node has a gpu0.
  struct GpuKey {
    std::string_view node, label;
    bool operator==(const GpuKey&) const = default;
  };
  struct GpuKeyHash {
    size_t operator()(const GpuKey& k) const {
      return std::hash<std::string_view>{}(k.node) * 31 + std::hash<std::string_view>{}(k.label);
    }
  };
  std::unordered_map<GpuKey, Gpu, GpuKeyHash> gpus;
  ByProc<uint64_t> last_seen, last_seen_end;
  ByProc<std::set<uint64_t>> window_starts;  // the rank's recording windows, for the stall's stacks
  struct NeighbourTime {
    Proc rank, neighbour;
    std::string comm;
    double ms;
    bool past;
  };
  std::vector<NeighbourTime> neighbour_time;
  ByProc<std::pair<uint64_t, std::string>> neighbour_name;  // (seen at, name)
  uint64_t latest_window_start = 0;  // of any process: the latest window an agent closed
  ByProc<std::vector<const store::Store::MetricRow*>> in_flight_rows;  // store::kInFlightMetric rows
  // The rows of one process's recording window are adjacent (the span's order: start, node, pid,
  // name, label): what depends on the process and the window alone is looked up once per window,
  // not once per row.
  struct Window {
    const store::Store::MetricRow* first = nullptr;  // the window's first row
    RankWindow* rank = nullptr;                      // the process is this rank's
    RankWindow* worker_of = nullptr;                 // the process is a worker of this rank
    bool before = false;                             // the window ends before the analysis window
    bool counted = false;                            // its metrics count (not warm-up, a past there is)
    Acc* acc = nullptr;                              // where they go, once one does
  } win;
  // The sums the window's metrics go into, `key`'s (the rank's), with the window among them.
  auto acc_of = [&](const Proc& key) -> Acc& {
    if (!win.acc) {
      win.acc = &(win.before ? past_acc : acc)[key];
      win.acc->windows.insert({win.first->start_ns, win.first->end_ns});
    }
    return *win.acc;
  };
  auto same_window = [](const store::Store::MetricRow& a, const store::Store::MetricRow& b) {
    return a.start_ns == b.start_ns && a.end_ns == b.end_ns && a.metric.pid == b.metric.pid && a.node == b.node;
  };
  for (const auto& row : rows) {
    const auto& m = row.metric;
    job.observed_until_ns = std::max(job.observed_until_ns, row.end_ns);
    if (m.pid == 0 && m.name.rfind("gpu.", 0) == 0) {
      if (row.end_ns < job.start_ns) continue;
      auto& g = gpus[{row.node, m.label}];
      if (m.name == "gpu.sm_clock_mhz") g.clock += m.value, ++g.clock_n;
      if (m.name == "gpu.max_sm_clock_mhz") g.max_clock = std::max(g.max_clock, m.value);
      add_gpu_health(g.health, m.name, m.value);
      if (m.name.rfind("gpu.throttle.", 0) == 0) {
        auto& reason = g.reasons[m.name.substr(13)];
        reason.first += m.value;
        ++reason.second;
      }
      continue;
    }
    latest_window_start = std::max(latest_window_start, row.start_ns);
    const Proc proc{row.node, m.pid};
    if (!win.first || !same_window(*win.first, row)) {
      win = Window{};
      win.first = &row;
      // Before the analysis window: the job's healthy past (after a change point), kept apart.
      win.before = row.end_ns < job.start_ns;
      win.counted = !(win.before && (cp == 0 || warm_up(row)));  // else no past, or warm-up
      if (auto it = by_proc.find(proc); it != by_proc.end()) {
        win.rank = it->second;
        last_seen[proc] = std::max(last_seen[proc], row.start_ns);
        window_starts[proc].insert(row.start_ns);
        last_seen_end[proc] = std::max(last_seen_end[proc], row.end_ns);
      } else if (auto w = worker_of.find(proc); w != worker_of.end()) {
        win.worker_of = w->second;
      }
    }
    if (!win.rank) {
      // A worker's OS metrics count for its rank (not its GPU, links or liveness: the rank's own).
      if (!win.worker_of || m.name.rfind("os.", 0) != 0 || m.name == "os.neighbour_run_us" || !win.counted) continue;
      add_os(acc_of({win.worker_of->node, win.worker_of->pid}), m.name, m.label, m.value);
      continue;
    }
    RankWindow& r = *win.rank;
    if (m.name == "gpu.device") r.gpu.index = static_cast<int>(m.value);
    if (m.name == store::kInFlightMetric) {
      // Kept apart: only the rank's latest window says what it is inside now (below).
      in_flight_rows[proc].push_back(&row);
      continue;
    }
    if (!win.counted) continue;
    Acc& a = acc_of(proc);
    const std::string& n = m.name;
    if (n == "gpu.device" || n.rfind("api.", 0) == 0) a.gpu_seen = true;
    if (add_os(a, n, m.label, m.value)) {
    } else if (n == "api.time_us" && m.label.find("LaunchKernel") != std::string::npos) {
      a.sum[static_cast<size_t>(Os::kLaunchApi)] += m.value / 1e3;
      a.seen[static_cast<size_t>(Os::kLaunchApi)] = true;
    } else if (n == "api.memory_coverage") {
      a.memory_coverage[{row.start_ns, row.end_ns}] = m.value;
    } else if ((n == "api.time_us" || n == "api.calls" || n == "api.bytes") && memory_call(m.label) != MemoryCall::kNone) {
      auto& v = a.memory[{row.start_ns, row.end_ns}][m.label];
      if (n == "api.time_us") v[0] += m.value / 1e3;
      else if (n == "api.calls") v[1] += m.value;
      else v[2] += m.value / 1e6;
    }
    else if (n == "os.neighbour_run_us") {
      // "comm:pid"; the job's own processes are not neighbours (job_pids above). Named below by
      // the latest name it ran under, else its recorded name: a process renamed mid-run (exec,
      // prctl) is one neighbour.
      auto colon = m.label.rfind(':');
      std::string comm = colon == std::string::npos ? m.label : m.label.substr(0, colon);
      uint32_t npid = colon == std::string::npos ? 0 : static_cast<uint32_t>(std::strtoul(m.label.c_str() + colon + 1, nullptr, 10));
      const Proc neighbour{row.node, npid};  // on the rank's own node
      if (job_procs.count(neighbour)) continue;
      auto& latest = neighbour_name[neighbour];
      if (row.end_ns >= latest.first) latest = {row.end_ns, comm};
      neighbour_time.push_back({proc, neighbour, comm, m.value / 1e3, win.before});
    } else if (n == "os.cpu_time_by_cpu_us") {
      a.placement[m.label] += m.value;
    } else if (n == "gpu.kernel_us") {
      a.kernels[m.label] += m.value / 1e3;
    } else if (n == "gpu.kernel_count") {
      // Kernels only: the timeline names copies and sets "[CUDA memcpy]", "[CUDA memset]".
      a.seen[static_cast<size_t>(Os::kKernels)] = true;
      if (m.label.rfind('[', 0) != 0) a.sum[static_cast<size_t>(Os::kKernels)] += m.value;
    } else if (n.rfind("net.tcp_", 0) == 0) {
      auto gt = m.label.find('>');
      if (gt == std::string::npos) continue;
      TcpLink& l = a.links[m.label];
      l.local = m.label.substr(0, gt);
      l.remote = m.label.substr(gt + 1);
      if (n == "net.tcp_sent_bytes") l.sent_bytes += m.value;
      else if (n == "net.tcp_received_bytes") l.received_bytes += m.value;
      else if (n == "net.tcp_busy_us") l.busy_ms += m.value / 1e3;
      else if (n == "net.tcp_srtt_us") l.srtt_ms = known(l.srtt_ms) ? std::max(l.srtt_ms, m.value / 1e3) : m.value / 1e3;
    }
  }

  for (const auto& t : neighbour_time) {
    // By the latest name it ran under (the agent names a neighbour as it is at the window's end),
    // else a recorded process by its recorded name. Not the recorded name first: that is read when
    // the process is found, right after its exec, and a process that renames itself then (a hog
    // started by the job's launcher, "python3" at its exec, "strata-hog" from its first line on)
    // was named "python3" on a DDP run: the name of every other Python process of the node.
    auto rn = recorded_name.find(t.neighbour);
    const auto& latest = neighbour_name[t.neighbour];
    std::string name = !latest.second.empty() ? latest.second : rn != recorded_name.end() && t.neighbour.pid ? rn->second : t.comm;
    Acc& a = (t.past ? past_acc : acc)[t.rank];
    // The agent is never a neighbour: its time is its cost, said apart (RankWindow::agent_ms).
    if (is_agent(name) || is_agent(t.comm)) {
      a.agent_ms += t.ms;
      a.agent_seen = true;
    } else {
      a.neighbours[name] += t.ms;
    }
  }

  if (auto st = load_memory_call_sites(s, span, job.start_ns, job, by_proc, stats); !st) return st.error();

  // The job's healthy past of a rank: its own node's windows wholly before the analysis window
  // (past_acc), none without a change point.
  auto past_span_of = [&](const RankWindow& r) -> std::optional<store::RowQuery> {
    auto pw = past_acc.find(Proc{r.node, r.pid});
    if (cp <= 0 || r.base.steps == 0 || pw == past_acc.end() || pw->second.windows.empty()) return std::nullopt;
    store::RowQuery past_span = span;
    past_span.from_ns = pw->second.windows.begin()->first;
    uint64_t past_to = 0;
    for (const auto& [from, to] : pw->second.windows) past_to = std::max(past_to, to);
    past_span.to_ns = past_to;
    return past_span;
  };
  {
    // Every node's past stacks in one read where the store can (one round trip per node and kind
    // made a ClickHouse round at 1,000 nodes take 20-30 s); load_profile below finds them read.
    std::vector<store::ProfileFilter> pasts;
    for (const auto& r : job.ranks) {
      auto ps = past_span_of(r);
      if (!ps) continue;
      for (auto kind : {store::CountKind::kOnCpu, store::CountKind::kOffCpu}) {
        store::ProfileFilter f;
        f.from_ns = ps->from_ns;
        f.to_ns = ps->to_ns;
        f.recording = ps->recording;
        f.kind = kind;
        f.node = r.node;
        pasts.push_back(std::move(f));
      }
    }
    if (auto st = profiles.prefetch(pasts); !st) return st.error();
  }

  for (auto& r : job.ranks) {
    if (cancelled()) return kCancelled;
    // Still there after its last progress: a metric window that began later has it.
    // ... and still there at the end: its last window reaches into the latest window anyone closed.
    // A rank that exits after its last step (a job's teardown can take seconds) is not hung.
    const Proc proc{r.node, r.pid};
    r.alive = last_seen.count(proc) && last_seen[proc] > r.last_progress_ns &&
              last_seen_end[proc] > latest_window_start;
    if (auto ls = last_seen.find(proc); ls != last_seen.end()) r.last_seen_ns = ls->second;
    if (auto le = last_seen_end.find(proc); le != last_seen_end.end()) r.observed_until_ns = le->second;
    // Rates over the windows, times the step time: per step.
    auto per_step_of = [](const Acc& a, double step_ms) {
      double dur_ms = 0;
      for (const auto& w : a.windows) dur_ms += ms_of(w.second - w.first);
      return dur_ms > 0 && known(step_ms) ? step_ms / dur_ms : 0;
    };
    auto fill = [&](const Acc& a, double per_step, std::array<double, kOsCount>& os, Values& neighbours, Values& kernels) {
      for (size_t k = 0; k < kOsCount; ++k) {
        if (a.seen[k]) os[k] = a.sum[k] * per_step;
      }
      for (const auto& [name, v] : a.neighbours) neighbours.push_back({job.names.id(name), v * per_step});
      for (const auto& [name, v] : a.kernels) kernels.push_back({job.names.id(name), v * per_step});
      normalize(neighbours);
      normalize(kernels);
    };
    auto it = acc.find(proc);
    if (it != acc.end() && known(r.now.step_ms)) {
      Acc& a = it->second;
      double per_step = per_step_of(a, r.now.step_ms);
      fill(a, per_step, r.os, r.neighbours, r.kernels);
      for (const auto& [source, v] : a.irq_sources) r.irq_sources.push_back({job.names.id(source), v * per_step});
      normalize(r.irq_sources);
      if (a.bio_lat_n > 0) r.set(Os::kBioLatency, a.bio_lat_sum / a.bio_lat_n);
      if (a.agent_seen) r.agent_ms = a.agent_ms * per_step;
      fill_memory(a, r.now.step_ms, job.start_ns, r.os, &r.memory_api_ms, &r.memory_api_calls, &r.memory_api_mb, job.names);
      for (auto& [label, l] : a.links) r.links.push_back(std::move(l));
      double placed = 0;
      for (const auto& [cpu, us] : a.placement) placed += us;
      for (const auto& [cpu, us] : a.placement)
        if (placed > 0) r.cpu_placement.push_back({cpu, us / placed});
      std::sort(r.cpu_placement.begin(), r.cpu_placement.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
    }
    size_t index = static_cast<size_t>(&r - job.ranks.data());
    auto per_kernel = [&](const std::map<std::string, double>& m, uint32_t steps, Values& out) {
      if (m.empty() || steps == 0) return;
      out.clear();
      for (const auto& [name, v] : m) out.push_back({job.names.id(name), v / steps});
      normalize(out);
    };
    per_kernel(kernels_now[index], r.now.steps, r.kernels);
    auto pt = past_acc.find(proc);
    if (pt != past_acc.end() && known(r.base.step_ms)) {
      fill(pt->second, per_step_of(pt->second, r.base.step_ms), r.past.os, r.past.neighbours, r.past.kernels);
      fill_memory(pt->second, r.base.step_ms, 0, r.past.os, nullptr, nullptr, nullptr, job.names);
    }
    per_kernel(kernels_past[index], cp > 0 ? r.base.steps : 0, r.past.kernels);
    if (r.gpu.index >= 0) {
      const std::string label = "gpu" + std::to_string(r.gpu.index);
      auto g = gpus.find({r.node, label});
      if (g != gpus.end()) {
        r.gpu.known = true;
        copy_gpu_health(g->second.health, r.gpu);
        if (g->second.clock_n > 0 && g->second.max_clock > 0) {
          r.gpu.sm_clock_ratio = g->second.clock / g->second.clock_n / g->second.max_clock;
        }
        for (const auto& [reason, v] : g->second.reasons) {
          // Idle and application-clock "reasons" are normal states, not a slow GPU.
          if (reason == "gpu_idle" || reason == "applications_clocks_setting") continue;
          if (v.second > 0 && v.first / v.second >= 0.3) {
            r.gpu.throttle_reasons += (r.gpu.throttle_reasons.empty() ? "" : ",") + reason;
          }
        }
      }
    }
    const auto& rank_steps = steps_by_proc[proc];
    double steps = static_cast<double>(std::max<size_t>(1, rank_steps.size()));
    // After a change point, the stacks of the windows from it on: a problem that began within the
    // span is not diluted by the healthy stretch before it (that stretch is the past, below).
    store::RowQuery now_span = span;
    if (cp > 0 && job.start_ns > now_span.from_ns.value_or(0)) now_span.from_ns = job.start_ns;
    // Which function makes a system call is read from the whole span's on-CPU stacks: the few
    // samples inside a call are too few in the stretch alone to name its caller.
    const bool split = now_span.from_ns != span.from_ns;
    const ProfileUse times = split ? ProfileUse::kTimes : ProfileUse::kAll;
    std::vector<uint32_t> procs{r.pid};
    procs.insert(procs.end(), r.workers.begin(), r.workers.end());
    for (uint32_t p : procs) {
      const uint32_t who = p == r.pid ? 0 : p;
      for (auto kind : {store::CountKind::kOnCpu, store::CountKind::kOffCpu}) {
        if (auto st = load_profile(profiles, now_span, job, r, kind, steps, rank_steps, stats, std::nullopt, nullptr, who, times); !st)
          return st.error();
      }
      if (split) {
        if (auto st = load_profile(profiles, span, job, r, store::CountKind::kOnCpu, steps, rank_steps, stats, std::nullopt, nullptr,
                                   who, ProfileUse::kCallers);
            !st)
          return st.error();
      }
    }
    // The past's stacks come from the very windows its OS metrics came from (past_acc: wholly
    // before the analysis window, warm-up left out). Not "everything before the analysis window":
    // the window that straddles its start is no past, and asking for a span that reaches into it
    // gave a past with no stacks at all, against which every function of the window "grew" (a
    // healthy DDP job's backward was named a job-wide hotspot so, its whole time counted as growth).
    if (auto ps = past_span_of(r)) {
      double base_steps = static_cast<double>(r.base.steps);
      const store::RowQuery& past_span = *ps;
      const uint64_t past_to = *past_span.to_ns;
      for (auto kind : {store::CountKind::kOnCpu, store::CountKind::kOffCpu}) {
        if (auto st = load_profile(profiles, past_span, job, r, kind, base_steps, rank_steps, stats, past_to, &r.past); !st)
          return st.error();
        for (uint32_t w : r.workers) {
          if (auto st = load_profile(profiles, past_span, job, r, kind, base_steps, rank_steps, stats, past_to, &r.past, w); !st)
            return st.error();
        }
      }
    }
  }
  // The job's own past per layer, from the healthy stretch before the change point: the same
  // JobBaseline a collector keeps between rounds, here from one stretch (the baseline steps).
  if (cp > 0) {
    JobWindow healthy;
    healthy.job = job.job;
    healthy.names = job.names;
    for (const auto& r : job.ranks) {
      RankWindow h;
      h.rank = r.rank;
      h.node = r.node;
      h.pid = r.pid;
      h.now = r.base;
      h.now.steps = r.base.steps;
      h.os = r.past.os;
      h.kernels = r.past.kernels;
      h.oncpu = r.past.oncpu;
      h.offcpu = r.past.offcpu;
      h.neighbours = r.past.neighbours;
      healthy.ranks.push_back(std::move(h));
    }
    JobBaseline baseline;
    baseline.absorb(healthy);
    for (auto& r : job.ranks) r.past = RankPast{};
    baseline.apply(job);
  }
  // The calls each rank was inside at the end of its latest window (a call that returned since has
  // no row in a later window): the collective it is stuck in, when it is stuck, even where the
  // call is recorded only when it returns (gloo). The rank's progress on that communicator then
  // ends in this call, entered and not completed. (A process that died inside a call has it in
  // the window of its exit, its last: the agent reports the calls it died inside.)
  for (auto& [proc, rows_of] : in_flight_rows) {
    RankWindow& r = *by_proc[proc];
    const uint64_t latest = last_seen[proc];
    for (const auto* row : rows_of) {
      if (row->start_ns != latest) continue;
      auto call = store::parse_in_flight_label(row->metric.label);
      if (!call || !(row->metric.value >= 0)) continue;  // not a label this loader knows: ignored
      InFlight f{call->library, call->op, call->comm_id, call->seq, 0, row->end_ns};
      const double inside_ns = row->metric.value * 1e9;
      f.entered_ns = inside_ns < static_cast<double>(row->end_ns) ? row->end_ns - static_cast<uint64_t>(inside_ns) : 0;
      r.in_flight.push_back(f);
      if (f.library == "cuda") continue;  // a synchronize: no call of a communicator
      auto cp_it = std::find_if(r.comms.begin(), r.comms.end(), [&](const CommProgress& p) { return p.comm == f.comm; });
      if (cp_it == r.comms.end()) {
        r.comms.push_back({});
        cp_it = r.comms.end() - 1;
        cp_it->comm = f.comm;
      }
      CommProgress& p = *cp_it;
      // Later than every call that returned: by number where the two are numbered alike (per
      // communicator; gloo per op), else by entry. The same number returned: the call did.
      const bool numbered = f.seq > 0 && p.last_seq > 0 && (f.library != "gloo" || p.last_op == f.op);
      const bool later = numbered ? f.seq > p.last_seq : f.entered_ns >= p.last_enter_ns;
      if (p.calls > 0 && !later) continue;
      ++p.calls;
      p.last_seq = f.seq;
      p.last_op = f.op;
      p.last_bytes = 0;  // not read at entry
      p.last_enter_ns = f.entered_ns;
      p.last_completed = false;
      p.in_flight = true;
    }
  }
  for (const auto& r : job.ranks) job.observed_until_ns = std::max(job.observed_until_ns, r.last_progress_ns);
  // A job that made no progress for a while: where each rank's threads were since its last
  // progress (a hang's evidence: what the hung rank did while the others waited).
  uint64_t last_progress = 0;
  for (const auto& r : job.ranks) last_progress = std::max(last_progress, r.last_progress_ns);
  if (last_progress > 0 && job.observed_until_ns > last_progress &&
      static_cast<double>(job.observed_until_ns - last_progress) >= opt.stall_stacks_s * 1e9) {
    // The windows that began after the last progress hold the stall alone; only when none did (a
    // stall shorter than a window) the one around it.
    auto stall_from = [&](const RankWindow& r) {
      uint64_t from = last_progress;
      const auto& starts = window_starts[{r.node, r.pid}];
      if (auto w = starts.lower_bound(last_progress); w != starts.end()) from = *w + 1;
      return from;
    };
    {
      // Every node's stall stacks in one read where the store can (as the past's above).
      std::vector<store::ProfileFilter> stalls;
      for (const auto& r : job.ranks) {
        for (auto kind : {store::CountKind::kOnCpu, store::CountKind::kOffCpu}) {
          store::ProfileFilter f;
          f.from_ns = stall_from(r);
          f.to_ns = span.to_ns;
          f.node = r.node;
          f.recording = span.recording;
          f.kind = kind;
          stalls.push_back(std::move(f));
        }
      }
      if (auto st = profiles.prefetch(stalls); !st) return st.error();
    }
    for (auto& r : job.ranks) {
      if (cancelled()) return kCancelled;
      const uint64_t from = stall_from(r);
      std::vector<uint32_t> pids{r.pid};
      pids.insert(pids.end(), r.workers.begin(), r.workers.end());
      for (uint32_t pid : pids) {
        for (auto kind : {store::CountKind::kOnCpu, store::CountKind::kOffCpu}) {
          if (auto st = load_stall_stacks(profiles, span, from, job, r, kind, stats, pid); !st) return st.error();
        }
      }
    }
  }
  // A name the stacks show both inside the runtime's libraries and outside them (an inlined
  // "push_back" or "allocate" of the C++ library's, in libcudart and in the program) says nothing
  // of where it runs: only names seen in the runtime alone count as the runtime's.
  for (const auto& name : job.frames_outside_runtime) job.cuda_runtime_frames.erase(name);
  job.frames_outside_runtime.clear();
  return job;
}

namespace {

// The end of job `job`'s latest step (none: it has no step, or no process of that name). Read
// from `from_ns` on first (the store's latest stretch: a running job's latest step is there), then,
// for a job that ended before it, over the job's whole history (steps are one row per rank and step).
Result<std::optional<uint64_t>> job_latest_step_ns(store::Reader& s, std::optional<int64_t> recording, const std::string& job,
                                                   uint64_t from_ns) {
  auto procs = s.processes(recording);
  if (!procs) return procs.error();
  std::set<std::pair<std::string, uint32_t>> mine;
  for (const auto& p : *procs) {
    if (p.job == job) mine.insert({p.node, p.pid});
  }
  if (mine.empty()) return std::optional<uint64_t>{};
  store::RowQuery q;
  q.recording = recording;
  q.any_order = true;
  q.keep_process = [&](std::string_view node, uint32_t pid) { return mine.count({std::string(node), pid}) > 0; };
  for (uint64_t from : {from_ns, uint64_t{0}}) {
    q.from_ns = from;
    auto steps = s.query_steps(q);
    if (!steps) return steps.error();
    std::optional<uint64_t> latest;
    for (const auto& st : *steps) latest = std::max(latest.value_or(0), st.end_ns);
    if (latest || from == 0) return latest;
  }
  return std::optional<uint64_t>{};
}

}  // namespace

Result<JobWindow> load_latest_with_baseline(store::Reader& s, LoadOptions opt, uint64_t latest_ns, uint64_t baseline_ns) {
  auto rec = s.latest_recording();
  if (!rec) return rec.error();
  if (!*rec) return Error{"the store holds no recording"};
  const std::optional<int64_t> which = opt.all_recordings ? std::nullopt : std::optional<int64_t>(**rec);
  auto latest = s.latest_step_ns(which);
  if (!latest) return latest.error();
  if (!*latest) return no_step_error(s, which);
  if (!opt.job.empty()) {
    // A job named: the span counts back from its own latest step. One that ended before another
    // began has no step in the store's latest stretch (it read as healthy, with no step at all).
    auto own = job_latest_step_ns(s, which, opt.job, **latest > latest_ns ? **latest - latest_ns : 0);
    if (!own) return own.error();
    if (*own) latest = own;
  }
  const uint64_t now_from = **latest > latest_ns ? **latest - latest_ns : 0;
  LoadOptions now = opt;
  now.from_ns = now_from;
  now.to_ns.reset();
  now.last_ns.reset();
  auto window = load_job_window(s, now);
  if (!window || now_from == 0) return window;  // the store holds no earlier stretch
  // The stretch before: the job's past when it was healthy (no finding); a stretch that was itself
  // slow, or too short to diagnose, is no baseline (the window is then compared with its peers and
  // with its own start alone).
  LoadOptions before = opt;
  before.job = window->job;
  before.from_ns = now_from > baseline_ns ? now_from - baseline_ns : 0;
  before.to_ns = now_from;
  before.last_ns.reset();
  auto past = load_job_window(s, before);
  if (!past) return window;
  if (!may_join_past(diagnose(*past))) return window;
  JobBaseline baseline;
  baseline.absorb(*past);
  baseline.apply(*window);
  return window;
}

}  // namespace strata::diagnose
