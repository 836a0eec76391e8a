#include "diagnose/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include "diagnose/stats.h"

namespace strata::diagnose {

// "(anonymous namespace)::cpu_work(unsigned char const*, long) [clone .isra.0]" -> "cpu_work": the
// name a person searches the code for.
std::string short_function(std::string_view name) {
  // GCC's clones keep the original's demangled name plus " [clone .isra.0]" (.constprop, .cold, ...).
  for (auto at = name.rfind(" [clone "); at != std::string_view::npos && name.back() == ']'; at = name.rfind(" [clone "))
    name = name.substr(0, at);
  if (name.size() > 2 && name.back() == ')') {
    int depth = 0;
    for (size_t i = name.size(); i-- > 0;) {
      if (name[i] == ')') ++depth;
      if (name[i] == '(' && --depth == 0) {
        if (i > 0) name = name.substr(0, i);
        break;
      }
    }
  }
  // Drop namespaces and classes, but not inside template arguments.
  int angle = 0;
  size_t cut = 0;
  for (size_t i = 0; i + 1 < name.size(); ++i) {
    if (name[i] == '<') ++angle;
    if (name[i] == '>') --angle;
    if (angle == 0 && name[i] == ':' && name[i + 1] == ':') cut = i + 2;
  }
  return std::string(name.substr(cut));
}

// "a;b;c" -> {"a", "b", "c"}: a call path's frames, root first.
std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(';', start);
    if (end == std::string_view::npos) end = path.size();
    out.push_back(path.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

namespace {

// Peers are compared through medians; beyond this many ranks a deterministic, evenly strided sample
// gives the same medians at a fraction of the cost (100k ranks in one window).
constexpr size_t kMaxPeers = 1000;
// At most this many straggler findings per window: beyond it the job is not "a few slow ranks".
constexpr size_t kMaxStragglers = 16;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string ms(double v) { return fmt(v >= 100 ? "%.0f ms" : v >= 10 ? "%.1f ms" : "%.2f ms", v); }

double clamp01(double v) { return std::max(0.0, std::min(1.0, v)); }

// Indices of the ranks `c` is compared with: all others, or an even sample of them.
std::vector<size_t> peers_of(const JobWindow& job, size_t c) {
  std::vector<size_t> out;
  size_t n = job.ranks.size();
  size_t stride = n > kMaxPeers ? n / kMaxPeers : 1;
  for (size_t i = 0; i < n; i += stride) {
    if (i != c) out.push_back(i);
  }
  return out;
}

template <typename F>
double peer_median(const JobWindow& job, const std::vector<size_t>& peers, F get) {
  std::vector<double> v;
  v.reserve(peers.size());
  for (size_t p : peers) v.push_back(get(job.ranks[p]));
  return median(std::move(v));
}

template <typename F>
std::vector<double> column(const JobWindow& job, F get) {
  std::vector<double> v;
  v.reserve(job.ranks.size());
  for (const auto& r : job.ranks) v.push_back(get(r));
  return v;
}

// Culprit minus its peers' median; 0 when either side is unknown.
template <typename F>
double excess(const JobWindow& job, size_t c, const std::vector<size_t>& peers, F get) {
  double mine = get(job.ranks[c]);
  double theirs = peer_median(job, peers, get);
  if (!known(mine) || !known(theirs)) return 0;
  return mine - theirs;
}

double os_excess(const JobWindow& job, size_t c, const std::vector<size_t>& peers, Os m) {
  return excess(job, c, peers, [m](const RankWindow& r) { return r.get(m); });
}

// Time per step under each call-path prefix (inclusive: a function's callees count for it).
std::unordered_map<std::string, double> inclusive(const JobWindow& job, const Values& paths) {
  std::unordered_map<std::string, double> out;
  for (const auto& v : paths) {
    const std::string& path = job.names.name(v.name);
    size_t pos = 0;
    while (true) {
      size_t end = path.find(';', pos);
      out[path.substr(0, end)] += v.ms_per_step;
      if (end == std::string::npos) break;
      pos = end + 1;
    }
  }
  return out;
}

// The differential profile of the culprit against its peers: the call path where the extra time
// starts. Among prefixes that carry most of the extra time, the one whose time is most "new"
// (absent on peers) wins; ties go to the shallowest, where the divergence begins (slow_augment, not
// the cpu_work it calls).
struct PathDiff {
  std::string path;
  std::string function;  // short name of the path's last frame
  std::string caller;
  double excess_ms = 0;
  double culprit_ms = 0;
  double peers_ms = 0;
};

std::optional<PathDiff> differential_profile(const JobWindow& job, size_t c, const std::vector<size_t>& peers,
                                             Values RankWindow::*field) {
  auto mine = inclusive(job, job.ranks[c].*field);
  if (mine.empty()) return std::nullopt;
  // Profiles are the heaviest part of a rank: compare with at most 64 peers.
  std::vector<std::unordered_map<std::string, double>> theirs;
  size_t stride = std::max<size_t>(1, peers.size() / 64);
  for (size_t i = 0; i < peers.size(); i += stride) theirs.push_back(inclusive(job, job.ranks[peers[i]].*field));
  if (theirs.empty()) return std::nullopt;
  struct Cand {
    const std::string* path;
    double excess, mine, peer, newness;
    size_t depth;
  };
  std::vector<Cand> cands;
  double best_excess = 0;
  for (const auto& [path, value] : mine) {
    std::vector<double> pv;
    pv.reserve(theirs.size());
    for (const auto& t : theirs) {
      auto it = t.find(path);
      pv.push_back(it == t.end() ? 0 : it->second);
    }
    double p = median(std::move(pv));
    double e = value - p;
    if (e <= 0) continue;
    size_t depth = static_cast<size_t>(std::count(path.begin(), path.end(), ';'));
    cands.push_back({&path, e, value, p, e / value, depth});
    best_excess = std::max(best_excess, e);
  }
  if (cands.empty()) return std::nullopt;
  std::erase_if(cands, [&](const Cand& k) { return k.excess < 0.5 * best_excess; });
  // First choice: the shallowest frame the peers (almost) never run — where the new behaviour
  // begins (slow_augment, not the cpu_work it calls, nor main above it).
  // Frames the peers never ran at all come before frames they ran rarely: with few samples (a rank
  // that mostly waits) the root frames of the peers can look "rare" too.
  const Cand* pick = nullptr;
  for (double rare : {0.0, 0.1}) {
    for (const auto& k : cands) {
      if (k.peer > rare * k.mine) continue;
      if (!pick || k.depth < pick->depth || (k.depth == pick->depth && k.excess > pick->excess)) pick = &k;
    }
    if (pick) break;
  }
  // Else: the path whose time is most of all extra, the deeper on ties.
  if (!pick) {
    for (const auto& k : cands) {
      if (!pick || k.newness > pick->newness + 0.02 || (k.newness > pick->newness - 0.02 && k.depth > pick->depth)) pick = &k;
    }
  }
  PathDiff d;
  d.path = *pick->path;
  auto frames = split_path(d.path);
  d.function = short_function(frames.back());
  if (frames.size() >= 2) d.caller = short_function(frames[frames.size() - 2]);
  d.excess_ms = pick->excess;
  d.culprit_ms = pick->mine;
  d.peers_ms = pick->peer;
  return d;
}

// Off-CPU, the function to name is the one that made the blocking call: on the blocked path that
// grew most, the deepest frame that is neither the system call ("pread64()") nor a libc wrapper
// ("__libc_pread64"). A thread blocked in I/O may have no user stack: then the system call.
std::optional<PathDiff> blocking_caller(const JobWindow& job, size_t c, const std::vector<size_t>& peers) {
  std::optional<PathDiff> best;
  for (const auto& v : job.ranks[c].offcpu) {
    double p = peer_median(job, peers, [&](const RankWindow& r) { return value_of(r.offcpu, v.name); });
    double e = v.ms_per_step - p;
    if (e <= 0 || (best && e <= best->excess_ms)) continue;
    PathDiff d;
    d.path = job.names.name(v.name);
    d.excess_ms = e;
    d.culprit_ms = v.ms_per_step;
    d.peers_ms = p;
    best = d;
  }
  if (!best) return best;
  auto frames = split_path(best->path);
  best->function = frames.back() == "[kernel]" ? "block I/O (no user stack)" : std::string(frames.back());
  for (size_t i = frames.size(); i-- > 0;) {
    std::string_view f = frames[i];
    bool syscall = f.size() > 2 && f.substr(f.size() - 2) == "()";
    if (syscall || f.rfind("__", 0) == 0) continue;
    best->function = short_function(f);
    if (i > 0) best->caller = short_function(frames[i - 1]);
    break;
  }
  return best;
}

// The system call a blocked path ends in ("pread64()"), else empty.
std::string syscall_in(const std::string& path) {
  auto frames = split_path(path);
  for (size_t i = frames.size(); i-- > 0;) {
    std::string_view f = frames[i];
    if (f.size() > 2 && f.substr(f.size() - 2) == "()") return std::string(f);
  }
  return {};
}

bool io_syscall(std::string_view sc) {
  for (std::string_view io : {"read()", "pread64()", "readv()", "preadv()", "preadv2()", "io_uring_enter()",
                              "io_getevents()", "io_pgetevents()", "fsync()", "fdatasync()", "sync_file_range()",
                              "openat()", "write()", "pwrite64()", "writev()", "pwritev()", "pwritev2()",
                              "sendfile64()", "copy_file_range()", "splice()"}) {
    if (sc == io) return true;
  }
  return false;
}

// Where rank c makes the blocking call: of its on-CPU time inside `syscall` (any I/O call when
// empty), the caller with the most. A blocked read's off-CPU stack often has no user frames; the
// same call sampled on-CPU names the function. Unwound by frame pointers through libc's frameless
// wrapper, a stack skips the immediate caller ("main;__libc_pread" for "main;load_batch;
// __libc_pread"): a caller that is an ancestor on another site's path counts for that deeper site.
struct CallSite {
  std::string syscall, caller;
  double ms = 0;
  // The culprit's name: "load_batch (pread64)".
  std::string name() const { return caller + " (" + syscall.substr(0, syscall.size() - 2) + ")"; }
};
std::optional<CallSite> call_site(const JobWindow& job, size_t c, const std::string& syscall) {
  struct Site {
    std::string sc;
    std::vector<std::string> frames;  // short names, root first; the caller last
    double ms;
  };
  std::vector<Site> sites;
  for (const auto& v : job.ranks[c].syscall_callers) {
    const std::string& key = job.names.name(v.name);
    auto bar = key.find('|');
    if (bar == std::string::npos) continue;
    std::string_view sc(key.data(), bar);
    if (!syscall.empty() ? sc != syscall : !io_syscall(sc)) continue;
    Site s{std::string(sc), {}, v.ms_per_step};
    for (auto f : split_path(std::string_view(key).substr(bar + 1))) s.frames.push_back(short_function(f));
    if (!s.frames.empty()) sites.push_back(std::move(s));
  }
  std::map<std::pair<std::string, std::string>, double> by_caller;  // (syscall, caller) -> ms
  for (const auto& s : sites) {
    const Site* deeper = nullptr;
    for (const auto& t : sites) {
      if (t.sc != s.sc || t.frames.size() < 2) continue;
      bool ancestor = std::find(t.frames.begin(), t.frames.end() - 1, s.frames.back()) != t.frames.end() - 1;
      if (ancestor && (!deeper || t.ms > deeper->ms)) deeper = &t;
    }
    by_caller[{s.sc, (deeper ? deeper : &s)->frames.back()}] += s.ms;
  }
  std::optional<CallSite> best;
  for (const auto& [k, ms] : by_caller) {
    if (!best || ms > best->ms) best = CallSite{k.first, k.second, ms};
  }
  return best;
}

// The foreign process that runs most on the culprit's CPUs beyond what its peers see.
struct NeighbourDiff {
  std::string name;
  double excess_ms = 0, culprit_ms = 0;
};
std::optional<NeighbourDiff> top_neighbour(const JobWindow& job, size_t c, const std::vector<size_t>& peers,
                                           bool absolute) {
  std::optional<NeighbourDiff> best;
  for (const auto& v : job.ranks[c].neighbours) {
    double p = absolute ? 0 : peer_median(job, peers, [&](const RankWindow& r) { return value_of(r.neighbours, v.name); });
    double e = v.ms_per_step - p;
    if (e > 0 && (!best || e > best->excess_ms)) best = NeighbourDiff{job.names.name(v.name), e, v.ms_per_step};
  }
  return best;
}

struct Hypothesis {
  std::string cause;
  std::string culprit;
  double explained_ms = 0;
  double confidence = 0.5;
  std::vector<std::string> evidence;
  std::string advice;
};

std::string rank_name(const RankWindow& r) { return "rank " + std::to_string(r.rank); }

// A slow link seen in the ranks' TCP connections. The sender of a connection measures its smoothed
// RTT; both sides of a connection are found by its endpoints. A rank whose own link (NIC, cable,
// port) is slow has every connection through it slow, in and out; a rank next to it has one slow
// connection (to it) and the others fast. So each rank scores the fastest of its bulk connections
// (those that carry a real share of the job's traffic: control connections with delayed ACKs have
// long RTTs of their own), and the culprit is the rank whose fastest connection is slow.
struct SlowLinks {
  size_t culprit = 0;                 // index into job.ranks
  std::vector<std::string> peers;     // its peers over bulk connections ("rank 3", or an endpoint)
  double fastest_ms = 0;              // the RTT of its fastest bulk connection
  double next_ms = 0;                 // the same for the runner-up rank
  double median_ms = 0;               // the median bulk connection's RTT
  size_t connections = 0;             // bulk connections
  bool unique = false;                // clearly ahead of the runner-up (2x)
};

std::optional<SlowLinks> find_slow_links(const JobWindow& job) {
  // Loopback addresses are only unique within a node.
  auto key = [&](const RankWindow& r, const std::string& ep) {
    bool loop = ep.rfind("127.", 0) == 0 || ep.rfind("[::1]", 0) == 0;
    return loop ? r.node + "/" + ep : ep;
  };
  // The peer's side of "L>R" is its "R>L"; accepted connections share their listener's local
  // endpoint, so an endpoint alone names the peer only when its side was not recorded.
  std::unordered_map<std::string, size_t> owner;
  double max_sent = 0;
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    for (const auto& l : job.ranks[i].links) {
      owner.emplace(key(job.ranks[i], l.local) + ">" + key(job.ranks[i], l.remote), i);
      owner.emplace(key(job.ranks[i], l.local), i);
      max_sent = std::max(max_sent, l.sent_bytes);
    }
  }
  if (max_sent <= 0) return std::nullopt;
  struct Conn {
    std::string peer;
    double rtt_ms;
  };
  std::vector<std::vector<Conn>> conns(job.ranks.size());
  std::vector<double> rtts;
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    for (const auto& l : job.ranks[i].links) {
      if (!(l.sent_bytes >= 0.05 * max_sent && known(l.srtt_ms))) continue;
      rtts.push_back(l.srtt_ms);
      auto o = owner.find(key(job.ranks[i], l.remote) + ">" + key(job.ranks[i], l.local));
      if (o == owner.end()) o = owner.find(key(job.ranks[i], l.remote));
      bool paired = o != owner.end() && o->second != i;
      conns[i].push_back({paired ? rank_name(job.ranks[o->second]) : l.remote, l.srtt_ms});
      if (paired) conns[o->second].push_back({rank_name(job.ranks[i]), l.srtt_ms});
    }
  }
  if (rtts.size() < 2) return std::nullopt;
  SlowLinks out;
  out.connections = rtts.size();
  out.median_ms = median(std::move(rtts));
  std::vector<std::pair<double, size_t>> fastest;  // (its fastest bulk connection's RTT, rank index)
  for (size_t i = 0; i < conns.size(); ++i) {
    if (conns[i].empty()) continue;
    double f = conns[i].front().rtt_ms;
    for (const auto& c : conns[i]) f = std::min(f, c.rtt_ms);
    fastest.push_back({f, i});
  }
  if (fastest.size() < 2) return std::nullopt;
  std::sort(fastest.begin(), fastest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  out.culprit = fastest[0].second;
  out.fastest_ms = fastest[0].first;
  out.next_ms = fastest[1].first;
  // Slow at all: 1.5x the runner-up and 1 ms above it; else the links say nothing.
  if (!(out.fastest_ms >= 1.5 * out.next_ms && out.fastest_ms >= out.next_ms + 1.0)) return std::nullopt;
  out.unique = out.fastest_ms >= 2 * out.next_ms;
  std::set<std::string> peers;
  for (const auto& c : conns[out.culprit]) peers.insert(c.peer);
  out.peers.assign(peers.begin(), peers.end());
  return out;
}

// Kernels whose time grew most on the culprit: "ampere_sgemm_128x64_tn 10.0 ms vs 5.0 ms".
std::string kernel_evidence(const JobWindow& job, size_t c, const std::vector<size_t>& peers) {
  struct K {
    std::string name;
    double mine, theirs;
  };
  std::vector<K> ks;
  for (const auto& v : job.ranks[c].kernels) {
    double p = peer_median(job, peers, [&](const RankWindow& r) { return value_of(r.kernels, v.name); });
    if (v.ms_per_step - p > 0) ks.push_back({job.names.name(v.name), v.ms_per_step, p});
  }
  std::sort(ks.begin(), ks.end(), [](const K& a, const K& b) { return a.mine - a.theirs > b.mine - b.theirs; });
  std::string out;
  for (size_t i = 0; i < ks.size() && i < 3; ++i) {
    if (!out.empty()) out += "; ";
    out += short_function(ks[i].name) + " " + ms(ks[i].mine) + " vs " + ms(ks[i].theirs);
    if (ks[i].theirs > 0) out += fmt(" (x%.2f)", ks[i].mine / ks[i].theirs);
  }
  return out;
}

// Descends the layers on rank c, whose busy time exceeds its peers' by `extra` ms per step.
std::vector<Hypothesis> descend(const JobWindow& job, size_t c, double extra, bool job_wide) {
  const RankWindow& r = job.ranks[c];
  auto peers = peers_of(job, c);
  std::vector<Hypothesis> hs;
  const std::string who = rank_name(r);

  // -- GPU: did the device work itself take longer?
  double dev = excess(job, c, peers, [](const RankWindow& x) { return x.now.device_compute_ms; });
  double cpu = os_excess(job, c, peers, Os::kCpu);
  double cpu_peers = peer_median(job, peers, [](const RankWindow& x) { return x.get(Os::kCpu); });
  if (dev > 0 && dev >= 0.3 * extra) {
    double dev_peers = peer_median(job, peers, [](const RankWindow& x) { return x.now.device_compute_ms; });
    std::string kev = kernel_evidence(job, c, peers);
    bool throttled = r.gpu.known && (!r.gpu.throttle_reasons.empty() ||
                                     (known(r.gpu.sm_clock_ratio) && r.gpu.sm_clock_ratio < 0.9));
    double cpu_growth = known(cpu_peers) && cpu_peers > 0 ? cpu / cpu_peers : 0;
    Hypothesis h;
    std::string gpu = "GPU " + std::to_string(r.gpu.index >= 0 ? r.gpu.index : r.rank);
    h.evidence.push_back(who + "'s GPU computes " + ms(r.now.device_compute_ms) + " per step vs " + ms(dev_peers) +
                         " on its peers (+" + ms(dev) + ")");
    if (!kev.empty()) h.evidence.push_back("kernel time per step: " + kev);
    if (throttled) {
      h.cause = "gpu-slow";
      h.culprit = gpu;
      h.explained_ms = dev;
      h.confidence = 0.9;
      std::string nv = "NVML: " + gpu;
      if (!r.gpu.throttle_reasons.empty()) nv += " throttle reasons " + r.gpu.throttle_reasons;
      if (known(r.gpu.sm_clock_ratio)) nv += fmt(", SM clock at %.0f%% of max", 100 * r.gpu.sm_clock_ratio);
      h.evidence.push_back(nv);
      h.advice = "check " + gpu + "'s cooling and power (nvidia-smi -q -d PERFORMANCE); drain the node or replace the GPU";
    } else if (cpu_growth >= 0.25) {
      h.cause = "workload-imbalance";
      auto d = differential_profile(job, c, peers, &RankWindow::oncpu);
      // The input, not a function: every function of the step does more of the same work.
      h.culprit = "larger batches" + (d ? " (more work in " + d->function + ")" : std::string());
      h.explained_ms = extra;
      h.confidence = 0.75;
      h.evidence.push_back(who + " also spends " + fmt("%.0f%%", 100 * cpu_growth) +
                           " more CPU per step (" + ms(r.get(Os::kCpu)) + " vs " + ms(cpu_peers) +
                           "): more data per step, not a slower GPU" + (r.gpu.known ? " (NVML: no throttling)" : ""));
      if (d) h.evidence.push_back("most of the extra CPU time in " + d->function + ": +" + ms(d->excess_ms) + " per step");
      h.advice = "balance the work across ranks: check the sampler / sharding and batch sizes of " + who;
    } else {
      h.cause = "gpu-slow";
      h.culprit = gpu;
      h.explained_ms = dev;
      h.confidence = r.gpu.known ? 0.6 : 0.7;  // NVML seeing nothing wrong makes it less certain
      h.evidence.push_back(r.gpu.known ? "NVML reports no throttling: a degraded GPU or its PCIe link"
                                       : "same launches, longer kernels; no NVML data to confirm throttling");
      h.advice = "compare " + gpu + " with nvidia-smi -q (clocks, ECC, PCIe width); drain the node or replace the GPU";
    }
    hs.push_back(std::move(h));
  }

  // -- CPU/OS: the host kept the GPU waiting.
  double host = extra - std::max(0.0, dev);
  double idle = excess(job, c, peers, [](const RankWindow& x) { return x.now.gpu_idle_ms; });
  std::string idle_ev;
  if (idle > 0) idle_ev = who + "'s GPU sits idle " + ms(r.now.gpu_idle_ms) + " per step waiting for the CPU (+" + ms(idle) + " vs peers)";
  auto add = [&](Hypothesis h) {
    if (!idle_ev.empty()) h.evidence.push_back(idle_ev);
    hs.push_back(std::move(h));
  };
  double queued_ms = 0;  // run-queue wait that the rank's own extra CPU work explains
  if (host > 0 || job_wide) {
    double runq = os_excess(job, c, peers, Os::kRunqWait);
    // On a busy machine a rank that computes more also waits more for a CPU: only the run-queue
    // wait beyond what its CPU demand predicts at its peers' wait-per-CPU-ms is contention.
    double runq_peers = peer_median(job, peers, [](const RankWindow& x) { return x.get(Os::kRunqWait); });
    if (known(r.get(Os::kRunqWait)) && known(r.get(Os::kCpu)) && known(runq_peers) && known(cpu_peers) && cpu_peers > 0) {
      runq = std::min(runq, r.get(Os::kRunqWait) - runq_peers * r.get(Os::kCpu) / cpu_peers);
    }
    double thr = os_excess(job, c, peers, Os::kThrottled);
    auto nb = top_neighbour(job, c, peers, job_wide);
    if (job_wide && nb) runq = std::max(runq, nb->excess_ms);
    // Its cgroup measured no throttling (the metric is there, near zero): a quota cannot be why it
    // waits. If it also wants more CPU than its peers, it queues for its own extra work on a busy
    // node: the host hotspot below is the cause, and the wait is part of what it costs.
    bool unthrottled = known(r.get(Os::kThrottled)) && r.get(Os::kThrottled) < 1.0;
    // Its extra CPU must be able to explain the wait: at most a load factor of 20 (0.2 ms more CPU
    // is no reason to wait 800 ms more; the hogs that arrived mid-window are).
    bool own_queue = false;
    if (runq > 0 && unthrottled && cpu >= std::max(1.0, 0.05 * runq) && !(nb && nb->excess_ms >= 0.5 * runq)) {
      own_queue = true;
      queued_ms = runq;
    }
    if ((runq > 0 || thr > 0) && !own_queue) {
      Hypothesis h;
      if (thr >= 0.5 * runq && thr > 0) {
        h.cause = "cpu-throttling";
        h.culprit = "cgroup cpu quota";
        h.explained_ms = std::max(thr, runq);
        h.confidence = 0.85;
        h.evidence.push_back(who + " is throttled by its cgroup " + ms(r.get(Os::kThrottled)) + " per step (+" + ms(thr) + " vs peers)");
      } else if (nb && nb->excess_ms >= 0.5 * runq) {
        h.cause = "cpu-contention";
        h.culprit = nb->name;
        h.explained_ms = runq;
        h.confidence = 0.8;
        h.evidence.push_back("process `" + nb->name + "` runs " + ms(nb->culprit_ms) + " per step on " + who +
                             "'s CPUs" + (job_wide ? "" : " (+" + ms(nb->excess_ms) + " vs peers)"));
      } else if (unthrottled) {
        // Runnable but not running, no quota: its CPUs are oversubscribed. The process that ran
        // there more than on its peers' CPUs is the likeliest culprit, even if it accounts for less
        // than half of the wait (a loaded node adds the rest).
        h.cause = "cpu-contention";
        bool named = nb && nb->excess_ms > 0;
        h.culprit = named ? nb->name : "other work on the node's CPUs";
        h.explained_ms = runq;
        h.confidence = named ? 0.6 : 0.5;
        if (named)
          h.evidence.push_back("process `" + nb->name + "` runs " + ms(nb->culprit_ms) + " per step on " + who + "'s CPUs (+" +
                               ms(nb->excess_ms) + " vs peers); the rest of the wait is other work on a busy node");
        else
          h.evidence.push_back("its cgroup was not throttled and no one process on its CPUs accounts for it: the node's CPUs are oversubscribed");
      } else {
        h.cause = "cpu-throttling";
        h.culprit = "cgroup cpu quota";
        h.explained_ms = runq;
        h.confidence = 0.6;  // runnable but not running, and no other process to blame
        h.evidence.push_back("no other process on its CPUs accounts for it: a CPU quota (cgroup cpu.max / cfs_quota)");
      }
      h.evidence.insert(h.evidence.begin(), who + " waits " + ms(r.get(Os::kRunqWait)) + " per step runnable but not running (+" +
                                                ms(os_excess(job, c, peers, Os::kRunqWait)) + " vs peers)");
      h.advice = h.cause == "cpu-contention"
                     ? "move `" + h.culprit + "` off the training CPUs (taskset / cpuset) or lower its priority"
                     : "raise or remove the CPU quota of " + who + "'s container (cpu.max)";
      add(std::move(h));
    }
    double rec = os_excess(job, c, peers, Os::kReclaim);
    double io = os_excess(job, c, peers, Os::kBlockedIo);
    // Reclaim under a memory limit takes the page cache the rank reads its data from: the reads
    // go to disk again. Its extra block I/O is then the limit's cost too, not a slow disk.
    bool thrash = rec >= 0.5 && io > 0;
    if (rec > 0) {
      Hypothesis h;
      h.cause = "memory-reclaim";
      auto d = blocking_caller(job, c, peers);
      h.culprit = d ? d->function : "memory limit";
      h.explained_ms = rec + (thrash ? io : 0);
      h.confidence = 0.8;
      h.evidence.push_back(who + " stalls in direct reclaim / compaction " + ms(r.get(Os::kReclaim)) + " per step (+" + ms(rec) + " vs peers)");
      if (thrash)
        h.evidence.push_back("and waits " + ms(io) + " more per step than its peers on block I/O: its page cache is reclaimed, so it reads its data from disk again");
      // The function whose allocations reclaim: the caller of the blocked call, from the same call
      // sampled on-CPU (a page-cache read charging a full cgroup blocks with no user frames).
      std::string sc = d ? syscall_in(d->path) : std::string();
      if (auto site = !sc.empty() ? call_site(job, c, sc) : std::nullopt) {
        h.culprit = site->name();
        h.evidence.push_back("it blocks in " + site->syscall + " called from " + site->caller +
                             ": the pages it reads are charged to its full cgroup, which reclaims first");
      }
      h.advice = "raise the memory limit of " + who + "'s container or cut its page-cache use";
      add(std::move(h));
    }
    if (io > 0) {
      Hypothesis h;
      h.cause = "io-stall";
      auto d = blocking_caller(job, c, peers);
      h.culprit = d ? d->function : "block I/O";
      h.explained_ms = io;
      h.confidence = 0.8;
      h.evidence.push_back(who + " is blocked on I/O " + ms(r.get(Os::kBlockedIo)) + " per step (+" + ms(io) + " vs peers)");
      if (known(r.get(Os::kBioLatency))) {
        double lat_peers = peer_median(job, peers, [](const RankWindow& x) { return x.get(Os::kBioLatency); });
        h.evidence.push_back("block I/O latency " + ms(r.get(Os::kBioLatency)) + " per request" +
                             (known(lat_peers) ? " vs " + ms(lat_peers) + " on its peers" : "; its peers issue no block I/O"));
      }
      if (d) h.evidence.push_back("blocked time grows under " + d->function + ": +" + ms(d->excess_ms) + " per step");
      // Name the function that makes the blocking call, from the same call seen on-CPU.
      std::string sc = d ? syscall_in(d->path) : std::string();
      if (auto site = call_site(job, c, sc)) {
        h.culprit = site->name();
        std::string proc = r.process.empty() ? who : "`" + r.process + "` (" + who + ", pid " + std::to_string(r.pid) + ")";
        h.evidence.push_back(proc + " blocks in " + site->syscall + " called from " + site->caller + ": its on-CPU stacks in that call (" +
                             ms(site->ms) + " per step) name the caller" +
                             (d && d->function == site->syscall ? "; the blocked stacks carry no user frames" : ""));
      }
      h.advice = "read the training data from faster storage, cache it locally, or prefetch with more loader workers";
      add(std::move(h));
    }
    double irq = os_excess(job, c, peers, Os::kIrq);
    if (irq > 0) {
      Hypothesis h;
      h.cause = "irq-softirq";
      h.culprit = "interrupts on " + who + "'s CPUs";
      h.explained_ms = irq;
      h.confidence = 0.7;
      h.evidence.push_back(who + "'s CPUs spend " + ms(r.get(Os::kIrq)) + " per step in IRQ/softirq (+" + ms(irq) + " vs peers)");
      h.advice = "move IRQ affinity (NIC queues) away from the training CPUs";
      add(std::move(h));
    }
    double pf = os_excess(job, c, peers, Os::kMajorFaults);
    if (pf > 0) {
      Hypothesis h;
      h.cause = "page-faults";
      double lat = known(r.get(Os::kBioLatency)) ? r.get(Os::kBioLatency) : 0.5;
      h.culprit = "major page faults";
      h.explained_ms = pf * lat;
      h.confidence = 0.6;
      h.evidence.push_back(who + fmt(" takes %.1f more major faults per step than its peers", pf));
      h.advice = "keep the working set in memory (mlock, larger memory limit, no swap)";
      add(std::move(h));
    }
    double launch = os_excess(job, c, peers, Os::kLaunchApi);
    if (launch > 0 && launch >= 0.5 * host) {
      Hypothesis h;
      h.cause = "launch-bound";
      h.culprit = "kernel launches";
      h.explained_ms = launch;
      h.confidence = 0.6;
      h.evidence.push_back(who + " spends " + ms(r.get(Os::kLaunchApi)) + " per step launching kernels (+" + ms(launch) + " vs peers)");
      h.advice = "batch small kernels (CUDA graphs, fused ops)";
      add(std::move(h));
    }
    if (cpu > 0) {
      auto d = differential_profile(job, c, peers, &RankWindow::oncpu);
      Hypothesis h;
      h.cause = "host-hotspot";
      h.culprit = d ? d->function : "CPU work";
      // A path the peers do not run is a hotspot; more of the usual work explains less.
      bool fresh = d && d->peers_ms < 0.5 * d->culprit_ms;
      h.explained_ms = (fresh ? std::min(cpu, d->excess_ms) : 0.5 * cpu) + queued_ms;
      h.confidence = fresh ? 0.85 : 0.5;
      h.evidence.push_back(who + " runs on the CPU " + ms(r.get(Os::kCpu)) + " per step vs " + ms(cpu_peers) + " on its peers");
      if (queued_ms > 0)
        h.evidence.push_back("and waits " + ms(queued_ms) + " more per step than its peers for a CPU to run that extra work on (a busy node; its cgroup was not throttled)");
      if (d) {
        std::string where = d->function + (d->caller.empty() ? "" : " (called from " + d->caller + ")");
        h.evidence.push_back("differential on-CPU profile: " + where + " " + ms(d->culprit_ms) + " per step vs " +
                             ms(d->peers_ms) + " on peers");
      }
      h.advice = "optimize or move off the critical path: " + h.culprit + " (prefetch in a data-loader worker)";
      // A CPU-only job (no device timeline: DDP on gloo) whose on-CPU time grew outside the top
      // path too: every step function does more of the same work, as with more data per step
      // (the GPU branch above says so from device time). A hotspot leaves the rest as it was.
      // "Outside" is outside the top function's whole subtree (its callees' paths are its work).
      auto outside = [&](const RankWindow& x) {
        double t = 0;
        for (const auto& v : x.oncpu) {
          bool in = false;
          for (auto f : split_path(job.names.name(v.name))) in = in || short_function(f) == d->function;
          if (!in) t += v.ms_per_step;
        }
        return t;
      };
      double rest_mine = d ? outside(r) : 0;
      double rest_peers = d ? peer_median(job, peers, outside) : 0;
      double growth = rest_peers > 0 ? rest_mine / rest_peers - 1 : 0;
      if (!known(r.now.device_compute_ms) && d && growth >= 0.25) {
        h.cause = "workload-imbalance";
        h.culprit = "larger batches (more work in " + d->function + ")";
        h.confidence = 0.6;
        h.evidence.push_back("not one function: " + who + "'s on-CPU time outside " + d->function + " grew " +
                             fmt("%.0f%%", 100 * growth) + " too (" + ms(rest_mine) + " vs " + ms(rest_peers) +
                             " per step on peers), as with more data per step");
        h.advice = "balance the work across ranks: check the sampler / sharding and batch sizes of " + who;
      }
      add(std::move(h));
    }
  }
  // Nothing explains more than the time there is to explain.
  for (auto& h : hs) h.explained_ms = std::min(h.explained_ms, extra);
  std::stable_sort(hs.begin(), hs.end(), [](const Hypothesis& a, const Hypothesis& b) { return a.explained_ms > b.explained_ms; });
  return hs;
}

Finding to_finding(const JobWindow& job, size_t c, double lost, std::vector<Hypothesis> hs, std::vector<std::string> head,
                   double locate_conf) {
  const RankWindow& r = job.ranks[c];
  Finding f;
  f.rank = r.rank;
  f.node = r.node;
  f.lost_ms_per_step = lost;
  f.evidence = std::move(head);
  // A hypothesis that explains under a tenth of what the rank lost is not its cause (0.2 ms more
  // CPU is no hotspot behind 46 ms more busy time): then the cause is unknown, and said so.
  if (!hs.empty() && lost > 0 && hs.front().explained_ms < 0.1 * lost) hs.clear();
  if (hs.empty()) {
    f.cause = "host-hotspot";
    f.layer = layer_of(f.cause);
    f.culprit = "unknown";
    f.confidence = 0.2;
    f.evidence.push_back("no layer's metrics explain the extra time (were all layers recorded?)");
    f.advice = "record with all layers (strata record --layers all) and look at the flame graph of " + rank_name(r);
    return f;
  }
  Hypothesis& top = hs.front();
  f.cause = top.cause;
  f.layer = layer_of(f.cause);
  f.culprit = top.culprit;
  double share = lost > 0 ? clamp01(top.explained_ms / lost) : 0.5;
  f.confidence = clamp01(top.confidence * (0.5 + 0.5 * share) * locate_conf);
  for (auto& e : top.evidence) f.evidence.push_back(std::move(e));
  f.advice = top.advice;
  for (size_t i = 1; i < hs.size() && i < 3; ++i) {
    if (hs[i].explained_ms >= 0.3 * top.explained_ms && hs[i].explained_ms > 0) {
      f.evidence.push_back("also: " + hs[i].cause + " (" + hs[i].culprit + ") explains " + ms(hs[i].explained_ms) + " per step");
    }
  }
  return f;
}

}  // namespace

const char* layer_of(const std::string& cause) {
  if (cause == "gpu-slow" || cause == "hang") return "gpu";
  if (cause == "network-slow") return "comm";
  if (cause == "host-hotspot" || cause == "workload-imbalance" || cause == "launch-bound") return "cpu";
  return "os";
}

Diagnosis diagnose(const JobWindow& job, const Options& opt) {
  Diagnosis dx;
  dx.job = job.job;
  dx.ranks = job.ranks.size();
  if (job.ranks.empty()) return dx;
  auto n = job.ranks.size();

  // -- 1. detect: the job against its own history; hangs first, as they have no step time.
  dx.step_ms = median(column(job, [](const RankWindow& r) { return r.now.step_ms; }));
  dx.baseline_step_ms = median(column(job, [](const RankWindow& r) { return r.base.steps > 0 ? r.base.step_ms : kUnknown; }));
  uint64_t last = 0;
  size_t alive = 0;
  for (const auto& r : job.ranks) {
    last = std::max(last, r.last_progress_ns);
    alive += r.alive ? 1 : 0;
  }
  dx.second = second_opinion(job);
  if (last > 0 && alive > 0 && job.observed_until_ns > last &&
      static_cast<double>(job.observed_until_ns - last) >= opt.hang_s * 1e9) {
    double stalled_s = static_cast<double>(job.observed_until_ns - last) / 1e9;
    // The rank whose device stopped first holds the others in the collective; without a device
    // timeline, the one that made progress last is the least likely culprit.
    size_t c = 0;
    bool by_device = true;
    for (size_t i = 0; i < n; ++i) {
      if (job.ranks[i].last_device_ns == 0) by_device = false;
    }
    for (size_t i = 1; i < n; ++i) {
      const auto& a = job.ranks[i];
      const auto& b = job.ranks[c];
      if (by_device ? a.last_device_ns < b.last_device_ns : a.last_progress_ns < b.last_progress_ns) c = i;
    }
    const auto& r = job.ranks[c];
    Finding f;
    f.rank = r.rank;
    f.node = r.node;
    f.cause = "hang";
    f.layer = by_device ? "gpu" : "comm";
    f.culprit = by_device ? "GPU " + std::to_string(r.gpu.index >= 0 ? r.gpu.index : r.rank) : rank_name(r);
    f.lost_ms_per_step = stalled_s * 1000;
    f.evidence.push_back(fmt("no collective completed for %.1f s", stalled_s) + " while " + std::to_string(alive) + " of " +
                         std::to_string(n) + " rank processes are alive");
    if (by_device) {
      std::vector<double> others;
      for (size_t i = 0; i < n; ++i) {
        if (i != c) others.push_back(static_cast<double>(job.ranks[i].last_device_ns));
      }
      double gap = others.empty() ? 0 : (median(others) - static_cast<double>(r.last_device_ns)) / 1e6;
      f.evidence.push_back(rank_name(r) + "'s GPU finished its last work " + ms(gap) +
                           " before its peers' (median): its peers wait for it in the collective");
      f.confidence = gap > 0 ? 0.9 : 0.5;
    } else {
      f.confidence = 0.5;
    }
    f.advice = "dump the stacks of " + rank_name(r) + " (py-spy dump / cuda-gdb); check the GPU with nvidia-smi and dmesg (Xid)";
    dx.findings.push_back(std::move(f));
  } else {
    bool have_base = known(dx.baseline_step_ms);
    double base_noise = median(column(job, [](const RankWindow& r) { return r.base.steps > 0 ? r.base.step_mad_ms : kUnknown; }));
    double lost = have_base ? dx.step_ms - dx.baseline_step_ms : 0;
    // Significant against the uncertainty of the two medians (~1.25 sigma/sqrt(n)), not against
    // single steps: a noisy job still shows a sustained slowdown.
    double nb = std::max(1.0, median(column(job, [](const RankWindow& r) { return static_cast<double>(r.base.steps); })));
    double nn = std::max(1.0, median(column(job, [](const RankWindow& r) { return static_cast<double>(r.now.steps); })));
    double se = 1.25 * (known(base_noise) ? base_noise : 0) * std::sqrt(1 / nb + 1 / nn);
    bool slow = have_base && known(dx.step_ms) && lost >= std::max({opt.min_slowdown * dx.baseline_step_ms, 4 * se, 1.0});

    // -- 2. localize: the straggler computes longest and waits least.
    auto busy = column(job, [](const RankWindow& r) { return r.now.busy_ms(); });
    double busy_med = median(busy);
    double busy_noise = robust_sigma(busy, busy_med);
    double wait_med = median(column(job, [](const RankWindow& r) { return r.now.wait_ms; }));
    struct Cand {
      size_t i;
      double extra;
    };
    std::vector<Cand> cands;
    if (known(busy_med)) {
      for (size_t i = 0; i < n; ++i) {
        if (!known(busy[i])) continue;
        // Small jobs: compare with the others only, so the culprit pulls neither the median nor
        // the noise (with 4 ranks, one straggler and one long waiter would double the MAD).
        double ref = busy_med, noise = busy_noise;
        if (n <= 64) {
          std::vector<double> others;
          for (size_t k = 0; k < n; ++k) {
            if (k != i) others.push_back(busy[k]);
          }
          ref = median(others);
          noise = robust_sigma(others, ref);
        }
        double floor = slow ? std::max({0.25 * lost, 0.03 * dx.step_ms, 4 * noise, 2.0})
                            : std::max({opt.min_spatial * dx.step_ms, 6 * noise, 5.0});
        double e = busy[i] - ref;
        if (e < floor) continue;
        // Without a temporal slowdown, demand that the peers really wait for this rank.
        if (!slow && !(known(wait_med) && wait_med >= 0.5 * e)) continue;
        cands.push_back({i, e});
      }
      std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.extra > b.extra; });
      if (cands.size() > kMaxStragglers) cands.resize(kMaxStragglers);
    }

    // -- 3./4. descend on each straggler and keep its best-explained hypothesis.
    for (const auto& k : cands) {
      const auto& r = job.ranks[k.i];
      auto peers = peers_of(job, k.i);
      double wait_peers = peer_median(job, peers, [](const RankWindow& x) { return x.now.wait_ms; });
      double busy_peers = peer_median(job, peers, [](const RankWindow& x) { return x.now.busy_ms(); });
      std::vector<std::string> head;
      if (slow) {
        head.push_back("job step time " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms) + " (+" +
                       fmt("%.0f%%", 100 * lost / dx.baseline_step_ms) + ")");
      }
      head.push_back(rank_name(r) + " is the straggler: busy " + ms(r.now.busy_ms()) + " per step vs " + ms(busy_peers) +
                     " on its peers; waits " + ms(r.now.wait_ms) + " in collectives vs " + ms(wait_peers));
      double z = busy_noise > 0 ? k.extra / busy_noise : 100;
      double locate = clamp01(0.6 + z / 25);
      // The job loses what this rank adds beyond its peers, but never more than it got slower.
      double cost = slow ? std::min(k.extra, lost) : k.extra;
      dx.findings.push_back(to_finding(job, k.i, cost, descend(job, k.i, k.extra, false), std::move(head), locate));
    }

    if (cands.empty() && slow) {
      double wait_base = median(column(job, [](const RankWindow& r) { return r.base.steps > 0 ? r.base.wait_ms : kUnknown; }));
      double wait_up = known(wait_base) ? wait_med - wait_base : 0;
      if (wait_up >= 0.5 * lost) {
        // A slow link: everyone waits longer in the collectives and nobody computes longer. Its
        // end is the rank on every slow TCP connection when those were recorded; else, in a ring,
        // the ranks on both sides of the slow link wait longest.
        auto links = find_slow_links(job);
        size_t best = 0;
        double best_score = -1e300;
        for (size_t i = 0; i < n && !links; ++i) {
          const auto& prev = job.ranks[(i + n - 1) % n];
          const auto& next = job.ranks[(i + 1) % n];
          double score = (prev.now.wait_ms + next.now.wait_ms) / 2 - job.ranks[i].now.wait_ms;
          if (known(score) && score > best_score) {
            best_score = score;
            best = i;
          }
        }
        if (links) best = links->culprit;
        const auto& r = job.ranks[best];
        Finding f;
        f.rank = r.rank;
        f.node = r.node;
        f.cause = "network-slow";
        f.layer = "comm";
        f.culprit = "link of rank " + std::to_string(r.rank);
        f.lost_ms_per_step = lost;
        f.evidence.push_back("job step time " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms));
        f.evidence.push_back("all " + std::to_string(n) + " ranks wait longer in collectives" +
                             (job.communicator.empty() ? "" : " of communicator " + job.communicator) + ": " + ms(wait_med) +
                             " per step vs " + ms(wait_base) + " before; no rank computes longer than its peers");
        if (links) {
          std::string peers;
          for (const auto& p : links->peers) peers += (peers.empty() ? "" : " and ") + p;
          f.evidence.push_back("every bulk TCP connection of " + rank_name(r) + " (with " + peers + ") is slow: smoothed RTT " +
                               ms(links->fastest_ms) + " or more, while every other rank has one of " + ms(links->next_ms) +
                               " or less (median over the job's " + std::to_string(links->connections) + " bulk connections " +
                               ms(links->median_ms) + ")");
          f.confidence = links->unique ? 0.9 : 0.6;
        } else {
          const auto& prev = job.ranks[(best + n - 1) % n];
          const auto& next = job.ranks[(best + 1) % n];
          f.evidence.push_back("ring neighbours rank " + std::to_string(prev.rank) + " and rank " + std::to_string(next.rank) +
                               " wait " + ms((prev.now.wait_ms + next.now.wait_ms) / 2) + " vs " + ms(r.now.wait_ms) +
                               " for rank " + std::to_string(r.rank));
          f.confidence = clamp01(0.5 + (best_score > 0 && wait_med > 0 ? best_score / wait_med : 0));
        }
        f.advice = "check the NIC / link of " + rank_name(r) + " (ethtool -S, link speed, tc qdisc) and NCCL_IB/SOCKET settings";
        dx.findings.push_back(std::move(f));
      } else if (lost >= 0.15 * dx.baseline_step_ms) {
        // Every rank got slower by itself: look for the layer that explains it on the rank that
        // suffers most, with absolute numbers (another process on our CPUs is never normal).
        size_t c = 0;
        double best = -1;
        for (size_t i = 0; i < n; ++i) {
          double v = 0;
          for (const auto& nbv : job.ranks[i].neighbours) v = std::max(v, nbv.ms_per_step);
          v += known(busy[i]) ? busy[i] * 1e-3 : 0;  // tie-break by busy time
          if (v > best) {
            best = v;
            c = i;
          }
        }
        std::vector<std::string> head{"job step time " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms) +
                                      "; all ranks slowed alike (no straggler, collective waits did not grow)"};
        dx.findings.push_back(to_finding(job, c, lost, descend(job, c, lost, true), std::move(head), 0.6));
      }
    }
  }

  std::stable_sort(dx.findings.begin(), dx.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.lost_ms_per_step > b.lost_ms_per_step; });

  // The second opinion agrees when it flags exactly the finding's ranks (a hang or a job-wide cause
  // need not single out any rank).
  auto& so = dx.second;
  std::vector<int> mine;
  for (const auto& f : dx.findings) {
    if (f.cause != "network-slow" && f.cause != "hang") mine.push_back(f.rank);
  }
  std::vector<int> theirs = so.outlier_ranks;
  std::sort(mine.begin(), mine.end());
  std::sort(theirs.begin(), theirs.end());
  bool job_level = !dx.findings.empty() && mine.empty();
  so.disagrees = !job_level && mine != theirs;
  if (so.disagrees) {
    std::string a, b;
    for (int x : theirs) a += (a.empty() ? "" : ",") + std::to_string(x);
    for (int x : mine) b += (b.empty() ? "" : ",") + std::to_string(x);
    so.summary = "the statistical opinion flags rank(s) [" + a + "] where the layered diagnosis names [" + b + "]";
  } else {
    so.summary = "the statistical opinion agrees";
  }
  return dx;
}

}  // namespace strata::diagnose
