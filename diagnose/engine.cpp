#include "diagnose/engine.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

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

// A function's name as findings say it (culprits, callers): a lambda's operator() names no code a person searches
// for, its enclosing function does.
std::string caller_name(std::string_view f) {
  auto lambda = f.find("::{lambda");
  return lambda == std::string_view::npos ? short_function(f) : "a lambda in " + short_function(f.substr(0, lambda));
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

// "a;b;c" -> "c": a call path's last frame, without splitting the rest.
std::string_view last_frame(std::string_view path) {
  auto semi = path.rfind(';');
  return semi == std::string_view::npos ? path : path.substr(semi + 1);
}

bool unresolved_frame(std::string_view f) {
  if (f.empty() || f == "[unknown]") return true;
  auto hex = [](std::string_view h) {
    return !h.empty() && std::all_of(h.begin(), h.end(), [](char ch) { return std::isxdigit(static_cast<unsigned char>(ch)) != 0; });
  };
  if (f.rfind("0x", 0) == 0 && hex(f.substr(2))) return true;  // a raw address
  auto plus = f.rfind("+0x");
  return plus != std::string_view::npos && hex(f.substr(plus + 3));  // "module+0xoffset": no symbol
}

std::string function_key(const JobWindow& job, std::string_view path) {
  auto frames = split_path(path);
  if (!job.python_functions.empty()) {
    for (size_t i = frames.size(); i-- > 0;) {
      if (job.python_functions.count(std::string(frames[i]))) return std::string(frames[i]);
    }
  }
  for (size_t i = frames.size(); i-- > 0;) {
    if (!unresolved_frame(frames[i]) && frames[i] != kWorkerFrame) return short_function(frames[i]);
  }
  return {};
}

namespace {

// Peers are compared through medians; beyond this many ranks a deterministic, evenly strided sample
// gives the same medians at a fraction of the cost (100k ranks in one window).
constexpr size_t kMaxPeers = 1000;
// A slowdown on every rank alike is a job-wide finding only from 15% on: a loaded machine's speed
// drifts that much without any one cause (a healthy 4-rank testbed run under load average 12 got
// 8% slower between its halves, its loopback collectives with it), and its layers drift with it.
constexpr double kJobWideSlowdown = 0.15;
// ... and from 10% where what grew on every rank is the GPUs' own time: kernel time is measured on
// the device and does not drift with the host's load (the drift above), only by kernel timing
// jitter (kRestOfDeviceGrowth: 10% of the device time, which is less than the step). A 4-rank job
// whose one kernel doubled (+30 ms per step, every rank) on a host that had drifted 10% slower
// before it measured 14.6% over that slower baseline: under 15%, no finding.
constexpr double kJobWideDeviceSlowdown = 0.10;
// How sure a job-wide finding measured on one example rank is of where it is.
constexpr double kJobWideLocate = 0.6;
// A ring end stands out when its neighbours wait this share of the collectives' growth longer than
// it does (a slow link's two ends idle while it sends); else every link got slower.
constexpr double kRingEndShare = 0.05;
// A peer group of at least this many other ranks measures its own noise (a MAD of fewer values
// is one of them); smaller ones pool the other groups' spread.
constexpr size_t kMinGroupNoise = 3;
// A rank compared with fewer other ranks than kMinGroupNoise has no spread across ranks to say what
// noise is (one peer's MAD is 0): its own steps say it instead. It is a straggler only if it is
// busier than its peers in most of the window's steps (the median step's gap clears the floor),
// not in a few: a busy time is a median step less a mean wait, and a rank descheduled for a
// second in two steps of thirty makes its peer's mean wait 60 ms longer (a healthy 2-rank DDP
// job, unpinned with DataLoader workers on a 2-core node, was named a straggler by 46 ms per step,
// culprit unknown). At least this many of the window's steps, aligned from the latest, or the
// steps say nothing and the mean stands.
constexpr size_t kMinStepsCompared = 5;
// A peer group up to this many ranks compares each rank with the others only (as a small job
// does: the culprit pulls neither the median nor the noise); a larger one uses its own median.
constexpr size_t kSmallGroup = 64;
// Pooled noise leaves the rank's own group out exactly up to this many groups; beyond, one group
// is too small a share of the pool to matter and the pool is shared.
constexpr size_t kMaxExactPooledGroups = 64;
// At most this many straggler findings per window: beyond it the job is not "a few slow ranks".
constexpr size_t kMaxStragglers = 16;
// A candidate straggler that waits in collectives longer than its peers by more than this share of
// its extra busy time is waiting for them (see where it is used): a straggler's peers wait about
// its extra time for it, and it waits less than they do; half leaves room for a step time that
// is a median and a wait that is a mean.
constexpr double kStragglerOwnWaitShare = 0.5;
// The other side of it: a straggler's peers wait for it, so they wait longer than it does by about
// its extra busy time. Where the peers wait at least this share of that extra time in collectives
// (so the waits could show it), a candidate they wait no more than this share longer than it is
// busier than they are off the path that sets the step: not why the job is slow (seen on healthy
// DDP runs of a loaded machine: a rank 5.2 ms busier per step whose peers waited 1.2 ms more). Half,
// as for kStragglerOwnWaitShare. Where the peers wait less than this share in collectives at all
// (host-side NCCL calls without the device timeline only enqueue), the waits say nothing either way.
constexpr double kStragglerPeerWaitShare = 0.5;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string ms(double v) { return fmt(v >= 100 ? "%.0f ms" : v >= 10 ? "%.1f ms" : "%.2f ms", v); }

double clamp01(double v) { return std::max(0.0, std::min(1.0, v)); }

// Indices of the ranks `c` is compared with: the others that do the same work (its peer group,
// diagnose/peer_groups.h; every rank when roles are unknown, or when the role does not matter:
// by_role false, hardware), or an even sample of them.
std::vector<size_t> peers_of(const JobWindow& job, size_t c, bool by_role = true) {
  std::vector<size_t> same;
  const bool grouped = by_role && job.peer_group.size() == job.ranks.size();
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    if (i != c && (!grouped || job.peer_group[i] == job.peer_group[c])) same.push_back(i);
  }
  if (same.size() <= kMaxPeers) return same;
  std::vector<size_t> out;
  size_t stride = same.size() / kMaxPeers;
  for (size_t i = 0; i < same.size(); i += stride) out.push_back(same[i]);
  return out;
}

template <typename F>
double peer_median(const JobWindow& job, const std::vector<size_t>& peers, F get) {
  std::vector<double> v;
  v.reserve(peers.size());
  for (size_t p : peers) v.push_back(get(job.ranks[p]));
  return median(std::move(v));
}

// Rank i's extra busy time in its median step against `others` (their median busy time in each
// step), over the window's latest steps that every one of them has (StepPoint::in_window),
// aligned from the latest: the gap that most steps show. kUnknown: fewer than kMinStepsCompared.
// Each of a rank's kept steps' busy time (its time less its own wait), in order: the window's
// steps (`in_window`), else the baseline's.
std::vector<double> step_busy(const RankWindow& r, bool in_window) {
  std::vector<double> b;
  for (const auto& p : r.series) {
    if (p.in_window == in_window && known(p.step_ms) && known(p.wait_ms)) b.push_back(static_cast<double>(p.step_ms) - p.wait_ms);
  }
  return b;
}

double median_step_excess(const JobWindow& job, size_t i, const std::vector<size_t>& others) {
  auto window_busy = [&](size_t k) { return step_busy(job.ranks[k], true); };
  const std::vector<double> own = window_busy(i);
  std::vector<std::vector<double>> theirs;
  size_t steps = own.size();
  for (size_t k : others) {
    theirs.push_back(window_busy(k));
    steps = std::min(steps, theirs.back().size());
  }
  if (theirs.empty() || steps < kMinStepsCompared) return kUnknown;
  std::vector<double> gap;
  for (size_t s = 1; s <= steps; ++s) {
    std::vector<double> at;
    for (const auto& t : theirs) at.push_back(t[t.size() - s]);
    gap.push_back(own[own.size() - s] - median(std::move(at)));
  }
  return median(std::move(gap));
}

// A rank's busy time in its typical step, as evidence says it: the median over the phase's steps
// of each step's time less its own wait (`in_window`: the window's steps, else the baseline's),
// with at least kMinStepsCompared of them; else the phase's median step less its mean wait. That
// difference of two different statistics can go below zero (one step that waited a second for a
// late peer lifts the mean wait above the median step: "busy -1095 ms" on the peers of an 8-rank
// job), a step's own difference cannot.
double typical_busy(const RankWindow& r, bool in_window) {
  std::vector<double> b = step_busy(r, in_window);
  if (b.size() >= kMinStepsCompared) return median(std::move(b));
  return in_window ? r.now.busy_ms() : r.base.busy_ms();
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

// A call path as ranks can compare it. A Python program's path is its Python frames (the
// interpreter's C frames between them vary with how each call was made, and native unwinding
// through the interpreter breaks often). A native path loses unresolved leaf frames (their time
// counts for the caller) and everything above its deepest unresolved frame: a root that names no
// code ("[anon]+0x7f..", "[heap]+0x10", per process because of ASLR) would split one function's
// time over as many paths as it has broken roots, and match no peer. Empty: the whole stack is
// unresolved, evidence of a broken unwind and of nothing else. `*broken` says whether it lost frames.
// A worker's path (rooted at kWorkerFrame) compares as the same code run in the rank's process:
// the root goes, `*worker` says it was there.
std::string comparable_path(const JobWindow& job, const std::string& path, bool* broken, bool* worker) {
  auto frames = split_path(path);
  *broken = false;
  *worker = !frames.empty() && frames.front() == kWorkerFrame;
  if (*worker) frames.erase(frames.begin());
  std::string out;
  bool python = false;
  for (auto f : frames) python = python || job.python_functions.count(std::string(f)) > 0;
  if (python) {
    for (auto f : frames) {
      if (job.python_functions.count(std::string(f))) out += (out.empty() ? "" : ";") + std::string(f);
      else *broken = *broken || unresolved_frame(f);
    }
    return out;
  }
  size_t end = frames.size();
  while (end > 0 && unresolved_frame(frames[end - 1])) --end;
  size_t begin = 0;
  for (size_t i = 0; i < end; ++i) {
    if (unresolved_frame(frames[i])) begin = i + 1;
  }
  *broken = begin > 0 || end < frames.size();
  for (size_t i = begin; i < end; ++i) out += (out.empty() ? "" : ";") + std::string(frames[i]);
  return out;
}

// Time per step on stacks that name no code at all, and one of their frames for the evidence.
struct Broken {
  double ms = 0;
  std::string example;
};

// Time per step under each call-path prefix (inclusive: a function's callees count for it), on
// comparable paths.
// `in_worker`: the same, of the paths sampled in the rank's workers only.
std::unordered_map<std::string, double> inclusive(const JobWindow& job, const Values& paths, Broken* broken = nullptr,
                                                  std::unordered_map<std::string, double>* in_worker = nullptr) {
  std::unordered_map<std::string, double> out;
  for (const auto& v : paths) {
    bool lost_frames = false, worker = false;
    const std::string path = comparable_path(job, job.names.name(v.name), &lost_frames, &worker);
    if (path.empty()) {
      if (broken) {
        broken->ms += v.ms_per_step;
        if (broken->example.empty()) broken->example = split_path(job.names.name(v.name)).back();
      }
      continue;
    }
    size_t pos = 0;
    while (true) {
      size_t end = path.find(';', pos);
      out[path.substr(0, end)] += v.ms_per_step;
      if (worker && in_worker) (*in_worker)[path.substr(0, end)] += v.ms_per_step;
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
  bool in_worker = false;      // sampled mostly in the rank's worker processes
  double broken_ms = 0;        // the rank's time on stacks that name no code (not compared)
  std::string broken_example;  // one of their frames
};

// A frame passes its time on to a callee that holds at least this share of it: what is left (its own
// lines, its other callees) is too little to be the reason it is slow. Under 0.2 also leaves room
// for the frame's own samples that land on its lines between calls.
constexpr double kPassThroughShare = 0.8;
// A frame that holds this share of a rank's compared on-CPU time leaves under a fifth outside it:
// the whole program, not a place in it, when it also holds most (kProgramFramePeerShare) of each
// peer's time. The peers' bar is lower: a healthy rank spends more of its time outside the step
// loop (its start-up's imports, its collective threads) than one that does 3x the work in it.
constexpr double kProgramFrameShare = 0.8;
constexpr double kProgramFramePeerShare = 0.5;
// A path the peers run at under this share of the rank's time is new on the rank: more data per step
// scales what every rank runs (a 3x batch leaves the peers a third), it does not make a path ten
// times heavier. Not zero: a path the peers run briefly still draws a sample now and then.
constexpr double kRarePathShare = 0.1;
// Paths that carry at least this share of the most extra time are compared: the rest are too
// small to be where the rank's extra time is.
constexpr double kCarriesTheExtra = 0.5;
// Under the program's frame, a callee new on the rank (kRarePathShare) that carries this share of
// the frame's extra time is where it differs, before a callee with more extra time that the peers
// run too: the usual work runs longer for many reasons (a shared CPU, its caches, the new work
// running beside it), new work for one. Seen: a DataLoader worker's augmentation on a pinned rank,
// 47% of the rank's extra time, beside its step loop, 32% longer than its peers' (the loop was
// named). A quarter is the least share of a loss a cause must explain (kMinExplainedShare).
constexpr double kNewWorkShareOfExtra = 0.25;

std::optional<PathDiff> differential_profile(const JobWindow& job, size_t c, const std::vector<size_t>& peers,
                                             Values RankWindow::*field) {
  Broken broken;
  std::unordered_map<std::string, double> worker_part;
  auto mine = inclusive(job, job.ranks[c].*field, &broken, &worker_part);
  if (mine.empty()) return std::nullopt;
  // Profiles are the heaviest part of a rank: compare with at most 64 peers.
  std::vector<std::unordered_map<std::string, double>> theirs;
  size_t stride = std::max<size_t>(1, peers.size() / 64);
  for (size_t i = 0; i < peers.size(); i += stride) theirs.push_back(inclusive(job, job.ranks[peers[i]].*field));
  if (theirs.empty()) return std::nullopt;
  // The peers' median time under a path (0 where a peer never runs it).
  auto peer_value = [&](const std::string& path) {
    std::vector<double> pv;
    pv.reserve(theirs.size());
    for (const auto& t : theirs) {
      auto it = t.find(path);
      pv.push_back(it == t.end() ? 0 : it->second);
    }
    return median(std::move(pv));
  };
  auto depth_of = [](const std::string& path) { return static_cast<size_t>(std::count(path.begin(), path.end(), ';')); };
  // The paths one frame below `at` on the rank.
  auto callees = [&](const std::string& at, auto&& each) {
    const size_t depth = depth_of(at);
    for (const auto& [p, v] : mine) {
      if (p.size() > at.size() && p.compare(0, at.size(), at) == 0 && p[at.size()] == ';' && depth_of(p) == depth + 1) each(p, v);
    }
  };
  struct Cand {
    const std::string* path;
    double excess, mine, peer, newness;
    size_t depth;
  };
  std::vector<Cand> cands;
  double best_excess = 0;
  for (const auto& [path, value] : mine) {
    double p = peer_value(path);
    double e = value - p;
    if (e <= 0) continue;
    cands.push_back({&path, e, value, p, e / value, depth_of(path)});
    best_excess = std::max(best_excess, e);
  }
  if (cands.empty()) return std::nullopt;
  std::erase_if(cands, [&](const Cand& k) { return k.excess < kCarriesTheExtra * best_excess; });
  // First choice: the shallowest frame the peers (almost) never run — where the new behaviour
  // begins (slow_augment, not the cpu_work it calls, nor main above it).
  // Frames the peers never ran at all come before frames they ran rarely: with few samples (a rank
  // that mostly waits) the root frames of the peers can look "rare" too.
  const Cand* pick = nullptr;
  for (double rare : {0.0, kRarePathShare}) {
    for (const auto& k : cands) {
      if (k.peer > rare * k.mine) continue;
      if (!pick || k.depth < pick->depth || (k.depth == pick->depth && k.excess > pick->excess)) pick = &k;
    }
    if (pick) break;
  }
  const bool new_path = pick != nullptr;
  // Else: the path whose time is most of all extra, the deeper on ties.
  if (!pick) {
    for (const auto& k : cands) {
      if (!pick || k.newness > pick->newness + 0.02 || (k.newness > pick->newness - 0.02 && k.depth > pick->depth)) pick = &k;
    }
  }
  PathDiff d;
  d.path = *pick->path;
  // A pick that holds nearly all of the rank's time and most of its peers' is the program's own
  // frame (the step loop, `rank_main`, whose callees are every step function). More data in every
  // step grows it most: its extra splits over its callees (forward and backward, about half each),
  // so none of them carries most of the extra and the frame above them wins. It names no place
  // where the rank differs, and outside it nothing is left to tell more of everything from one
  // function (more_of_everything). Its callee new on the rank does (kNewWorkShareOfExtra), else its
  // callee with the most extra time, down while the frame still holds the program.
  auto total_time = [](const std::unordered_map<std::string, double>& m) {
    double total = 0;
    for (const auto& [p, v] : m) total += p.find(';') == std::string::npos ? v : 0;  // the roots hold it all
    return total;
  };
  auto share_of_time = [](const std::unordered_map<std::string, double>& m, double total, const std::string& path) {
    auto it = m.find(path);
    return total > 0 && it != m.end() ? it->second / total : 0;
  };
  const double my_total = total_time(mine);
  std::vector<double> their_totals;
  their_totals.reserve(theirs.size());
  for (const auto& t : theirs) their_totals.push_back(total_time(t));
  auto peer_share = [&](const std::string& path) {
    std::vector<double> pv;
    pv.reserve(theirs.size());
    for (size_t i = 0; i < theirs.size(); ++i) pv.push_back(share_of_time(theirs[i], their_totals[i], path));
    return median(std::move(pv));
  };
  bool new_callee = false;
  while (share_of_time(mine, my_total, d.path) >= kProgramFrameShare && peer_share(d.path) >= kProgramFramePeerShare) {
    const double frame_excess = mine.at(d.path) - peer_value(d.path);
    std::string most, fresh;
    double most_excess = 0, fresh_excess = 0;
    callees(d.path, [&](const std::string& p, double v) {
      const double pp = peer_value(p), e = v - pp;
      if (e > most_excess) most = p, most_excess = e;
      if (pp <= kRarePathShare * v && e >= kNewWorkShareOfExtra * frame_excess && e > fresh_excess) fresh = p, fresh_excess = e;
    });
    if (most.empty()) break;
    new_callee = !fresh.empty();
    d.path = new_callee ? fresh : most;
    if (new_callee) break;
  }
  // A Python function new on the rank that only passes its time on is not where it goes.
  // - Through a library's frames (installed code: the DataLoader's worker loop, its fetcher), down
  //   to the first frame of the program's own code, where each passes on kPassThroughShare of its
  //   time. A chain that ends in library code stays where it was: the program makes no call there.
  // - Then to a callee of the same source file that holds kPassThroughShare of its time and the
  //   peers never run on another path (on this one they may, briefly). The callee is where the time
  //   goes; the frame above it is new on the rank only because the peers' calls of it are too short
  //   to be sampled (a DataLoader worker's Batches.__getitem__, whose augment_sample burned the
  //   time: the peers' cheap __getitem__ had no samples). Not across files: a call into another
  //   module (torch.save from a checkpoint function) is the program's own code calling a library,
  //   and the call site is what its authors change. Not into a function the peers run elsewhere
  //   (slow_augment's cpu_work): that is their usual work, called from the new frame.
  if ((new_path || new_callee) && !job.python_functions.empty()) {
    // Whether a peer runs `function` on a path other than `path`: its usual work elsewhere.
    auto peers_run_elsewhere = [&](std::string_view function, const std::string& path) {
      for (const auto& t : theirs) {
        for (const auto& [p, v] : t) {
          if (last_frame(p) == function && p != path) return true;
        }
      }
      return false;
    };
    auto python = [&](const std::string& path) { return job.python_functions.count(std::string(last_frame(path))) > 0; };
    auto library = [&](const std::string& path) { return job.python_library_functions.count(std::string(last_frame(path))) > 0; };
    auto file_of = [](std::string_view frame) {
      auto colon = frame.find(':');
      return colon == std::string_view::npos ? std::string_view() : frame.substr(0, colon);
    };
    // The callee of `at` that holds kPassThroughShare of its time on the rank and `also` says yes to.
    auto passed_to = [&](const std::string& at, auto&& also) {
      const std::string* to = nullptr;
      const double at_ms = mine.at(at);
      callees(at, [&](const std::string& p, double v) {
        if (!to && v >= kPassThroughShare * at_ms && also(p)) to = &p;
      });
      return to;
    };
    if (library(d.path)) {
      const std::string* at = &d.path;
      while (at && library(*at)) at = passed_to(*at, [](const std::string&) { return true; });
      if (at && python(*at)) d.path = *at;
    }
    while (true) {
      const std::string_view at_file = file_of(last_frame(d.path));
      const std::string* to = passed_to(d.path, [&](const std::string& p) {
        const std::string_view callee = last_frame(p);
        return !at_file.empty() && file_of(callee) == at_file && python(p) && !peers_run_elsewhere(callee, p);
      });
      if (!to) break;
      d.path = *to;
    }
  }
  d.culprit_ms = mine.at(d.path);
  d.peers_ms = peer_value(d.path);
  d.excess_ms = d.culprit_ms - d.peers_ms;
  auto frames = split_path(d.path);
  d.function = caller_name(frames.back());
  if (frames.size() >= 2) d.caller = caller_name(frames[frames.size() - 2]);
  // Most of its time in the rank's workers: it runs there.
  auto w = worker_part.find(d.path);
  d.in_worker = w != worker_part.end() && w->second >= 0.5 * d.culprit_ms;
  d.broken_ms = broken.ms;
  d.broken_example = broken.example;
  return d;
}

// Off-CPU, the function to name is the one that made the blocking call: on the blocked path that
// grew most, the deepest frame that is neither the system call ("pread64()") nor a libc wrapper
// ("__libc_pread64"). A thread blocked in I/O may have no user stack: then the system call.
// Whether a blocked path waited in a page fault (kPageFaultCall), not in a call the program made.
bool in_page_fault(std::string_view path) { return path.find(kPageFaultCall) != std::string_view::npos; }

// `faults`: only the paths blocked in page faults (the function that touched the memory).
std::optional<PathDiff> blocking_caller(const JobWindow& job, size_t c, const std::vector<size_t>& peers, bool faults = false) {
  std::optional<PathDiff> best;
  for (const auto& v : job.ranks[c].offcpu) {
    if (faults && !in_page_fault(job.names.name(v.name))) continue;
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
    if (syscall || f.rfind("__", 0) == 0 || unresolved_frame(f) || f == kWorkerFrame) continue;
    best->function = caller_name(f);
    if (i > 0) best->caller = caller_name(frames[i - 1]);
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
    for (auto f : split_path(std::string_view(key).substr(bar + 1))) {
      if (!unresolved_frame(f) && f != kWorkerFrame) s.frames.push_back(short_function(f));
    }
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
    if (is_agent(job.names.name(v.name))) continue;  // its cost is reported apart
    if (is_interrupt_thread(job.names.name(v.name))) continue;  // interrupt work: irq-softirq's
    double p = absolute ? 0 : peer_median(job, peers, [&](const RankWindow& r) { return value_of(r.neighbours, v.name); });
    double e = v.ms_per_step - p;
    if (e > 0 && (!best || e > best->excess_ms)) best = NeighbourDiff{job.names.name(v.name), e, v.ms_per_step};
  }
  return best;
}

// The kernel's interrupt threads' run time on a rank's CPUs per step (ksoftirqd/1 on one rank's CPU,
// ksoftirqd/0 on a peer's: summed, not matched by name).
double interrupt_thread_ms(const JobWindow& job, const RankWindow& r) {
  double t = 0;
  for (const auto& v : r.neighbours) {
    if (is_interrupt_thread(job.names.name(v.name))) t += v.ms_per_step;
  }
  return t;
}

std::string rank_name(const RankWindow& r) { return "rank " + std::to_string(r.rank); }

// Whether the ranks' TCP connections were recorded (with RTTs): then no slow link among them
// means none is slower than the others (loopback ones included: a job whose connections are all
// loopback has no link between its ranks to be slow).
bool tcp_recorded(const JobWindow& job) {
  size_t n = 0;
  for (const auto& r : job.ranks) {
    for (const auto& l : r.links) n += l.sent_bytes > 0 && known(l.srtt_ms) ? 1 : 0;
  }
  return n >= 2;
}

// A slow link seen in the ranks' TCP connections. The sender of a connection measures its smoothed
// RTT and its busy time (data on its way); both sides of a connection are found by its endpoints. A
// rank whose own link (NIC, cable, port) is slow has every connection through it slow, in and out;
// a rank next to it has one slow connection (to it) and the others fast. So each rank scores the
// best of its bulk connections (those that carry a real share of the job's traffic: control
// connections with delayed ACKs have long RTTs of their own), and the culprit is the rank whose best
// connection is slow. Two measures, RTT first:
// - RTT: a link that delays packets (a congested or lossy path) stretches every RTT through it;
// - rate: bytes over busy time, for a link that limits throughput without a queue long enough to
//   show in RTT (a shaper with a short queue; TCP small queues keep the excess in the sending
//   socket). Measured on a PyTorch DDP job with one rank's link limited to 40 Mbit/s: its
//   connections moved 4.3 MB/s while busy, the others 22-295 MB/s (RTT showed that link too).
struct SlowLinks {
  size_t culprit = 0;                 // index into job.ranks
  std::vector<std::string> peers;     // its peers over bulk connections ("rank 3", or an endpoint)
  bool by_rate = false;               // found by the rate, not the RTT
  double fastest_ms = 0;              // the RTT of its fastest bulk connection
  double next_ms = 0;                 // the same for the runner-up rank
  double median_ms = 0;               // the median bulk connection's RTT
  double rate_mb_s = 0, next_rate_mb_s = 0;  // by_rate: its best connection's rate, the runner-up's
  size_t connections = 0;             // bulk connections
};

// A rank's best connection moves data at most this share of the rate of every other rank's best:
// the RTT rule's "clearly" (2x) for the other measure. A link renegotiated one speed down is 2.5-4x
// slower (100 -> 40 or 25 Gb/s); the paths of one fabric, or one host's veths, agree far closer.
constexpr double kNarrowLinkRateShare = 0.5;
// A connection's rate is judged only over at least this much busy time in the span: below it the
// kernel's busy clock (counted in jiffies, 1-4 ms) is mostly rounding.
constexpr double kMinBusyMs = 50;
// A rank's best bulk connection is slow when its RTT is at least this many times the runner-up's
// (and 1 ms above it). A rank's own slow link leaves each of its peers a connection that does not
// cross it, as fast as the healthy fabric: tens of times faster where a link queues. Links that
// are all slowed queue too, and their RTTs differ with how full each queue is: every link of a
// 4-rank DDP job shaped to 40 Mbit/s gave best connections of 28-44 ms (1.55x apart; the job's
// healthy ones, 0.1-0.9 ms), and the most queued one is no culprit.
constexpr double kSlowLinkRttFactor = 2;

bool loopback_endpoint(const std::string& ep) { return ep.rfind("127.", 0) == 0 || ep.rfind("[::1]", 0) == 0; }

// "10.0.0.1:5000" -> "10.0.0.1", "[fe80::1]:5000" -> "[fe80::1]".
std::string_view endpoint_address(std::string_view ep) {
  auto colon = ep.rfind(':');
  return colon == std::string_view::npos ? ep : ep.substr(0, colon);
}

// A loopback connection crosses no link, nor does one between two sockets of one address (the
// kernel routes it through its loopback device): its RTT is how soon its two ends' threads run (a
// loaded node's reached 4-10 ms against 0.1 ms on a quiet one, in healthy PyTorch DDP runs, over
// 127.0.0.1 and over a veth's host address alike). So a rank whose slow connections are all such
// is no link's culprit (a busy host is the CPU rules' to name); they still count as what its host
// manages when a rank's connections are compared (a fast one says the rank is not slow).
bool crosses_a_link(const TcpLink& l) {
  if (loopback_endpoint(l.local) && loopback_endpoint(l.remote)) return false;
  return endpoint_address(l.local) != endpoint_address(l.remote);
}

std::string slow_links_evidence(const JobWindow& job, const SlowLinks& links) {
  std::string peers;
  for (const auto& p : links.peers) peers += (peers.empty() ? "" : " and ") + p;
  const std::string who = "every bulk TCP connection of " + rank_name(job.ranks[links.culprit]) + " (with " + peers + ")";
  if (links.by_rate)
    return who + " moves data slowly: " + fmt("%.3g", links.rate_mb_s) + " MB/s at best while it has data on its way, while every other rank has one of " +
           fmt("%.3g", links.next_rate_mb_s) + " MB/s or more (by RTT it does not stand out)";
  return who + " is slow: smoothed RTT " + ms(links.fastest_ms) + " or more, while every other rank has one of " + ms(links.next_ms) +
         " or less (median over the job's " + std::to_string(links.connections) + " bulk connections " + ms(links.median_ms) + ")";
}

std::optional<SlowLinks> find_slow_links(const JobWindow& job) {
  // Loopback addresses are only unique within a node.
  auto key = [&](const RankWindow& r, const std::string& ep) { return loopback_endpoint(ep) ? r.node + "/" + ep : ep; };
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
    double rate;  // MB/s while busy; kUnknown when its busy time is too short to judge
  };
  std::vector<std::vector<Conn>> conns(job.ranks.size());
  std::vector<bool> crosses(job.ranks.size(), false);  // a bulk connection through a link: may be the culprit
  std::vector<double> rtts;
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    for (const auto& l : job.ranks[i].links) {
      if (!(l.sent_bytes >= 0.05 * max_sent && known(l.srtt_ms))) continue;
      rtts.push_back(l.srtt_ms);
      double rate = l.busy_ms >= kMinBusyMs ? l.sent_bytes / l.busy_ms / 1e3 : kUnknown;
      auto o = owner.find(key(job.ranks[i], l.remote) + ">" + key(job.ranks[i], l.local));
      if (o == owner.end()) o = owner.find(key(job.ranks[i], l.remote));
      bool paired = o != owner.end() && o->second != i;
      conns[i].push_back({paired ? rank_name(job.ranks[o->second]) : l.remote, l.srtt_ms, rate});
      if (paired) conns[o->second].push_back({rank_name(job.ranks[i]), l.srtt_ms, rate});
      if (crosses_a_link(l)) {
        crosses[i] = true;
        if (paired) crosses[o->second] = true;
      }
    }
  }
  if (rtts.size() < 2) return std::nullopt;
  SlowLinks out;
  out.connections = rtts.size();
  out.median_ms = median(std::move(rtts));
  auto peers_of_culprit = [&] {
    std::set<std::string> peers;
    for (const auto& c : conns[out.culprit]) peers.insert(c.peer);
    out.peers.assign(peers.begin(), peers.end());
  };
  std::vector<std::pair<double, size_t>> fastest;  // (its fastest bulk connection's RTT, rank index)
  for (size_t i = 0; i < conns.size(); ++i) {
    if (conns[i].empty() || !crosses[i]) continue;
    double f = conns[i].front().rtt_ms;
    for (const auto& c : conns[i]) f = std::min(f, c.rtt_ms);
    fastest.push_back({f, i});
  }
  if (fastest.size() < 2) return std::nullopt;
  std::sort(fastest.begin(), fastest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  // Slow at all: kSlowLinkRttFactor times the runner-up and 1 ms above it.
  if (fastest[0].first >= kSlowLinkRttFactor * fastest[1].first && fastest[0].first >= fastest[1].first + 1.0) {
    out.culprit = fastest[0].second;
    out.fastest_ms = fastest[0].first;
    out.next_ms = fastest[1].first;
    peers_of_culprit();
    return out;
  }
  // Else the rate: every rank whose connections were busy long enough is scored by its best one.
  std::vector<std::pair<double, size_t>> best;  // (its best bulk connection's rate, rank index)
  for (size_t i = 0; i < conns.size(); ++i) {
    if (!crosses[i]) continue;
    double b = kUnknown;
    for (const auto& c : conns[i]) {
      if (known(c.rate)) b = known(b) ? std::max(b, c.rate) : c.rate;
    }
    if (known(b)) best.push_back({b, i});
  }
  if (best.size() < 2) return std::nullopt;
  std::sort(best.begin(), best.end());
  if (!(best[0].first <= kNarrowLinkRateShare * best[1].first)) return std::nullopt;
  out.culprit = best[0].second;
  out.by_rate = true;
  out.rate_mb_s = best[0].first;
  out.next_rate_mb_s = best[1].first;
  peers_of_culprit();
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

// ---------------------------------------------------------------------------------------------
// The cause table. Each cause has a layer (cause.h), an evidence rule, named thresholds with the
// reason for each value, a base confidence and advice. descend() measures rank c against its peers
// once (RankCase) and walks the table; every rule that finds its evidence offers a hypothesis, and
// the one that explains most of the lost time is the finding.

// A cause must explain at least this share of what the rank (or the job) lost to be reported: the
// time its named culprit explains, not the size of the metric it moved. A process that ran 0.24 ms
// per step beside a rank that lost 3.95 ms (6%) is a bystander. A quarter leaves room for two
// causes on one rank, each explaining about half, and for the sampling error of profiles (~10%).
constexpr double kMinExplainedShare = 0.25;
// Other hypotheses are listed as "also" when they explain at least this share of the top one's.
constexpr double kAlsoShare = 0.3;

struct Hypothesis {
  Cause cause = Cause::kHostHotspot;
  std::string culprit;
  double explained_ms = 0;
  // How sure the rule is of its evidence, relative to the cause's base confidence (1: direct).
  double certainty = 1;
  std::vector<std::string> evidence;
};

// What the rules read about rank c: its excess over its peers per layer, measured once.
struct RankCase {
  const JobWindow& job;
  size_t c;
  const RankWindow& r;
  std::vector<size_t> peers;
  double extra;   // busy time beyond the peers' (or the job's loss, job-wide)
  bool job_wide;  // every rank slowed alike: neighbours are compared with nothing (never normal)
  std::string who;

  double dev = 0, dev_peers = kUnknown;  // device compute time
  double cpu = 0, cpu_peers = kUnknown;  // on-CPU time
  double cpu_growth = 0;                 // cpu / cpu_peers
  bool gpu_throttled = false;            // NVML saw throttling or a low SM clock
  double host = 0;                       // extra time not on the device: the host kept it waiting
  double runq = 0, thr = 0;              // run-queue wait, cgroup throttling beyond peers
  std::optional<NeighbourDiff> nb;       // the foreign process that runs most on its CPUs
  bool unthrottled = false;              // its cgroup measured (near) no throttling
  double queued_ms = 0;                  // run-queue wait its own extra CPU work explains
  // The extra run-queue wait its extra CPU demand predicts at its peers' wait per CPU ms: on a busy
  // node, work that takes 40 ms of CPU keeps the step waiting longer than 40 ms, and that wait is
  // part of what the work costs (never contention: it is set apart from `runq` before the rules).
  double own_queue_ms = 0;
  double rec = 0, io = 0, irq = 0, pf = 0, launch = 0;
  // Run-queue wait behind the kernel's interrupt threads (ksoftirqd) beyond the peers': interrupt
  // work, set apart from `runq` (irq-softirq counts it, cpu-contention does not).
  double irq_wait = 0, irq_threads_ms = 0, irq_threads_peers = 0;
  double fault_io = 0;                   // blocked in page faults beyond the peers (part of io's wait)
  double fault_cpu = 0;                  // on-CPU in page faults beyond the peers
  double alloc = 0, sync_copy = 0;       // host time in memory calls beyond the peers'
  std::optional<PathDiff> hot;           // the differential on-CPU profile's top path
  double rest_mine = 0, rest_peers = 0;  // on-CPU time outside `hot`'s function
  std::string idle_ev;                   // the GPU idled waiting for the CPU (evidence for host causes)

  RankCase(const JobWindow& j, size_t rank, double e, bool wide)
      : job(j), c(rank), r(j.ranks[rank]), peers(peers_of(j, rank)), extra(e), job_wide(wide), who(rank_name(r)) {}
};

// Device time grew by at least this share of the rank's extra busy time: below it the GPU is not
// where the time went (kernel timing jitter is a few %).
constexpr double kGpuShareOfExtra = 0.3;
// A GPU throttles when NVML reports a reason or its SM clock runs under 90% of its maximum (boost
// clocks wander a few % under load without any reason reported).
constexpr double kThrottledClockRatio = 0.9;
// More device time with this much more CPU per step is more data per step, not a slower GPU: a
// slower GPU leaves the host's work as it was (the CPU time of a rank varies ~10% between peers).
constexpr double kImbalanceCpuGrowth = 0.25;
// A CPU-only rank whose on-CPU time outside its top function grew this much does more of all its
// work (more data per step); a hotspot leaves the rest of the step as it was.
constexpr double kImbalanceRestGrowth = 0.25;
// Throttling (or one neighbour) explains the run-queue wait when it accounts for half of it; the
// rest is other work on a busy node.
constexpr double kShareOfRunq = 0.5;
// A cgroup with under 1 ms of throttling per step is not throttled (the counter's granularity is
// one 100 ms period's overrun, spread over steps).
constexpr double kUnthrottledMs = 1.0;
// A rank's own extra CPU explains its extra run-queue wait up to a load factor of 20 (0.2 ms more
// CPU is no reason to wait 800 ms more; hogs that arrived mid-window are). At least 1 ms of it.
constexpr double kMaxLoadFactor = 20;
constexpr double kMinOwnCpuMs = 1.0;
// Reclaim of at least 0.5 ms per step with more block I/O is page cache thrown out and read again.
constexpr double kThrashReclaimMs = 0.5;
// A path is new on the rank when its peers run it under half as much: a hotspot, not more of the
// usual work.
constexpr double kFreshPathShare = 0.5;
// More of the usual work explains about half its extra CPU time (the rest is sampling spread).
constexpr double kUsualWorkShare = 0.5;
// Launch calls explain the host's extra time when they are half of it.
constexpr double kLaunchShareOfHost = 0.5;
// A rank launches more when its device runs this factor more kernels per step than its peers': the
// device timeline counts every kernel, and a program that runs the same code runs the same count
// step after step (the counts of healthy peers differ by the odd collective); an optimizer stepped
// tensor by tensor multiplies its launches by the tensors (hundreds).
constexpr double kMoreKernels = 1.5;
// ... and by at least this many per step: a launch costs the host a few us (2-5 us in the driver,
// tens of us with an eager framework's dispatch), so fewer than 100 more cost well under a ms.
constexpr double kMinExtraKernels = 100;
// The top path launches kernels when this share of its on-CPU time is inside the launch calls: in
// an eager framework the call is the smaller part of an operation's host time (Python and the
// dispatcher hold the rest), and code that launches nothing has none of it.
constexpr double kLaunchInHotPathShare = 0.1;
// A major fault without measured block I/O latency costs about an SSD read (0.5 ms).
constexpr double kDefaultFaultMs = 0.5;
// What one major fault of rank `r` waits: its measured block I/O latency, else kDefaultFaultMs.
double fault_ms(const RankWindow& r) { return known(r.get(Os::kBioLatency)) ? r.get(Os::kBioLatency) : kDefaultFaultMs; }
// Device-memory calls (memory-alloc-churn, sync-memcpy) name the cause only when the program makes
// more of them than its reference (peers, or its own healthy past) by this factor: the program
// changed (the caching allocator off or fragmented, a copy made synchronous), not the same calls
// running slower, which a slower device, link or host explains under its own cause. A per-step rate
// read over windows of steps (and burst-sampled past the agent's budget) varies by 10-20% between
// peers; churn multiplies the calls by the tensors of a step (tens).
constexpr double kMoreMemoryCalls = 1.5;
// ... and by at least one call per step: 0.2 calls per step against 0.1 is no new behaviour.
constexpr double kMinExtraMemoryCalls = 1.0;
// A synchronous copy that moves this factor more bytes per step also changed (a larger tensor read
// back every step), with as many calls; the same reason as kMoreMemoryCalls.
constexpr double kMoreCopiedBytes = 1.5;
// Memory calls explain the host's extra time when they are half of it, as launches do.
constexpr double kMemoryShareOfHost = 0.5;
// A CPU profile's path is in the memory calls when most of its time is under one of their APIs;
// the rest is the loop that makes them.
constexpr double kHotPathInCallsShare = 0.5;

// Whether a call path was sampled in one of the rank's worker processes.
bool in_worker(const std::string& path) { return std::string_view(path).substr(0, kWorkerFrame.size()) == kWorkerFrame; }
std::string worker_evidence(const RankCase& k) {
  std::string pids;
  for (uint32_t p : k.r.workers) pids += (pids.empty() ? "" : ", ") + std::to_string(p);
  return "it runs in a worker process of " + k.who + " (a DataLoader worker" + (pids.empty() ? "" : ": pid " + pids) +
         "), counted for the rank: the rank waits for its batches";
}

std::string gpu_name(const RankWindow& r) { return "GPU " + std::to_string(r.gpu.index >= 0 ? r.gpu.index : r.rank); }

// -- evidence rules, one per cause (workload-imbalance has one per shape of the data).

std::optional<Hypothesis> gpu_slow(const RankCase& k) {
  if (!(k.dev > 0 && k.dev >= kGpuShareOfExtra * k.extra)) return std::nullopt;
  if (!k.gpu_throttled && k.cpu_growth >= kImbalanceCpuGrowth) return std::nullopt;  // more data: imbalance
  const RankWindow& r = k.r;
  Hypothesis h;
  h.cause = Cause::kGpuSlow;
  h.culprit = gpu_name(r);
  h.explained_ms = k.dev;
  h.evidence.push_back(k.who + "'s GPU computes " + ms(r.now.device_compute_ms) + " per step vs " + ms(k.dev_peers) +
                       " on its peers (+" + ms(k.dev) + ")");
  std::string kev = kernel_evidence(k.job, k.c, k.peers);
  if (!kev.empty()) h.evidence.push_back("kernel time per step: " + kev);
  if (k.gpu_throttled) {
    std::string nv = "NVML: " + h.culprit;
    if (!r.gpu.throttle_reasons.empty()) nv += " throttle reasons " + r.gpu.throttle_reasons;
    if (known(r.gpu.sm_clock_ratio)) nv += fmt(", SM clock at %.0f%% of max", 100 * r.gpu.sm_clock_ratio);
    h.evidence.push_back(nv);
  } else {
    // NVML seeing nothing wrong makes a slow GPU less certain than no NVML at all.
    constexpr double kNvmlSeesNothing = 0.67, kNoNvml = 0.78;
    h.certainty = r.gpu.known ? kNvmlSeesNothing : kNoNvml;
    h.evidence.push_back(r.gpu.known ? "NVML reports no throttling: a degraded GPU or its PCIe link"
                                     : "same launches, longer kernels; no NVML data to confirm throttling");
  }
  return h;
}

// A device computing this much more than its peers' median, with the host doing more too, does
// more work per step whatever share of the rank's extra time that is: on a busy node most of the
// extra is the wait for a CPU, and the device's growth is then a small share of it (a hotspot or a
// slow host leaves the device's work as it was; kernel timing varies a few % between peers).
constexpr double kImbalanceDeviceGrowth = 0.25;

std::optional<Hypothesis> imbalance_on_device(const RankCase& k) {
  bool device_grew = k.dev > 0 && known(k.dev_peers) && k.dev_peers > 0 && k.dev >= kImbalanceDeviceGrowth * k.dev_peers;
  if (!((k.dev > 0 && k.dev >= kGpuShareOfExtra * k.extra) || device_grew) || k.gpu_throttled ||
      k.cpu_growth < kImbalanceCpuGrowth)
    return std::nullopt;
  const RankWindow& r = k.r;
  Hypothesis h;
  h.cause = Cause::kWorkloadImbalance;
  auto d = differential_profile(k.job, k.c, k.peers, &RankWindow::oncpu);
  // The input, not a function: every function of the step does more of the same work.
  h.culprit = "larger batches" + (d ? " (more work in " + d->function + ")" : std::string());
  h.explained_ms = k.extra;
  h.evidence.push_back(k.who + "'s GPU computes " + ms(r.now.device_compute_ms) + " per step vs " + ms(k.dev_peers) +
                       " on its peers (+" + ms(k.dev) + ")");
  std::string kev = kernel_evidence(k.job, k.c, k.peers);
  if (!kev.empty()) h.evidence.push_back("kernel time per step: " + kev);
  h.evidence.push_back(k.who + " also spends " + fmt("%.0f%%", 100 * k.cpu_growth) + " more CPU per step (" +
                       ms(r.get(Os::kCpu)) + " vs " + ms(k.cpu_peers) + "): more data per step, not a slower GPU" +
                       (r.gpu.known ? " (NVML: no throttling)" : ""));
  if (d) h.evidence.push_back("most of the extra CPU time in " + d->function + ": +" + ms(d->excess_ms) + " per step");
  return h;
}

std::string runq_evidence(const RankCase& k) {
  return k.who + " waits " + ms(k.r.get(Os::kRunqWait)) + " per step runnable but not running (+" +
         ms(os_excess(k.job, k.c, k.peers, Os::kRunqWait)) + " vs peers)";
}

// Runnable but not running, and not its own extra work queuing (that is the hotspot's cost).
bool waits_for_cpu(const RankCase& k) { return (k.runq > 0 || k.thr > 0) && k.queued_ms == 0; }

std::optional<Hypothesis> cpu_throttling(const RankCase& k) {
  if (!waits_for_cpu(k)) return std::nullopt;
  bool by_quota = k.thr > 0 && k.thr >= kShareOfRunq * k.runq;
  bool named = k.nb && k.nb->excess_ms >= kShareOfRunq * k.runq;
  // Waiting with no neighbour to blame and no measurement saying the cgroup is unthrottled: a
  // quota is the likeliest reason left, with less certainty.
  bool by_elimination = !by_quota && !named && !k.unthrottled;
  if (!by_quota && !by_elimination) return std::nullopt;
  Hypothesis h;
  h.cause = Cause::kCpuThrottling;
  h.culprit = "cgroup cpu quota";
  h.evidence.push_back(runq_evidence(k));
  if (by_quota) {
    h.explained_ms = std::max(k.thr, k.runq);
    h.evidence.push_back(k.who + " is throttled by its cgroup " + ms(k.r.get(Os::kThrottled)) + " per step (+" + ms(k.thr) + " vs peers)");
  } else {
    constexpr double kByElimination = 0.7;
    h.explained_ms = k.runq;
    h.certainty = kByElimination;
    h.evidence.push_back("no other process on its CPUs accounts for it: a CPU quota (cgroup cpu.max / cfs_quota)");
  }
  return h;
}

// The culprit of a rank whose CPUs are oversubscribed with no one process to name.
constexpr const char* kOversubscribed = "other work on the node's CPUs";

std::optional<Hypothesis> cpu_contention(const RankCase& k) {
  if (!waits_for_cpu(k)) return std::nullopt;
  if (k.thr > 0 && k.thr >= kShareOfRunq * k.runq) return std::nullopt;  // the quota's
  bool named = k.nb && k.nb->excess_ms >= kShareOfRunq * k.runq;
  if (!named && !k.unthrottled) return std::nullopt;  // cpu_throttling by elimination
  Hypothesis h;
  h.cause = Cause::kCpuContention;
  h.evidence.push_back(runq_evidence(k));
  if (named) {
    // Named for what the process explains: at most its own run time on the rank's CPUs.
    h.culprit = k.nb->name;
    h.explained_ms = std::min(k.runq, k.nb->excess_ms);
    h.evidence.push_back("process `" + k.nb->name + "` runs " + ms(k.nb->culprit_ms) + " per step on " + k.who + "'s CPUs" +
                         (k.job_wide ? "" : " (+" + ms(k.nb->excess_ms) + " vs peers)"));
    return h;
  }
  // Runnable, not throttled: its CPUs are oversubscribed. A process that ran there more than on its
  // peers' CPUs is named for what it explains, its own run time; the rest of the wait has no one
  // culprit on a busy node.
  constexpr double kBusyNode = 0.63, kNamedOnBusyNode = 0.75;
  if (k.nb && k.nb->excess_ms > 0) {
    h.culprit = k.nb->name;
    h.explained_ms = std::min(k.runq, k.nb->excess_ms);
    h.certainty = kNamedOnBusyNode;
    h.evidence.push_back("process `" + k.nb->name + "` runs " + ms(k.nb->culprit_ms) + " per step on " + k.who + "'s CPUs (+" +
                         ms(k.nb->excess_ms) + " vs peers) of its " + ms(k.runq) + " more wait; the rest is other work on a busy node");
  } else {
    h.culprit = kOversubscribed;
    h.explained_ms = k.runq;
    h.certainty = kBusyNode;
    h.evidence.push_back("its cgroup was not throttled and no one process on its CPUs accounts for it: the node's CPUs are oversubscribed");
  }
  return h;
}

std::optional<Hypothesis> memory_reclaim(const RankCase& k) {
  if (k.rec <= 0) return std::nullopt;
  // Reclaim under a memory limit takes the page cache the rank reads its data from: the reads go
  // to disk again. Its extra block I/O is then the limit's cost too, not a slow disk.
  bool thrash = k.rec >= kThrashReclaimMs && k.io > 0;
  Hypothesis h;
  h.cause = Cause::kMemoryReclaim;
  auto d = blocking_caller(k.job, k.c, k.peers);
  h.culprit = d ? d->function : "memory limit";
  h.explained_ms = k.rec + (thrash ? k.io : 0);
  h.evidence.push_back(k.who + " stalls in direct reclaim / compaction " + ms(k.r.get(Os::kReclaim)) + " per step (+" + ms(k.rec) + " vs peers)");
  if (thrash)
    h.evidence.push_back("and waits " + ms(k.io) + " more per step than its peers on block I/O: its page cache is reclaimed, so it reads its data from disk again");
  // The function whose allocations reclaim: the caller of the blocked call, from the same call
  // sampled on-CPU (a page-cache read charging a full cgroup blocks with no user frames).
  std::string sc = d ? syscall_in(d->path) : std::string();
  if (auto site = !sc.empty() ? call_site(k.job, k.c, sc) : std::nullopt) {
    h.culprit = site->name();
    h.evidence.push_back("it blocks in " + site->syscall + " called from " + site->caller +
                         ": the pages it reads are charged to its full cgroup, which reclaims first");
  }
  return h;
}

std::optional<Hypothesis> io_stall(const RankCase& k) {
  // The wait in page faults is page-faults' (the rank read memory, not a file): what is left.
  const double io = k.io - std::min(k.io, k.fault_io);
  if (io <= 0) return std::nullopt;
  const RankWindow& r = k.r;
  Hypothesis h;
  h.cause = Cause::kIoStall;
  auto d = blocking_caller(k.job, k.c, k.peers);
  if (d && in_page_fault(d->path)) d.reset();  // no call of its own to name
  h.culprit = d ? d->function : "block I/O";
  h.explained_ms = io;
  h.evidence.push_back(k.who + " is blocked on I/O " + ms(r.get(Os::kBlockedIo)) + " per step (+" + ms(k.io) + " vs peers)");
  if (known(r.get(Os::kBioLatency))) {
    double lat_peers = peer_median(k.job, k.peers, [](const RankWindow& x) { return x.get(Os::kBioLatency); });
    h.evidence.push_back("block I/O latency " + ms(r.get(Os::kBioLatency)) + " per request" +
                         (known(lat_peers) ? " vs " + ms(lat_peers) + " on its peers" : "; its peers issue no block I/O"));
  }
  if (d) h.evidence.push_back("blocked time grows under " + d->function + ": +" + ms(d->excess_ms) + " per step");
  if (d && in_worker(d->path)) h.evidence.push_back(worker_evidence(k));
  // Name the function that makes the blocking call, from the same call seen on-CPU.
  std::string sc = d ? syscall_in(d->path) : std::string();
  if (auto site = call_site(k.job, k.c, sc)) {
    h.culprit = site->name();
    std::string proc = r.process.empty() ? k.who : "`" + r.process + "` (" + k.who + ", pid " + std::to_string(r.pid) + ")";
    if (d && in_worker(d->path)) proc = k.who + "'s worker";
    h.evidence.push_back(proc + " blocks in " + site->syscall + " called from " + site->caller + ": its on-CPU stacks in that call (" +
                         ms(site->ms) + " per step) name the caller" +
                         (d && d->function == site->syscall ? "; the blocked stacks carry no user frames" : ""));
  }
  return h;
}

std::optional<std::string> confined_cpu(const RankWindow& r);

// Interrupt work on the rank's CPUs beyond its peers'. Named by its source (the softirq or IRQ that
// grew most against the same source on the peers: "NET_RX softirq", "IRQ 24:virtio0-input") and by
// the CPU when the rank runs on one ("on CPU 1 of node-3"), else its CPUs.
std::optional<Hypothesis> irq_softirq(const RankCase& k) {
  const double stolen = std::max(0.0, k.irq);
  if (stolen <= 0 && k.irq_wait <= 0) return std::nullopt;
  Hypothesis h;
  h.cause = Cause::kIrqSoftirq;
  std::string source;
  double most = 0, source_ms = 0, source_peers = 0;
  for (const auto& v : k.r.irq_sources) {
    const double peers = peer_median(k.job, k.peers, [&](const RankWindow& x) { return value_of(x.irq_sources, v.name); });
    if (!known(peers) || v.ms_per_step - peers <= most) continue;
    most = v.ms_per_step - peers;
    source = k.job.names.name(v.name);
    source_ms = v.ms_per_step;
    source_peers = peers;
  }
  const auto cpu = confined_cpu(k.r);
  // Interrupt time stolen from the ranks that share its CPU delays it too: it waits for that CPU
  // while they run longer. Counted up to its own run-queue wait beyond its peers'.
  double behind = 0;
  std::string beside;
  if (cpu && known(k.r.get(Os::kIrq))) {
    const double base = k.r.get(Os::kIrq) - k.irq;  // its peers' median
    for (size_t p : k.peers) {
      const RankWindow& q = k.job.ranks[p];
      if (q.node != k.r.node || confined_cpu(q) != cpu || !known(q.get(Os::kIrq)) || q.get(Os::kIrq) <= base) continue;
      behind += q.get(Os::kIrq) - base;
      beside += (beside.empty() ? "" : ", ") + rank_name(q) + " (+" + ms(q.get(Os::kIrq) - base) + ")";
    }
  }
  const double wait_behind = std::min(behind, std::max(0.0, k.runq));
  const std::string what = !source.empty() ? source : stolen > 0 ? std::string("interrupts") : std::string("softirq work");
  h.culprit = what + (cpu ? " on CPU " + *cpu + " of " + k.r.node : " on " + k.who + "'s CPUs");
  // What it takes from the rank: the interrupt time that ran while the rank was current, and the
  // wait for its CPUs while the kernel's softirq thread ran the work deferred to it.
  h.explained_ms = stolen + k.irq_wait + wait_behind;
  if (stolen > 0)
    h.evidence.push_back(k.who + "'s CPUs spend " + ms(k.r.get(Os::kIrq)) + " per step in IRQ/softirq (+" + ms(k.irq) + " vs peers)");
  if (!source.empty())
    h.evidence.push_back(source + " holds " + ms(source_ms) + " per step of it vs " + ms(source_peers) + " on its peers' CPUs" +
                         (cpu ? "; " + k.who + " runs on CPU " + *cpu : ""));
  if (k.irq_wait > 0)
    h.evidence.push_back("the kernel's interrupt threads (ksoftirqd) run " + ms(k.irq_threads_ms) + " per step on " + k.who +
                         "'s CPUs (" + ms(k.irq_threads_peers) + " on its peers'): softirq work deferred to them, which " + k.who +
                         " waits " + ms(k.irq_wait) + " per step for");
  if (wait_behind > 0)
    h.evidence.push_back("the ranks that share CPU " + *cpu + " lose time to interrupts too: " + beside + " per step; " + k.who +
                         " waits " + ms(wait_behind) + " per step more than its peers for that CPU while they run longer");
  return h;
}

// Major faults beyond the peers': each waits for a page read from disk. What they cost is the time
// the rank was blocked in them (its off-CPU paths through kPageFaultCall) where the off-CPU layer
// saw it, else the faults times the block I/O latency (the disk's part only: the estimate without
// stacks). Named with the function that touched the memory.
std::optional<Hypothesis> page_faults(const RankCase& k) {
  if (k.pf <= 0) return std::nullopt;
  Hypothesis h;
  h.cause = Cause::kPageFaults;
  const double lat = fault_ms(k.r);
  // Where: the function whose on-CPU stacks are inside the faults, else the one on the blocked paths.
  auto site = call_site(k.job, k.c, kPageFaultCall);
  auto d = !site ? blocking_caller(k.job, k.c, k.peers, true) : std::nullopt;
  if (d && d->function.ends_with("()")) d.reset();  // blocked paths with no user frame name no one
  const std::string where = site ? site->caller : d ? d->function : "";
  h.culprit = "major page faults" + (where.empty() ? "" : " in " + where);
  // Their CPU time queues on a busy node as any extra CPU time does (cpu_hypothesis: the wait its
  // CPU demand predicts, and the wait to run it on), in the same proportion.
  const double queue = k.cpu > 0 ? std::min(k.fault_cpu, k.cpu) / k.cpu * (k.own_queue_ms + k.queued_ms) : 0;
  h.explained_ms = std::max(k.pf * lat, k.fault_io) + k.fault_cpu + queue;
  h.evidence.push_back(k.who + fmt(" takes %.1f more major faults per step than its peers", k.pf) + ", " + ms(lat) +
                       " each (block I/O latency" + (known(k.r.get(Os::kBioLatency)) ? ")" : " not recorded: an SSD read)"));
  if (k.fault_io > 0) h.evidence.push_back("they hold " + ms(k.fault_io) + " per step of its wait for I/O: it reads memory, not a file");
  if (k.fault_cpu > 0)
    h.evidence.push_back("and " + ms(k.fault_cpu) + " per step on the CPU in the kernel's fault handling, beyond its peers'" +
                         (queue > 0 ? " (and " + ms(queue) + " waiting for a CPU to run it on, as its extra CPU time predicts)" : ""));
  if (!where.empty())
    h.evidence.push_back(where + " touches the memory that faults: it was out of memory (a memory-mapped file's pages reclaimed, or swapped out)");
  return h;
}

// Where a rank's host thread calls a memory API from: on its on-CPU and off-CPU stacks, the frame
// that calls the API's own frame, by the time under it (a real cudaMemcpy or cudaFree spins or
// blocks there). Empty when no stack passes through the API (a call that sleeps is in neither).
std::string memory_call_site(const JobWindow& job, const RankWindow& r, const std::string& api) {
  std::map<std::string, double> by_caller;
  for (const Values* profile : {&r.oncpu, &r.offcpu}) {
    for (const auto& v : *profile) {
      auto frames = split_path(job.names.name(v.name));
      for (size_t i = 1; i < frames.size(); ++i) {
        if (short_function(frames[i]) != api) continue;
        for (size_t j = i; j-- > 0;) {
          if (unresolved_frame(frames[j]) || frames[j] == kWorkerFrame) continue;
          by_caller[caller_name(frames[j])] += v.ms_per_step;
          break;
        }
        break;
      }
    }
  }
  std::string best;
  double most = 0;
  for (const auto& [caller, t] : by_caller) {
    if (t > most) best = caller, most = t;
  }
  return best;
}

// Where the rank makes its memory calls of one kind, from the calls sampled with their stacks
// (RankWindow::memory_call_sites): the call site most of them come from, its share, and how many
// were sampled. Empty when none was sampled with a resolved frame.
struct SampledSite {
  std::string site;
  double calls = 0, total = 0;
};
struct SampledSites {
  std::map<std::string, double> by_site;
  void add(const JobWindow& job, const RankWindow& r, bool (*kind)(std::string_view)) {
    for (const auto& v : r.memory_call_sites) {
      std::string_view key = job.names.name(v.name);
      auto bar = key.find('|');
      if (bar != std::string_view::npos && kind(key.substr(0, bar))) by_site[caller_name(key.substr(bar + 1))] += v.ms_per_step;
    }
  }
  SampledSite top() const {
    SampledSite best;
    for (const auto& [site, n] : by_site) {
      best.total += n;
      if (n > best.calls) best.site = site, best.calls = n;
    }
    return best;
  }
};
SampledSite sampled_call_site(const JobWindow& job, const RankWindow& r, bool (*kind)(std::string_view)) {
  SampledSites s;
  s.add(job, r, kind);
  return s.top();
}

// A call site that only wraps the memory call (a program's `dev_malloc` around cudaMalloc, which
// adds a counter or an error check) names no place a person would change: where the calls are made
// is its caller. A function is such a wrapper when at least this share of its on-CPU time is inside
// the memory APIs it wraps: a wrapper does nothing but the call and a few instructions around it,
// while a function that does work of its own around the calls (fills the buffers it allocates, a
// loop over layers) spends more than a tenth of its time outside them. "Inside" is under a frame
// named as the API or under any frame of the CUDA runtime's libraries (JobWindow::
// cuda_runtime_frames, by module): the API's own frame is often not on the stack (a stripped
// libcudart's internals, a tail call into the runtime's helpers).
constexpr double kWrapperInsideShare = 0.9;

// `site` (a caller_name, as SampledSite::site and memory_call_site give it) with its caller when the
// on-CPU profiles of `ranks` show it is a wrapper of the memory calls of `kind`: "a lambda in main
// through dev_malloc"; else `site` as it is (also when no profile passes through it: nothing then
// says what else it does).
std::string unwrapped_site(const JobWindow& job, const std::vector<const RankWindow*>& ranks, const std::string& site,
                           bool (*kind)(std::string_view)) {
  if (site.empty()) return site;
  double all = 0, inside = 0;
  std::map<std::string, double> callers;
  for (const RankWindow* r : ranks) {
    std::set<std::string> apis;  // the memory APIs of this kind the rank calls
    for (const auto& a : r->memory_api_ms) {
      const std::string& api = job.names.name(a.name);
      if (kind(api)) apis.insert(api);
    }
    for (const auto& v : r->oncpu) {
      auto frames = split_path(job.names.name(v.name));
      size_t at = frames.size();  // the site's innermost frame on the path
      for (size_t i = frames.size(); i-- > 0;) {
        if (caller_name(frames[i]) == site) {
          at = i;
          break;
        }
      }
      if (at == frames.size()) continue;
      all += v.ms_per_step;
      bool in_call = false;
      for (size_t j = at + 1; j < frames.size() && !in_call; ++j)
        in_call = apis.count(short_function(frames[j])) > 0 || job.cuda_runtime_frames.count(std::string(frames[j])) > 0;
      if (!in_call) continue;
      inside += v.ms_per_step;
      for (size_t j = at; j-- > 0;) {
        if (unresolved_frame(frames[j]) || frames[j] == kWorkerFrame) continue;
        callers[caller_name(frames[j])] += v.ms_per_step;
        break;
      }
    }
  }
  if (!(all > 0 && inside >= kWrapperInsideShare * all)) return site;
  std::string caller;
  double most = 0;
  for (const auto& [c, t] : callers) {
    if (t > most && c != site) caller = c, most = t;
  }
  return caller.empty() ? site : caller + " through " + site;
}

// The memory calls of one kind on rank c against its peers and its own healthy past: whether the
// program makes more of them (the rule's gate), and the evidence lines that say so.
struct MemoryCallDiff {
  bool more = false;           // more calls (or bytes) per step than the peers, by the named factors
  bool more_than_past = false; // ... and than its own healthy past (false also when it has none)
  bool has_past = false;
  std::string top_api;         // the API whose time grew most ("cudaFree")
  std::string apis;            // the APIs whose time grew, most first ("cudaFree + cudaMalloc")
  std::vector<std::string> evidence;
};

MemoryCallDiff memory_call_diff(const RankCase& k, Os time, Os calls, Os mb, bool (*kind)(std::string_view)) {
  const RankWindow& r = k.r;
  MemoryCallDiff d;
  const double calls_mine = r.get(calls);
  const double calls_peers = peer_median(k.job, k.peers, [calls](const RankWindow& x) { return x.get(calls); });
  if (!known(calls_mine) || !known(calls_peers)) return d;
  auto more = [](double mine, double ref, double factor, double min_extra) {
    return mine >= factor * ref && mine - ref >= min_extra;
  };
  bool more_calls = more(calls_mine, calls_peers, kMoreMemoryCalls, kMinExtraMemoryCalls);
  double mb_mine = known(r.get(mb)) ? r.get(mb) : 0;
  double mb_peers = peer_median(k.job, k.peers, [mb](const RankWindow& x) { return x.get(mb); });
  bool more_bytes = mb == Os::kSyncCopyMb && known(mb_peers) && calls_mine >= kMinExtraMemoryCalls &&
                    mb_mine > 0 && mb_mine >= kMoreCopiedBytes * mb_peers;
  d.more = more_calls || more_bytes;
  const double time_mine = r.get(time);
  const double time_peers = peer_median(k.job, k.peers, [time](const RankWindow& x) { return x.get(time); });
  auto per_call = [](double t, double n) { return n > 0 ? " (" + ms(t / n) + " per call)" : std::string(); };
  d.evidence.push_back(k.who + fmt(" makes %.1f", calls_mine) + " of these calls per step vs " + fmt("%.1f", calls_peers) +
                       " on its peers, and its host thread spends " + ms(time_mine) + " per step in them" +
                       per_call(time_mine, calls_mine) + " vs " + ms(time_peers) + per_call(time_peers, calls_peers));
  if (mb == Os::kSyncCopyMb && (mb_mine > 0 || (known(mb_peers) && mb_peers > 0)))
    d.evidence.push_back(fmt("they copy %.1f MB", mb_mine) + " per step vs " + fmt("%.1f MB", known(mb_peers) ? mb_peers : 0.0) + " on its peers");
  // Its own healthy past, when the job has one.
  if (r.past.windows > 0 && known(r.past.get(calls))) {
    d.has_past = true;
    const double calls_past = r.past.get(calls);
    d.more_than_past = more(calls_mine, calls_past, kMoreMemoryCalls, kMinExtraMemoryCalls);
    d.evidence.push_back(fmt("in its own healthy past it made %.1f", calls_past) + " per step, " + ms(r.past.get(time)) + " in them" +
                         (d.more_than_past ? ": the calls are new" : ": as many as now"));
  }
  // Which API grew, by its time.
  struct Grew {
    double ms;
    NameId api;
  };
  std::vector<Grew> grew;
  for (const auto& v : r.memory_api_ms) {
    if (!kind(k.job.names.name(v.name))) continue;
    double p = peer_median(k.job, k.peers, [&](const RankWindow& x) { return value_of(x.memory_api_ms, v.name); });
    if (v.ms_per_step - p > 0) grew.push_back({v.ms_per_step - p, v.name});
  }
  std::sort(grew.begin(), grew.end(), [](const Grew& a, const Grew& b) { return a.ms > b.ms; });
  std::string by_api;
  for (const auto& g : grew) {
    const std::string& api = k.job.names.name(g.api);
    d.apis += (d.apis.empty() ? "" : " + ") + api;
    by_api += (by_api.empty() ? "" : "; ") + api + " +" + ms(g.ms) + fmt(" (%.1f calls)", value_of(r.memory_api_calls, g.api));
  }
  if (!grew.empty()) {
    d.top_api = k.job.names.name(grew.front().api);
    d.evidence.push_back("by API, per step vs peers: " + by_api);
  }
  return d;
}

bool is_alloc_api(std::string_view api) { return api != "cudaMemcpy"; }
bool is_copy_api(std::string_view api) { return api == "cudaMemcpy"; }

// The share of the rank's loss a memory rule explains, said in its evidence.
std::string memory_share(const RankCase& k, double explained) {
  double share = k.extra > 0 ? std::min(1.0, explained / k.extra) : 0;
  return "the extra time in these calls, " + ms(explained) + " per step, is " + fmt("%.0f%%", 100 * share) + " of the " +
         ms(k.extra) + " per step " + k.who + " is busier than its peers (its extra busy time)";
}

// Whether comparable path `path` is `top` or runs under it (a callee's path).
bool under_path(const std::string& path, const std::string& top) {
  return path.size() >= top.size() && path.compare(0, top.size(), top) == 0 && (path.size() == top.size() || path[top.size()] == ';');
}

// The share of the CPU profile's top path's time (the stacks under it) whose frames, from its own
// function down, include one `in_call` accepts. The top path is a comparable path (a Python stack's
// Python frames only): a stack is under it when its comparable path is, and its own frames below
// the top function (native ones too: the launch or copy a Python function makes) are searched.
template <typename InCall>
double hot_share_in(const RankCase& k, InCall in_call) {
  if (!k.hot) return 0;
  const std::string& hot = k.hot->path;
  const auto hot_frames = split_path(hot);
  double all = 0, inside = 0;
  for (const auto& v : k.r.oncpu) {
    const std::string& raw = k.job.names.name(v.name);
    bool broken = false, worker = false;
    const std::string path = comparable_path(k.job, raw, &broken, &worker);
    if (!under_path(path, hot)) continue;
    all += v.ms_per_step;
    size_t matched = 0;  // the top path's frames found in order; its last one begins the search
    for (auto f : split_path(raw)) {
      if (matched < hot_frames.size() && f == hot_frames[matched]) ++matched;
      if (matched < hot_frames.size() || !in_call(f)) continue;
      inside += v.ms_per_step;
      break;
    }
  }
  return all > 0 ? inside / all : 0;
}

// Whether the CPU profile's top path is in the rank's memory calls of one kind: most of its time is
// inside one of the APIs (a real runtime spins on the CPU in a synchronous copy or in a cudaFree's
// device sync), or its function is where most of the calls sampled with their stacks are made (the
// loop around them: the probes' traps on each call, the bookkeeping per call).
bool hot_path_in_memory_calls(const RankCase& k, bool (*kind)(std::string_view)) {
  if (!k.hot) return false;
  auto in_api = [&](std::string_view f) {
    for (const auto& a : k.r.memory_api_ms) {
      const std::string& api = k.job.names.name(a.name);
      if (kind(api) && short_function(f) == api) return true;
    }
    return false;
  };
  if (hot_share_in(k, in_api) >= kHotPathInCallsShare) return true;
  auto frames = split_path(k.hot->path);
  const SampledSite site = sampled_call_site(k.job, k.r, kind);
  return !frames.empty() && !site.site.empty() && caller_name(frames.back()) == site.site;
}

Hypothesis cpu_hypothesis(const RankCase& k);
bool more_of_everything(const RankCase& k);

std::optional<Hypothesis> memory_calls_hypothesis(const RankCase& k, Cause cause, double excess, Os time, Os calls, Os mb,
                                                  bool (*kind)(std::string_view)) {
  // A CPU hotspot in these calls is their cost measured a second way: the calls' time on the host
  // thread holds their CPU work and its wait for a CPU, the hot path's estimate holds that work, the
  // loop around the calls and their share of the run-queue wait. One cause: the larger of the two.
  const bool hot_in_calls = k.cpu > 0 && k.hot && !more_of_everything(k) && hot_path_in_memory_calls(k, kind);
  const double hot_ms = hot_in_calls ? cpu_hypothesis(k).explained_ms : 0;
  const double cost = std::max(excess, hot_ms);
  if (!(excess > 0 && cost >= kMemoryShareOfHost * k.host)) return std::nullopt;
  MemoryCallDiff d = memory_call_diff(k, time, calls, mb, kind);
  if (!d.more) return std::nullopt;  // the same calls, slower: not the program's doing
  Hypothesis h;
  h.cause = cause;
  h.explained_ms = cost;
  const std::string api = d.top_api.empty() ? std::string(cause == Cause::kSyncMemcpy ? "cudaMemcpy" : "cudaMalloc/cudaFree") : d.top_api;
  // The call site: from the calls the probes sampled with their stacks, else from the CPU profiles'
  // stacks that pass through the API (a call that spins or blocks in it).
  SampledSite sampled = sampled_call_site(k.job, k.r, kind);
  std::string site = unwrapped_site(k.job, {&k.r}, !sampled.site.empty() ? sampled.site : memory_call_site(k.job, k.r, api), kind);
  h.culprit = (d.apis.empty() ? api : d.apis) + (site.empty() ? "" : " (called from " + site + ")");
  h.evidence = std::move(d.evidence);
  h.evidence.push_back(memory_share(k, std::min(excess, k.extra)));
  if (!sampled.site.empty()) {
    h.evidence.push_back(fmt("%.0f%%", 100 * sampled.calls / sampled.total) + " of " + k.who + "'s " +
                         (cause == Cause::kSyncMemcpy ? "synchronous copies" : "allocation and release calls") +
                         " sampled with their stacks are made from " + site + fmt(" (%.0f", sampled.calls) +
                         fmt(" of %.0f calls in the window)", sampled.total));
  } else if (!site.empty()) {
    h.evidence.push_back("its stacks inside " + api + " are called from " + site);
  }
  if (hot_in_calls)
    h.evidence.push_back("the differential on-CPU profile's top path, " + caller_name(split_path(k.hot->path).back()) + " (" +
                         ms(k.hot->culprit_ms) + " per step vs " +
                         ms(k.hot->peers_ms) + " on peers), is in these calls: its CPU time with its wait for a CPU, " + ms(hot_ms) +
                         " per step, is theirs, not a cause of its own");
  // As many calls in its own past: it always did this, and something else may be why it slowed.
  constexpr double kAlwaysDidThis = 0.7;
  if (d.has_past && !d.more_than_past) h.certainty = kAlwaysDidThis;
  return h;
}

std::optional<Hypothesis> memory_alloc_churn(const RankCase& k) {
  return memory_calls_hypothesis(k, Cause::kMemoryAllocChurn, k.alloc, Os::kAllocApi, Os::kAllocCalls, Os::kAllocCalls, is_alloc_api);
}

std::optional<Hypothesis> sync_memcpy(const RankCase& k) {
  return memory_calls_hypothesis(k, Cause::kSyncMemcpy, k.sync_copy, Os::kSyncCopyApi, Os::kSyncCopyCalls, Os::kSyncCopyMb, is_copy_api);
}

// The kernel-launch entry points of the CUDA runtime and driver, by a frame's name.
bool is_launch_api(std::string_view frame) {
  const std::string f = short_function(frame);
  for (std::string_view api : {"cudaLaunchKernel", "cudaLaunchKernel_ptsz", "cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz",
                               "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"}) {
    if (f == api) return true;
  }
  return false;
}

// The rank's device runs many more kernels per step than its peers' (the device timeline counts
// each): it launches more (an optimizer stepped tensor by tensor, a model run unfused or no longer
// captured in a CUDA graph), and says how many and how long they run.
struct MoreKernels {
  bool more = false;
  std::string evidence;
};
MoreKernels more_kernels(const RankCase& k) {
  MoreKernels m;
  const double mine = k.r.get(Os::kKernels);
  const double peers = peer_median(k.job, k.peers, [](const RankWindow& x) { return x.get(Os::kKernels); });
  if (!known(mine) || !known(peers)) return m;
  m.more = mine >= kMoreKernels * peers && mine - peers >= kMinExtraKernels;
  auto each = [](double dev, double n) { return known(dev) && n > 0 ? fmt(" (%.3f ms each on average)", dev / n) : std::string(); };
  m.evidence = k.who + fmt(" runs %.0f kernels per step", mine) + each(k.r.now.device_compute_ms, mine) + fmt(" vs %.0f", peers) +
               each(k.dev_peers, peers) + " on its peers (the device timeline's count)";
  return m;
}

// Launch-bound: the device waits for the host while the host launches kernels. Either the launch
// calls' own time (the agent's probes) holds the host's extra time, or the rank runs many more
// kernels than its peers and its extra CPU time is in code that launches them (the differential
// profile's top path runs launch calls; in an eager framework most of an operation's host time is
// its Python and dispatch around the launch, which is why the whole path counts). Named with the
// function that launches them.
std::optional<Hypothesis> launch_bound(const RankCase& k) {
  const bool by_calls = k.launch > 0 && k.launch >= kLaunchShareOfHost * k.host;
  const MoreKernels more = more_kernels(k);
  const double in_launches = hot_share_in(k, is_launch_api);
  const bool by_path = more.more && k.cpu > 0 && k.hot && !more_of_everything(k) && in_launches >= kLaunchInHotPathShare;
  if (!by_calls && !by_path) return std::nullopt;
  Hypothesis h;
  h.cause = Cause::kLaunchBound;
  const Hypothesis work = by_path ? cpu_hypothesis(k) : Hypothesis{};
  h.explained_ms = std::max(by_calls ? k.launch : 0.0, by_path ? work.explained_ms : 0.0);
  const std::string from = by_path ? k.hot->function : memory_call_site(k.job, k.r, "cudaLaunchKernel");
  h.culprit = "kernel launches" + (from.empty() ? "" : " from " + from);
  if (!more.evidence.empty()) h.evidence.push_back(more.evidence);
  if (known(k.r.get(Os::kLaunchApi)))
    h.evidence.push_back(k.who + " spends " + ms(k.r.get(Os::kLaunchApi)) + " per step in launch calls where the agent timed them (+" +
                         ms(k.launch) + " vs peers)");
  if (by_path) {
    h.evidence.push_back(fmt("%.0f%%", 100 * in_launches) + " of " + from + "'s on-CPU time is inside the launch calls; the rest is the work around each launch");
    for (const auto& e : work.evidence) h.evidence.push_back(e);
  }
  return h;
}

// A CPU-only job (no device timeline: DDP on gloo) whose on-CPU time grew outside the top path too:
// every step function does more of the same work, as with more data per step. A hotspot leaves the
// rest as it was. Not when the top path is one the peers (almost) never run (kRarePathShare): more
// data makes no new work, and the rest of the rank then grew beside the new work (on the CPUs
// they share, through their caches: seen as a pinned rank's step loop 32% longer beside its
// DataLoader worker's augmentation).
bool more_of_everything(const RankCase& k) {
  return !known(k.r.now.device_compute_ms) && k.hot && k.rest_peers > 0 &&
         k.rest_mine / k.rest_peers - 1 >= kImbalanceRestGrowth && k.hot->peers_ms > kRarePathShare * k.hot->culprit_ms;
}

Hypothesis cpu_hypothesis(const RankCase& k) {
  const RankWindow& r = k.r;
  Hypothesis h;
  h.culprit = k.hot ? k.hot->function : "CPU work";
  // A path the peers do not run is a hotspot; more of the usual work explains less.
  bool fresh = k.hot && k.hot->peers_ms < kFreshPathShare * k.hot->culprit_ms;
  constexpr double kUsualWork = 0.59;  // 0.5 of 0.85: more of the usual work is a weak sign
  // The work's share of the extra CPU time explains the same share of the wait for a CPU: the
  // wait its CPU demand predicts, and the wait beyond it that no neighbour accounts for (a function
  // that is a quarter of the extra work is a quarter of why it queues).
  double work_share = fresh ? (k.cpu > 0 ? std::min(1.0, k.hot->excess_ms / k.cpu) : 0) : kUsualWorkShare;
  h.explained_ms = work_share * (k.cpu + k.own_queue_ms + k.queued_ms);
  h.certainty = fresh ? 1 : kUsualWork;
  h.evidence.push_back(k.who + " runs on the CPU " + ms(r.get(Os::kCpu)) + " per step vs " + ms(k.cpu_peers) + " on its peers");
  if (k.own_queue_ms > 0)
    h.evidence.push_back("and waits " + ms(k.own_queue_ms) + " more per step than its peers for a CPU, as much as its extra CPU time predicts at its peers' wait per CPU ms (a busy node: the work's own cost)");
  if (k.queued_ms > 0)
    h.evidence.push_back("and waits " + ms(k.queued_ms) + " more per step than its peers for a CPU to run that extra work on (a busy node; its cgroup was not throttled)");
  if (k.hot) {
    std::string where = k.hot->function + (k.hot->caller.empty() ? "" : " (called from " + k.hot->caller + ")");
    h.evidence.push_back("differential on-CPU profile: " + where + " " + ms(k.hot->culprit_ms) + " per step vs " +
                         ms(k.hot->peers_ms) + " on peers");
    if (k.hot->in_worker) h.evidence.push_back(worker_evidence(k));
    if (k.hot->broken_ms > 0)
      h.evidence.push_back(ms(k.hot->broken_ms) + " per step of " + k.who + "'s on-CPU samples have broken stacks (unresolved frames: " +
                           k.hot->broken_example + "); they name no function and are not compared");
  }
  return h;
}

// Interrupt work on the rank's CPUs beyond its peers': in the rank's time and in the kernel's
// softirq thread. Where the kernel charges interrupt time to the task it interrupts (without
// CONFIG_IRQ_TIME_ACCOUNTING, as on this project's VM), it is counted as the rank's own CPU time,
// spread over whatever code ran: every function of the rank looks slower, or bigger.
double interrupts_on_cpus(const RankCase& k) {
  return std::max(0.0, k.irq) + std::max(0.0, k.irq_threads_ms - (known(k.irq_threads_peers) ? k.irq_threads_peers : 0.0));
}

// An interrupt load that is at least this share of the rank's extra CPU time is why its work
// looks bigger or slower (the rule a neighbour sharing its CPU meets in slow_cpu, kSharedCpuShare):
// the profile's shape alone does not say larger batches then. Seen on a 3-rank DDP job pinned on
// two CPUs, NET_RX softirq steered to rank 0's CPU: every function of rank 0 grew, and it was named
// workload-imbalance ("larger batches (more work in rank_main)").
constexpr double kInterruptShareOfCpu = 0.25;

std::optional<Hypothesis> imbalance_on_cpu(const RankCase& k) {
  if (k.cpu <= 0 || !more_of_everything(k)) return std::nullopt;
  if (interrupts_on_cpus(k) >= kInterruptShareOfCpu * k.cpu) return std::nullopt;
  Hypothesis h = cpu_hypothesis(k);
  h.cause = Cause::kWorkloadImbalance;
  h.culprit = "larger batches (more work in " + k.hot->function + ")";
  constexpr double kShapeOnly = 0.7;  // the shape of the profile, not a measured input size
  h.certainty = kShapeOnly;
  h.evidence.push_back("not one function: " + k.who + "'s on-CPU time outside " + k.hot->function + " grew " +
                       fmt("%.0f%%", 100 * (k.rest_mine / k.rest_peers - 1)) + " too (" + ms(k.rest_mine) + " vs " +
                       ms(k.rest_peers) + " per step on peers), as with more data per step");
  return h;
}

// The top path of the differential profile is one the peers also run, at more than kFreshPathShare
// of the rank's time, and the rest of the rank's work did not grow with it (more_of_everything):
// the same code running longer on this rank. That is the same work slower (a slower or shared CPU:
// its caches, its hyperthread sibling, a hypervisor, the profiler's own run time on it) or more
// data in that one function; either way no function of the rank's own is the cause, and naming
// the path (seen: `backward`, 23.0 ms per step against 16.1 ms on the peer of a healthy pinned
// 2-rank DDP job while strata's start-up ran on its CPU) sends the reader to optimize code every
// rank runs alike.
bool usual_work_slower(const RankCase& k) {
  return k.cpu > 0 && k.hot && !(k.hot->peers_ms < kFreshPathShare * k.hot->culprit_ms) && !more_of_everything(k);
}

// What the CPU layer saw when only the usual work grew: said in the straggler's unexplained line.
std::string usual_work_note(const RankCase& k) {
  return k.who + " runs on the CPU " + ms(k.r.get(Os::kCpu)) + " per step vs " + ms(k.cpu_peers) + " on its peers, in work they run as well (" +
         k.hot->function + " " + ms(k.hot->culprit_ms) + " per step vs " + ms(k.hot->peers_ms) +
         "): the same work slower (a slower or shared CPU) or more data in it, not a function of its own";
}

// A slower CPU (slow-cpu): the rank's usual work runs slower (usual_work_slower), the rank ran on
// one CPU (at least kConfinedShare of its run time there), and a peer on its node ran the same work
// on another CPU, none on that one. The same code, the same data, another core: the core's speed
// (its clock held down, a busy SMT sibling, a hypervisor's steal) is what differs. Seen on this
// project's VM: its two vCPUs ran the same pure-Python loop 1.6-1.7x apart, and every healthy run
// with ranks pinned one to a CPU had the ranks of the slower one as unexplained stragglers. A peer
// on the same CPU (two ranks sharing it) says which: sharing a core costs each rank its turns (a
// wait for the CPU), not CPU time in the same work, so a peer there whose CPU time is as its peers'
// elsewhere says the core is not slower (contention's case), and one that runs as much longer says
// it is (kSameCpuAlike). A rank spread over CPUs, or no peer on its node on another CPU to hold
// against it, says nothing of one CPU.
constexpr double kConfinedShare = 0.9;  // nine tenths: a core's speed is then within a tenth the rank's speed
// A peer on the same CPU is as slow when its time in the work that grew (the rank's top path) exceeds
// its node's peers' elsewhere by at least half the rank's own extra there: the same work on the same
// core slows alike (a peer's own other work, a hotspot of its own, is not compared), and half leaves
// room for the ranks' uneven shares of the work (~10%, kImbalanceCpuGrowth) and sampling noise,
// while a core that is only shared adds (nearly) none.
constexpr double kSameCpuAlike = 0.5;
std::optional<std::string> confined_cpu(const RankWindow& r) {
  if (r.cpu_placement.empty() || r.cpu_placement.front().first == "other" || r.cpu_placement.front().second < kConfinedShare)
    return std::nullopt;
  return r.cpu_placement.front().first;
}

std::optional<Hypothesis> slow_cpu(const RankCase& k) {
  if (!usual_work_slower(k)) return std::nullopt;
  auto mine = confined_cpu(k.r);
  if (!mine) return std::nullopt;
  // Something else ran on its CPU beyond what ran on its peers' (another process, interrupts, or
  // strata's own start-up): the core was shared, its caches and its time, not slower. A quarter of
  // the extra CPU time is more than a share noise reaches (a kworker's few ms) and less than a
  // neighbour that slows the work by sharing the core takes.
  constexpr double kSharedCpuShare = 0.25;
  const double agent_extra = known(k.r.agent_ms)
                                 ? k.r.agent_ms - peer_median(k.job, k.peers, [](const RankWindow& q) { return known(q.agent_ms) ? q.agent_ms : 0.0; })
                                 : 0;
  // Interrupts that ran on its CPU shared it the same way (interrupts_on_cpus).
  if ((k.nb ? k.nb->excess_ms : 0) + agent_extra + interrupts_on_cpus(k) >= kSharedCpuShare * k.cpu) return std::nullopt;
  // The work that grew: the time under the differential profile's top path (the usual work), on
  // each rank. A peer's own other work (a hotspot of its own) says nothing of the core.
  auto work_ms = [&](const RankWindow& q) {
    double t = 0;
    for (const auto& v : q.oncpu) {
      bool broken = false, worker = false;
      const std::string path = comparable_path(k.job, k.job.names.name(v.name), &broken, &worker);
      if (under_path(path, k.hot->path)) t += v.ms_per_step;
    }
    return t;
  };
  std::vector<std::string> elsewhere;  // "rank 1 on CPU 0 (97%)"
  std::vector<double> work_elsewhere;  // their time in that work per step
  std::vector<const RankWindow*> beside;  // peers on the same CPU
  for (size_t p : k.peers) {
    const RankWindow& q = k.job.ranks[p];
    if (q.node != k.r.node || q.cpu_placement.empty()) continue;
    const auto& [cpu, share] = q.cpu_placement.front();
    if (cpu == *mine) {
      beside.push_back(&q);
      continue;
    }
    if (cpu == "other") continue;
    work_elsewhere.push_back(work_ms(q));
    if (elsewhere.size() < 3) elsewhere.push_back(rank_name(q) + " on CPU " + cpu + " (" + fmt("%.0f%%", 100 * share) + ")");
  }
  if (elsewhere.empty()) return std::nullopt;
  std::string list;
  for (const auto& e : elsewhere) list += (list.empty() ? "" : ", ") + e;
  const double ref = median(work_elsewhere);
  const double my_extra = known(ref) ? work_ms(k.r) - ref : kUnknown;
  std::string alike;  // "rank 1 (+7.50 ms)"
  for (const RankWindow* q : beside) {
    const double extra = known(ref) ? work_ms(*q) - ref : kUnknown;
    if (!known(extra) || !known(my_extra) || extra < kSameCpuAlike * my_extra) return std::nullopt;  // shared, not slower
    alike += (alike.empty() ? "" : ", ") + rank_name(*q) + " (+" + ms(extra) + ")";
  }
  Hypothesis h;
  h.cause = Cause::kSlowCpu;
  h.culprit = "CPU " + *mine + " of " + k.r.node;
  // The whole of its extra CPU time is the core's, and the wait for a CPU that this time predicts.
  h.explained_ms = k.cpu + k.own_queue_ms;
  h.evidence.push_back(k.who + " ran " + fmt("%.0f%%", 100 * k.r.cpu_placement.front().second) + " of its CPU time on CPU " + *mine +
                       "; its peers on " + k.r.node + " ran elsewhere: " + list);
  if (!alike.empty())
    h.evidence.push_back("the peers that ran on CPU " + *mine + " too run " + k.hot->function + " longer per step than those elsewhere: " +
                         alike + " (sharing a core costs turns, not CPU time: the core is slower)");
  h.evidence.push_back(usual_work_note(k));
  return h;
}

std::optional<Hypothesis> host_hotspot(const RankCase& k) {
  if (k.cpu <= 0 || more_of_everything(k) || usual_work_slower(k)) return std::nullopt;
  Hypothesis h = cpu_hypothesis(k);
  h.cause = Cause::kHostHotspot;
  return h;
}

struct CauseRule {
  Cause cause;
  std::optional<Hypothesis> (*evidence)(const RankCase&);
  bool host;          // a host cause: only when the host, not the device, holds the extra time
  double confidence;  // when the rule's evidence is direct (certainty 1)
  // What to do; "{rank}" and "{culprit}" are filled in.
  const char* advice;
};

// In the order the layers are descended (ties in explained time go to the earlier entry): the GPU
// first, then what kept it waiting on the host.
constexpr CauseRule kRules[] = {
    {Cause::kGpuSlow, gpu_slow, false, 0.9,
     "check {culprit}'s cooling, power and clocks (nvidia-smi -q -d PERFORMANCE, ECC, PCIe width); drain the node or replace the GPU"},
    {Cause::kWorkloadImbalance, imbalance_on_device, false, 0.75,
     "balance the work across ranks: check the sampler / sharding and batch sizes of {rank}"},
    {Cause::kCpuThrottling, cpu_throttling, true, 0.85, "raise or remove the CPU quota of {rank}'s container (cpu.max)"},
    {Cause::kCpuContention, cpu_contention, true, 0.8,
     "move `{culprit}` off the training CPUs (taskset / cpuset) or lower its priority"},
    {Cause::kMemoryReclaim, memory_reclaim, true, 0.8, "raise the memory limit of {rank}'s container or cut its page-cache use"},
    {Cause::kIoStall, io_stall, true, 0.8,
     "read the training data from faster storage, cache it locally, or prefetch with more loader workers"},
    {Cause::kIrqSoftirq, irq_softirq, true, 0.7, "move IRQ affinity (NIC queues) away from the training CPUs"},
    {Cause::kPageFaults, page_faults, true, 0.6, "keep the working set in memory (mlock, larger memory limit, no swap)"},
    {Cause::kLaunchBound, launch_bound, true, 0.8,
     "launch fewer, larger kernels on {rank}: fused or foreach optimizers (torch.optim foreach=True / fused=True), "
     "torch.compile, CUDA graphs"},
    {Cause::kMemoryAllocChurn, memory_alloc_churn, true, 0.8,
     "keep PyTorch's caching allocator on (unset PYTORCH_NO_CUDA_MEMORY_CACHING) and cut fragmentation "
     "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, fewer shape changes); allocate {rank}'s buffers once, outside the step"},
    {Cause::kSyncMemcpy, sync_memcpy, true, 0.8,
     "copy asynchronously from pinned memory (non_blocking=True, pin_memory) and read values back (.item(), .cpu()) "
     "once per step or less on {rank}"},
    {Cause::kWorkloadImbalance, imbalance_on_cpu, true, 0.85,
     "balance the work across ranks: check the sampler / sharding and batch sizes of {rank}"},
    {Cause::kSlowCpu, slow_cpu, true, 0.7,
     "check {culprit}: its clock (cpupower frequency-info, thermal throttling), what shares its core (SMT sibling), "
     "the hypervisor's steal; move {rank} to another CPU or drain the node"},
    {Cause::kHostHotspot, host_hotspot, true, 0.85,
     "optimize or move off the critical path: {culprit} (prefetch in a data-loader worker)"},
};

std::string fill_in(std::string text, const std::string& key, const std::string& value) {
  for (auto at = text.find(key); at != std::string::npos; at = text.find(key, at + value.size())) text.replace(at, key.size(), value);
  return text;
}

struct Ranked {
  Hypothesis h;
  const CauseRule* rule;
  double confidence() const { return clamp01(rule->confidence * h.certainty); }
  std::string advice(const std::string& who) const { return fill_in(fill_in(rule->advice, "{rank}", who), "{culprit}", h.culprit); }
};

// Measures rank c against its peers, layer by layer, for the rules.
void measure(RankCase& k) {
  const JobWindow& job = k.job;
  const RankWindow& r = k.r;
  const auto& peers = k.peers;
  k.dev = excess(job, k.c, peers, [](const RankWindow& x) { return x.now.device_compute_ms; });
  k.dev_peers = peer_median(job, peers, [](const RankWindow& x) { return x.now.device_compute_ms; });
  k.cpu = os_excess(job, k.c, peers, Os::kCpu);
  k.cpu_peers = peer_median(job, peers, [](const RankWindow& x) { return x.get(Os::kCpu); });
  k.cpu_growth = known(k.cpu_peers) && k.cpu_peers > 0 ? k.cpu / k.cpu_peers : 0;
  k.gpu_throttled = r.gpu.known && (!r.gpu.throttle_reasons.empty() ||
                                    (known(r.gpu.sm_clock_ratio) && r.gpu.sm_clock_ratio < kThrottledClockRatio));
  k.host = k.extra - std::max(0.0, k.dev);
  double idle = excess(job, k.c, peers, [](const RankWindow& x) { return x.now.gpu_idle_ms; });
  if (idle > 0) k.idle_ev = k.who + "'s GPU sits idle " + ms(r.now.gpu_idle_ms) + " per step waiting for the CPU (+" + ms(idle) + " vs peers)";

  k.runq = os_excess(job, k.c, peers, Os::kRunqWait);
  // On a busy machine a rank that computes more also waits more for a CPU: only the run-queue
  // wait beyond what its CPU demand predicts at its peers' wait-per-CPU-ms is contention.
  double runq_peers = peer_median(job, peers, [](const RankWindow& x) { return x.get(Os::kRunqWait); });
  if (known(r.get(Os::kRunqWait)) && known(r.get(Os::kCpu)) && known(runq_peers) && known(k.cpu_peers) && k.cpu_peers > 0) {
    double raw = k.runq;
    k.runq = std::min(k.runq, r.get(Os::kRunqWait) - runq_peers * r.get(Os::kCpu) / k.cpu_peers);
    // What was set apart is the wait its own extra CPU demand predicts: the cost of that work.
    if (k.cpu > 0 && raw > 0) k.own_queue_ms = raw - std::max(0.0, k.runq);
  }
  k.thr = os_excess(job, k.c, peers, Os::kThrottled);
  k.nb = top_neighbour(job, k.c, peers, k.job_wide);
  k.irq_threads_ms = interrupt_thread_ms(job, r);
  k.irq_threads_peers = k.job_wide ? 0 : peer_median(job, peers, [&](const RankWindow& x) { return interrupt_thread_ms(job, x); });
  if (k.runq > 0 && known(k.irq_threads_peers)) {
    k.irq_wait = std::clamp(k.irq_threads_ms - k.irq_threads_peers, 0.0, k.runq);
    k.runq -= k.irq_wait;
  }
  // Job-wide, peers are no reference: a neighbour on the rank's CPUs explains at most its own run
  // time (never the whole run-queue wait of a busy node).
  if (k.job_wide && k.nb) k.runq = std::max(k.runq, k.nb->excess_ms);
  // Its cgroup measured no throttling (the metric is there, near zero): a quota cannot be why it
  // waits. If it also wants more CPU than its peers, it queues for its own extra work on a busy
  // node: the host hotspot is the cause, and the wait is part of what it costs.
  k.unthrottled = known(r.get(Os::kThrottled)) && r.get(Os::kThrottled) < kUnthrottledMs;
  if (k.runq > 0 && k.unthrottled && k.cpu >= std::max(kMinOwnCpuMs, k.runq / kMaxLoadFactor) &&
      !(k.nb && k.nb->excess_ms >= kShareOfRunq * k.runq)) {
    k.queued_ms = k.runq;
  }
  k.rec = os_excess(job, k.c, peers, Os::kReclaim);
  k.io = os_excess(job, k.c, peers, Os::kBlockedIo);
  k.irq = os_excess(job, k.c, peers, Os::kIrq);
  k.pf = os_excess(job, k.c, peers, Os::kMajorFaults);
  // The blocked time in page faults (their paths, kPageFaultCall) beyond the peers': a wait for memory
  // the rank touched, which the kernel counts as I/O wait when it reads the page from disk.
  auto fault_blocked = [&](const RankWindow& x) {
    double t = 0;
    for (const auto& v : x.offcpu) {
      if (in_page_fault(job.names.name(v.name))) t += v.ms_per_step;
    }
    return t;
  };
  // Each major fault waits for one read from the device: without stacks of every short block (the
  // off-CPU layer sends blocks of min_block_us and longer), the faults times the block I/O latency.
  const double lat = fault_ms(r);
  k.fault_io = std::min(std::max(0.0, k.io),
                        std::max(fault_blocked(r) - peer_median(job, peers, fault_blocked), std::max(0.0, k.pf) * lat));
  // And the kernel's own work in them, on-CPU (the sampled stacks inside kPageFaultCall).
  auto fault_cpu = [&](const RankWindow& x) {
    double t = 0;
    for (const auto& v : x.syscall_callers) {
      if (job.names.name(v.name).rfind(std::string(kPageFaultCall) + "|", 0) == 0) t += v.ms_per_step;
    }
    return t;
  };
  k.fault_cpu = std::max(0.0, fault_cpu(r) - peer_median(job, peers, fault_cpu));
  k.launch = os_excess(job, k.c, peers, Os::kLaunchApi);
  k.alloc = os_excess(job, k.c, peers, Os::kAllocApi);
  k.sync_copy = os_excess(job, k.c, peers, Os::kSyncCopyApi);
  if (k.cpu > 0) {
    k.hot = differential_profile(job, k.c, peers, &RankWindow::oncpu);
    if (k.hot) {
      // "Outside" is outside the top function's whole subtree (its callees' paths are its work).
      auto outside = [&](const RankWindow& x) {
        double t = 0;
        for (const auto& v : x.oncpu) {
          bool in = false;
          for (auto f : split_path(job.names.name(v.name))) in = in || caller_name(f) == k.hot->function;
          if (!in) t += v.ms_per_step;
        }
        return t;
      };
      k.rest_mine = outside(r);
      k.rest_peers = peer_median(job, peers, outside);
    }
  }
}

// A host hotspot in the memory calls a memory rule found grown is their cost, which that rule
// counts (memory_calls_hypothesis), and one launch-bound names (its top path runs the launches):
// the hotspot's own hypothesis goes.
void fold_hotspot_into_calls(const RankCase& k, std::vector<Ranked>& hs);

// Descends the layers on rank c, whose busy time exceeds its peers' by `extra` ms per step: every
// rule of the table that finds its evidence, most explained first.
std::vector<Ranked> descend(const JobWindow& job, size_t c, double extra, bool job_wide, std::vector<std::string>* seen = nullptr) {
  RankCase k(job, c, extra, job_wide);
  measure(k);
  if (seen && usual_work_slower(k)) seen->push_back(usual_work_note(k));
  bool host_wait = k.host > 0 || job_wide;
  std::vector<Ranked> hs;
  for (const auto& rule : kRules) {
    if (rule.host && !host_wait) continue;
    auto h = rule.evidence(k);
    if (!h) continue;
    if (rule.host && !k.idle_ev.empty()) h->evidence.push_back(k.idle_ev);
    hs.push_back({std::move(*h), &rule});
  }
  fold_hotspot_into_calls(k, hs);
  // Nothing explains more than the time there is to explain.
  for (auto& x : hs) x.h.explained_ms = std::min(x.h.explained_ms, extra);
  std::stable_sort(hs.begin(), hs.end(), [](const Ranked& a, const Ranked& b) { return a.h.explained_ms > b.h.explained_ms; });
  return hs;
}

void fold_hotspot_into_calls(const RankCase& k, std::vector<Ranked>& hs) {
  auto hotspot = std::find_if(hs.begin(), hs.end(), [](const Ranked& x) { return x.rule->cause == Cause::kHostHotspot; });
  if (hotspot == hs.end()) return;
  for (const auto& x : hs) {
    bool (*kind)(std::string_view) = x.rule->cause == Cause::kSyncMemcpy        ? is_copy_api
                                     : x.rule->cause == Cause::kMemoryAllocChurn ? is_alloc_api
                                                                                  : nullptr;
    // Launch-bound names the same top path when it runs the launches: one cause, the launches'.
    const bool launches = x.rule->cause == Cause::kLaunchBound && k.hot && x.h.culprit == "kernel launches from " + k.hot->function;
    if (launches || (kind && hot_path_in_memory_calls(k, kind))) {
      hs.erase(hotspot);
      return;
    }
  }
}

// The agent's own run time on the rank's CPUs: its budgeted cost, said apart, never a neighbour.
void agent_cost_evidence(const RankWindow& r, std::vector<std::string>& evidence) {
  if (known(r.agent_ms) && r.agent_ms > 0)
    evidence.push_back("strata's own run time on " + rank_name(r) + "'s CPUs: " + ms(r.agent_ms) +
                       " per step (the profiler's cost, said apart: never counted as a cause)");
}

// A rank-scope straggler that no hypothesis explains is no finding: when `unexplained` is given,
// it gets the line that says where the time goes and that no layer says why.
std::optional<Finding> to_finding(const JobWindow& job, size_t c, double lost, std::vector<Ranked> hs, std::vector<std::string> head,
                                  double locate_conf, Scope scope, Diagnosis::Unexplained* unexplained = nullptr) {
  const RankWindow& r = job.ranks[c];
  Finding f;
  f.scope = scope;
  f.rank = scope == Scope::kJob ? -1 : r.rank;
  f.node = scope == Scope::kJob ? std::string() : r.node;
  f.lost_ms_per_step = lost;
  f.evidence = std::move(head);
  // A hypothesis that explains under kMinExplainedShare of what was lost is not its cause.
  std::string dropped;
  if (!hs.empty() && lost > 0 && hs.front().h.explained_ms < kMinExplainedShare * lost) {
    const auto& t = hs.front().h;
    dropped = std::string(cause_name(t.cause)) + " (" + t.culprit + ") explains only " + ms(t.explained_ms) + " of " + ms(lost) +
              fmt(" per step (%.0f%%)", 100 * t.explained_ms / lost);
    hs.clear();
  }
  if (hs.empty()) {
    // A slowdown no layer explains is no finding: a culprit is a resolved name that explains a
    // stated share of the loss. A job-wide one is said by the job line; a straggler by a line of
    // its own: where the time goes is known, why is not, and said so.
    if (scope == Scope::kRank && unexplained) {
      std::string line;
      for (const auto& e : f.evidence) line += (line.empty() ? "" : "; ") + e;
      // The entry's rank, node and loss are fields of their own, which every report says first.
      line += (line.empty() ? "" : "; ") + std::string("no layer's metrics explain the loss (were all layers recorded?)");
      if (!dropped.empty()) line += "; not a cause: " + dropped;
      std::vector<std::string> cost;
      agent_cost_evidence(r, cost);
      for (auto& e : cost) line += "; " + e;
      line += "; look at the differential flame graph of " + rank_name(r) + " (strata record --layers all records every layer)";
      *unexplained = {r.rank, r.node, lost, std::move(line)};
    }
    return std::nullopt;
  }
  Ranked& top = hs.front();
  f.cause = top.h.cause;
  f.layer = layer_of(f.cause);
  f.culprit = top.h.culprit;
  double share = lost > 0 ? clamp01(top.h.explained_ms / lost) : 0.5;
  f.confidence = clamp01(top.confidence() * (0.5 + 0.5 * share) * locate_conf);
  for (auto& e : top.h.evidence) f.evidence.push_back(std::move(e));
  f.advice = top.advice(rank_name(r));
  for (size_t i = 1; i < hs.size() && i < 3; ++i) {
    const auto& h = hs[i].h;
    if (h.explained_ms >= kAlsoShare * top.h.explained_ms && h.explained_ms > 0) {
      f.evidence.push_back(std::string("also: ") + cause_name(h.cause) + " (" + h.culprit + ") explains " + ms(h.explained_ms) + " per step");
    }
  }
  agent_cost_evidence(r, f.evidence);
  return f;
}

// ---------------------------------------------------------------------------------------------
// Job-wide: every rank slowed alike, so peers are no reference. Each layer of each rank is compared
// with that rank's own healthy past (RankPast); the median growth over ranks is the job's, and the
// layer whose growth explains the loss names the cause.

// One kernel is the regression when it holds this share of the device time the job gained ...
constexpr double kOneKernelShare = 0.6;
// ... grew by this factor over its own past ...
constexpr double kKernelGrowthFactor = 1.5;
// ... while the rest of the device work stayed within 10% of its past (kernel timing jitter): a
// slower GPU makes every kernel about equally slower; one kernel at 1.5x while the rest stay is a
// changed kernel (a library upgrade, new input shapes), not a changed device.
constexpr double kRestOfDeviceGrowth = 0.1;

// Job-wide network-slow needs hosts that did not slow: the ranks' busy time (step minus collective
// wait) grew by at most this share of its past: the run-to-run spread of a host's compute is a few
// % (as the rest of the device work in kRestOfDeviceGrowth); a VM whose speed drifts, or CPUs
// shared by more processes than they hold, grows it by more, and the collectives with it.
constexpr double kNetworkHostGrowth = 0.1;
// ... or by at most this share of the collectives' growth, where the ranks compute on the host. A
// host that slowed by X stretches the collectives by about X at most through their own CPU work (a
// reduction is one pass over the gradient, far less CPU than the forward and backward passes over
// the same parameters) and by X at most through the ranks' skew: a busy time that grew by under a
// quarter of the wait's growth leaves at least half of that growth to the wire. Where the ranks
// compute on a device the premise fails: the host's own work is only what the device leaves it
// (launches, the input pipeline), while a transport run by the host (sockets: gloo, NCCL over TCP)
// still does all its copying on the CPU. A healthy pp=2 tp=2 job of strata-sim (device compute
// 50-98 ms per step, TCP collectives, 4 ranks on 2 CPUs) slowed with the VM: its collectives grew
// 23-28 ms per step while its busy time grew 5-9 ms (19-37% of that growth), a host part that grew
// 12-17%. There the busy time is held to kNetworkHostGrowth of its host part (busy minus device time). A slower wire moves some time into the busy
// time too, where the collectives overlap the ranks' work (DDP all-reduces its buckets during the
// backward pass and waits for them at its end, outside the calls): a 2-rank DDP job on gloo with
// every link limited to 40 Mbit/s waited 79 ms more per step while its busy time grew 10 ms, 22%
// of its past (the 10% above), 13% of the wait's growth. The hosts that slowed in the example
// above grew their busy time by more than the wait (91 ms against 63 ms).
constexpr double kNetworkHostShareOfWait = 0.25;
// ... and their run-queue wait grew by under this share of the collectives' growth: with half of it
// spent waiting for a CPU, the collectives' own CPU work (and the skew of the ranks that feed them)
// is what the time went to, not the wire.
constexpr double kNetworkRunqShare = 0.5;
// ... and no rank's busy time grew by this share of the collectives' growth: a rank that works
// longer makes its peers wait as long in the collectives as it works more (a straggler), so their
// longer wait is its work, not the wire. The median rank's busy time (above) does not see one rank;
// a slower wire leaves every rank's busy time within the quarter above (kNetworkHostShareOfWait).
constexpr double kNetworkStragglerShare = 0.5;

struct JobCandidate {
  Cause cause;
  std::string culprit;
  double explained_ms = 0;
  double confidence = 0;
  std::vector<std::string> evidence;
  std::string advice;
};

// Median over ranks with a past of get(rank) - past(rank); kUnknown when none.
template <typename Now, typename Past>
double median_growth(const JobWindow& job, Now now, Past past) {
  std::vector<double> v;
  for (const auto& r : job.ranks) {
    if (r.past.windows == 0) continue;
    double a = now(r), b = past(r);
    v.push_back(known(a) && known(b) ? a - b : kUnknown);
  }
  return median(std::move(v));
}

// Per name (kernel, neighbour, function): the median growth over ranks; names absent count as 0.
std::vector<std::pair<std::string, double>> named_growth(const JobWindow& job, Values RankWindow::*now, Values RankPast::*past,
                                                         std::string (*key)(const JobWindow&, const std::string&)) {
  std::unordered_map<std::string, std::vector<double>> by;
  size_t with_past = 0;
  for (const auto& r : job.ranks) {
    if (r.past.windows == 0) continue;
    std::unordered_map<std::string, double> d;
    for (const auto& v : r.*now) d[key(job, job.names.name(v.name))] += v.ms_per_step;
    for (const auto& v : r.past.*past) d[key(job, job.names.name(v.name))] -= v.ms_per_step;
    for (const auto& [name, g] : d) by[name].resize(with_past, 0), by[name].push_back(g);
    ++with_past;
  }
  std::vector<std::pair<std::string, double>> out;
  for (auto& [name, v] : by) {
    v.resize(with_past, 0);
    out.push_back({name, median(std::move(v))});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::string same_name(const JobWindow&, const std::string& n) { return n; }

// The kernel's interrupt threads under one key (each rank's CPU has its own ksoftirqd/N).
constexpr std::string_view kInterruptThreads = "[interrupt threads]";
std::string interrupt_threads_as_one(const JobWindow&, const std::string& n) {
  return is_interrupt_thread(n) ? std::string(kInterruptThreads) : n;
}

// A slower machine (a CPU clocked down, a busier host, a VM's drift) makes the same code take longer
// everywhere: every function's on-CPU time grows by about one factor. A function the job's own code
// made costlier grows beyond it. So a function's growth over the job's past counts only beyond the
// factor by which the rest of the rank's code grew ("excess"): per rank, its time now minus its past
// time scaled by the rest's now/past (never below 1: the rest doing less does not shrink what this
// function does more); the median over ranks. Seen on a healthy 4-rank DDP job whose every function
// ran ~1.4x longer (the machine slowed): backward "took 200 ms more per step" and was blamed.
// Where the rest of the code held under this share of the rank's past on-CPU time, its samples are
// too few to measure the machine's speed by (a 10 s window at 99 Hz has ~100 of them per busy CPU
// then: +-10%), and the function's growth counts whole, as before.
constexpr double kMinRestShareToScale = 0.1;

std::vector<std::pair<std::string, double>> named_excess_growth(const JobWindow& job, Values RankWindow::*now, Values RankPast::*past,
                                                                std::string (*key)(const JobWindow&, const std::string&)) {
  std::unordered_map<std::string, std::vector<double>> by;
  size_t with_past = 0;
  for (const auto& r : job.ranks) {
    if (r.past.windows == 0) continue;
    std::unordered_map<std::string, std::pair<double, double>> d;  // name -> (now, past)
    double total_now = 0, total_past = 0;
    for (const auto& v : r.*now) d[key(job, job.names.name(v.name))].first += v.ms_per_step, total_now += v.ms_per_step;
    for (const auto& v : r.past.*past) d[key(job, job.names.name(v.name))].second += v.ms_per_step, total_past += v.ms_per_step;
    for (const auto& [name, np] : d) {
      const auto [mine_now, mine_past] = np;
      double rest_past = total_past - mine_past;
      double scale = 1;
      if (rest_past >= kMinRestShareToScale * total_past && rest_past > 0) scale = std::max(1.0, (total_now - mine_now) / rest_past);
      by[name].resize(with_past, 0);
      by[name].push_back(mine_now - mine_past * scale);
    }
    ++with_past;
  }
  std::vector<std::pair<std::string, double>> out;
  for (auto& [name, v] : by) {
    v.resize(with_past, 0);
    out.push_back({name, median(std::move(v))});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}
// A function's name in a per-function comparison (see function_key).
std::string function_name(const JobWindow& job, const std::string& path) { return function_key(job, path); }
// Off-CPU, the function that made the blocking call (not the system call or libc's wrapper).
std::string blocking_function(const JobWindow& job, const std::string& path) {
  auto frames = split_path(path);
  for (size_t i = frames.size(); i-- > 0;) {
    std::string_view f = frames[i];
    bool syscall = f.size() > 2 && f.substr(f.size() - 2) == "()";
    if (syscall || f.rfind("__", 0) == 0 || unresolved_frame(f) || f == kWorkerFrame) continue;
    return job.python_functions.count(std::string(f)) ? std::string(f) : short_function(f);
  }
  return function_key(job, path);
}

std::vector<JobCandidate> job_layers(const JobWindow& job, double lost) {
  std::vector<JobCandidate> out;
  auto os_growth = [&](Os m) { return median_growth(job, [m](const RankWindow& r) { return r.get(m); }, [m](const RankWindow& r) { return r.past.get(m); }); };
  const std::string every = "every rank";

  // -- GPU: more device time on every rank; one kernel, or all of them.
  double dev = median_growth(job, [](const RankWindow& r) { return r.now.device_compute_ms; },
                             [](const RankWindow& r) { return r.past.device_compute_ms; });
  if (known(dev) && dev > 0) {
    auto ks = named_growth(job, &RankWindow::kernels, &RankPast::kernels, same_name);
    JobCandidate c;
    c.explained_ms = dev;
    c.evidence.push_back("every rank's GPU computes " + ms(dev) + " more per step than in the job's healthy past");
    double top_past = 0;
    double dev_past = median(column(job, [](const RankWindow& r) { return r.past.windows > 0 ? r.past.device_compute_ms : kUnknown; }));
    if (!ks.empty()) {
      std::vector<double> pv;
      for (const auto& r : job.ranks) {
        if (r.past.windows == 0) continue;
        double v = 0;
        for (const auto& e : r.past.kernels) v += job.names.name(e.name) == ks[0].first ? e.ms_per_step : 0;
        pv.push_back(v);
      }
      top_past = median(std::move(pv));
    }
    bool one = !ks.empty() && ks[0].second >= kOneKernelShare * dev && known(top_past) && top_past > 0 &&
               (top_past + ks[0].second) / top_past >= kKernelGrowthFactor && known(dev_past) && dev_past > top_past &&
               (dev - ks[0].second) / (dev_past - top_past) < kRestOfDeviceGrowth;
    if (one) {
      c.cause = Cause::kKernelRegression;
      c.culprit = "kernel " + short_function(ks[0].first);
      c.confidence = 0.8;
      c.evidence.push_back("kernel " + short_function(ks[0].first) + " takes " + ms(top_past + ks[0].second) + " per step vs " + ms(top_past) +
                           fmt(" before (x%.2f) on the median rank: ", (top_past + ks[0].second) / top_past) +
                           fmt("%.0f%% of the device time gained", 100 * ks[0].second / dev));
      if (ks.size() > 1) c.evidence.push_back("the next kernel, " + short_function(ks[1].first) + ", grew " + ms(ks[1].second) + " per step");
      c.advice = "compare " + short_function(ks[0].first) + " before and after the change (driver, CUDA/cuDNN/NCCL version, input shapes)";
    } else {
      c.cause = Cause::kGpuSlow;
      c.culprit = "the GPUs of " + every;
      size_t throttled = 0;
      for (const auto& r : job.ranks) throttled += r.gpu.known && !r.gpu.throttle_reasons.empty() ? 1 : 0;
      c.confidence = throttled > 0 ? 0.8 : 0.6;
      if (throttled > 0) c.evidence.push_back("NVML: " + std::to_string(throttled) + " of " + std::to_string(job.ranks.size()) + " GPUs report throttling");
      c.evidence.push_back("every kernel grew alike: the devices are slower, not one kernel");
      c.advice = "check the nodes' GPU clocks, power caps and cooling (nvidia-smi -q -d PERFORMANCE)";
    }
    out.push_back(std::move(c));
  }

  // -- communication: longer collectives on every rank while every rank's own work stayed as it was.
  // A slower network stretches the collectives and nothing else. Longer collectives alone do not
  // point at it: a collective run by the host (gloo reduces and copies on the CPU, and TCP runs on
  // the ranks' CPUs) stretches with a slower or oversubscribed host, and every collective also
  // absorbs the ranks' skew, which grows when every host is slower by a different amount (a
  // healthy pinned 4-rank DDP run, 8 processes on 2 CPUs: 62.7 ms more wait per step while the
  // ranks' own work grew by more). So the wait's growth names the network only when the ranks'
  // busy time (step minus wait) did not grow (kNetworkHostGrowth), or grew by a small share of the
  // wait's growth (kNetworkHostShareOfWait), and they did not wait longer for a CPU.
  double wait = median_growth(job, [](const RankWindow& r) { return r.now.wait_ms; }, [](const RankWindow& r) { return r.past.wait_ms; });
  // Each rank's busy time growth over its past: the median rank's is the hosts', the largest a straggler's.
  const auto busy_up = column(job, [](const RankWindow& r) {
    return r.past.windows > 0 ? r.now.busy_ms() - (r.past.step_ms - r.past.wait_ms) : kUnknown;
  });
  double host = median(busy_up);
  // The host's part of the busy time: what a slower host can stretch (busy minus the device's time,
  // where the ranks compute on a device).
  double device_past = median(column(job, [](const RankWindow& r) { return r.past.windows > 0 ? r.past.device_compute_ms : kUnknown; }));
  const bool on_device = known(device_past) && device_past > 0;
  double host_past = median(column(job, [on_device](const RankWindow& r) {
    if (r.past.windows == 0) return kUnknown;
    double busy = r.past.step_ms - r.past.wait_ms;
    return on_device && known(r.past.device_compute_ms) ? std::max(0.0, busy - r.past.device_compute_ms) : busy;
  }));
  double host_bound = on_device ? kNetworkHostGrowth * host_past : std::max(kNetworkHostGrowth * host_past, kNetworkHostShareOfWait * wait);
  double most_busy_up = kUnknown;  // the rank whose busy time grew most
  for (double up : busy_up) {
    if (known(up) && !(known(most_busy_up) && most_busy_up >= up)) most_busy_up = up;
  }
  double runq_up = os_growth(Os::kRunqWait);
  bool hosts_steady = known(host) && known(host_past) && known(wait) && host <= host_bound &&
                      !(known(most_busy_up) && most_busy_up >= kNetworkStragglerShare * wait) &&
                      !(known(runq_up) && runq_up >= kNetworkRunqShare * wait);
  if (known(wait) && wait > 0 && hosts_steady) {
    JobCandidate c;
    c.cause = Cause::kNetworkSlow;
    c.culprit = job.communicator.empty() ? "the job's collectives" : "communicator " + job.communicator;
    c.explained_ms = wait;
    c.confidence = 0.6;
    c.evidence.push_back("every rank waits " + ms(wait) + " more per step in collectives than in the job's healthy past, and none computes longer");
    c.advice = "check the fabric the communicator runs over (switch ports, link speeds, NCCL_IB/SOCKET settings)";
    out.push_back(std::move(c));
  }

  // -- OS: blocked I/O (shared storage), CPU wait, throttling, reclaim, interrupts.
  double io = os_growth(Os::kBlockedIo);
  if (known(io) && io > 0) {
    JobCandidate c;
    c.cause = Cause::kIoStall;
    auto ps = named_growth(job, &RankWindow::offcpu, &RankPast::offcpu, same_name);
    c.culprit = "block I/O on every rank";
    c.explained_ms = io;
    c.confidence = 0.7;
    c.evidence.push_back("every rank is blocked on I/O " + ms(io) + " more per step than in the job's healthy past: shared storage or the file system they read");
    if (!ps.empty() && ps[0].second > 0) {
      const std::string fn = blocking_function(job, ps[0].first);
      c.culprit = fn + " (block I/O on every rank)";
      c.evidence.push_back("blocked time grows under " + fn + ": +" + ms(ps[0].second) + " per step on the median rank");
      // The function that makes the blocking call, from the same call seen on-CPU (a blocked
      // read's stack often has no user frames), on the rank that blocks most.
      size_t most = 0;
      for (size_t i = 1; i < job.ranks.size(); ++i) {
        if (job.ranks[i].get(Os::kBlockedIo) > job.ranks[most].get(Os::kBlockedIo)) most = i;
      }
      if (auto site = call_site(job, most, syscall_in(ps[0].first))) {
        c.culprit = site->name() + " (block I/O on every rank)";
        c.evidence.push_back(rank_name(job.ranks[most]) + " blocks in " + site->syscall + " called from " + site->caller +
                             " (its on-CPU stacks in that call name the caller)");
      }
    }
    c.advice = "check the shared file system / block device the ranks read (latency, quota, other tenants); cache the data locally";
    out.push_back(std::move(c));
  }
  double runq = os_growth(Os::kRunqWait);
  auto nbs = named_growth(job, &RankWindow::neighbours, &RankPast::neighbours, interrupt_threads_as_one);
  std::erase_if(nbs, [](const auto& x) { return is_agent(x.first); });  // its cost is said apart
  // The kernel's interrupt threads' growth is interrupt work (irq-softirq below), no neighbour.
  double irq_threads = 0;
  for (const auto& [name, g] : nbs) {
    if (name == kInterruptThreads) irq_threads = std::max(0.0, g);
  }
  std::erase_if(nbs, [](const auto& x) { return x.first == kInterruptThreads; });
  if (known(runq) && runq > 0 && !nbs.empty() && nbs[0].second > 0) {
    // Named for what the process explains: its own extra run time on the ranks' CPUs.
    JobCandidate c;
    c.cause = Cause::kCpuContention;
    c.culprit = nbs[0].first;
    c.explained_ms = std::min(runq, nbs[0].second);
    c.confidence = 0.7;
    c.evidence.push_back("every rank waits " + ms(runq) + " more per step for a CPU than in the job's healthy past");
    c.evidence.push_back("process `" + nbs[0].first + "` runs " + ms(nbs[0].second) + " more per step on the ranks' CPUs than before");
    c.advice = "move `" + nbs[0].first + "` off the training CPUs (taskset / cpuset) or lower its priority";
    out.push_back(std::move(c));
  }
  double thr = os_growth(Os::kThrottled);
  if (known(thr) && thr > 0) {
    JobCandidate c;
    c.cause = Cause::kCpuThrottling;
    c.culprit = "cgroup cpu quota";
    c.explained_ms = thr;
    c.confidence = 0.8;
    c.evidence.push_back("every rank is throttled by its cgroup " + ms(thr) + " more per step than in the job's healthy past");
    c.advice = "raise or remove the CPU quota of the job's containers (cpu.max)";
    out.push_back(std::move(c));
  }
  double rec = os_growth(Os::kReclaim);
  if (known(rec) && rec > 0) {
    JobCandidate c;
    c.cause = Cause::kMemoryReclaim;
    c.culprit = "memory limit";
    c.explained_ms = rec;
    c.confidence = 0.7;
    c.evidence.push_back("every rank stalls in direct reclaim " + ms(rec) + " more per step than in the job's healthy past");
    c.advice = "raise the memory limit of the job's containers or cut its page-cache use";
    out.push_back(std::move(c));
  }
  double irq = os_growth(Os::kIrq);
  const double irq_wait = known(runq) && runq > 0 ? std::min(runq, irq_threads) : 0;
  if ((known(irq) && irq > 0) || irq_wait > 0) {
    JobCandidate c;
    c.cause = Cause::kIrqSoftirq;
    c.culprit = "interrupts on the ranks' CPUs";
    c.explained_ms = std::max(0.0, known(irq) ? irq : 0) + irq_wait;
    c.confidence = 0.6;
    if (known(irq) && irq > 0)
      c.evidence.push_back("every rank's CPUs spend " + ms(irq) + " more per step in IRQ/softirq than in the job's healthy past");
    if (irq_wait > 0)
      c.evidence.push_back("the kernel's interrupt threads (ksoftirqd) run " + ms(irq_threads) +
                           " more per step on the ranks' CPUs than before: softirq work deferred to them");
    c.advice = "move IRQ affinity (NIC queues) away from the training CPUs";
    out.push_back(std::move(c));
  }
  // -- memory calls: every rank's host thread waits in more device-memory calls than in its own
  // past (the caching allocator turned off for the whole job, a synchronous copy added to the loop).
  struct MemoryKind {
    Cause cause;
    Os time, calls;
    const char* what;
    const char* advice;
  };
  for (const MemoryKind& m : {MemoryKind{Cause::kMemoryAllocChurn, Os::kAllocApi, Os::kAllocCalls, "device-memory allocation and release",
                                         "keep PyTorch's caching allocator on (unset PYTORCH_NO_CUDA_MEMORY_CACHING) and allocate buffers once, outside the step"},
                              MemoryKind{Cause::kSyncMemcpy, Os::kSyncCopyApi, Os::kSyncCopyCalls, "synchronous copies",
                                         "copy asynchronously from pinned memory (non_blocking=True) and read values back once per step or less"}}) {
    double grew = os_growth(m.time);
    double calls_now = median(column(job, [&](const RankWindow& r) { return r.past.windows > 0 ? r.get(m.calls) : kUnknown; }));
    double calls_past = median(column(job, [&](const RankWindow& r) { return r.past.windows > 0 ? r.past.get(m.calls) : kUnknown; }));
    if (!(known(grew) && grew > 0 && known(calls_now) && known(calls_past) && calls_now >= kMoreMemoryCalls * calls_past &&
          calls_now - calls_past >= kMinExtraMemoryCalls))
      continue;
    // The API with the most time per step on the median rank now.
    std::map<std::string, std::vector<double>> by_api;
    for (const auto& r : job.ranks) {
      for (const auto& v : r.memory_api_ms) {
        const std::string& api = job.names.name(v.name);
        if ((m.cause == Cause::kSyncMemcpy) == (api == "cudaMemcpy")) by_api[api].push_back(v.ms_per_step);
      }
    }
    std::string top;
    double top_ms = 0;
    for (auto& [api, v] : by_api) {
      double t = median(std::move(v));
      if (t > top_ms) top = api, top_ms = t;
    }
    // Where the program makes them, from every rank's calls sampled with their stacks.
    SampledSites sites;
    for (const auto& r : job.ranks) sites.add(job, r, m.cause == Cause::kSyncMemcpy ? is_copy_api : is_alloc_api);
    const SampledSite site = sites.top();
    std::vector<const RankWindow*> every;
    for (const auto& r : job.ranks) every.push_back(&r);
    const std::string where = unwrapped_site(job, every, site.site, m.cause == Cause::kSyncMemcpy ? is_copy_api : is_alloc_api);
    JobCandidate c;
    c.cause = m.cause;
    c.culprit = (top.empty() ? std::string(m.what) : top) + " on every rank" + (where.empty() ? "" : " (called from " + where + ")");
    c.explained_ms = grew;
    c.confidence = 0.7;
    c.evidence.push_back("every rank's host thread spends " + ms(grew) + " more per step in " + m.what + " than in the job's healthy past");
    c.evidence.push_back(fmt("the median rank makes %.1f", calls_now) + fmt(" of these calls per step vs %.1f before", calls_past) +
                         (top.empty() ? "" : "; most of the time in " + top + " (" + ms(top_ms) + " per step)"));
    if (!site.site.empty())
      c.evidence.push_back(fmt("%.0f%%", 100 * site.calls / site.total) + " of the " + m.what + " sampled with their stacks on every rank are made from " +
                           where + fmt(" (%.0f", site.calls) + fmt(" of %.0f calls in the window)", site.total));
    c.advice = m.advice;
    out.push_back(std::move(c));
  }
  // -- CPU: one function costs more on every rank (a regression in the host code or its input),
  // beyond what the rest of the code's own growth says the machine slowed (named_excess_growth).
  double cpu = os_growth(Os::kCpu);
  if (known(cpu) && cpu > 0) {
    auto fs = named_excess_growth(job, &RankWindow::oncpu, &RankPast::oncpu, function_name);
    if (!fs.empty() && fs[0].second > 0) {
      double grew = 0;
      for (const auto& [name, g] : named_growth(job, &RankWindow::oncpu, &RankPast::oncpu, function_name))
        if (name == fs[0].first) grew = g;
      JobCandidate c;
      c.cause = Cause::kHostHotspot;
      c.culprit = fs[0].first;
      c.explained_ms = std::min(cpu, fs[0].second);
      c.confidence = 0.7;
      c.evidence.push_back("every rank runs on the CPU " + ms(cpu) + " more per step than in the job's healthy past");
      c.evidence.push_back(fs[0].first + " takes " + ms(grew) + " more per step on the median rank, " + ms(fs[0].second) +
                           " beyond the rest of its code's own growth (a slower machine slows every function alike)");
      c.advice = "optimize or move off the critical path: " + fs[0].first + " (prefetch in a data-loader worker)";
      out.push_back(std::move(c));
    }
  }
  for (auto& c : out) c.explained_ms = std::min(c.explained_ms, lost);
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.explained_ms > b.explained_ms; });
  return out;
}

// The job line for a slowdown on every rank that no layer explains (no finding).
std::string unexplained(const Diagnosis& dx) {
  return "the job slowed on every rank alike (step " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms) +
         ") and no layer of its own past explains it";
}

bool has_past(const JobWindow& job) {
  for (const auto& r : job.ranks) {
    if (r.past.windows > 0) return true;
  }
  return false;
}

// The job-scope finding for a slowdown on every rank, from the job's own past; none when no layer
// explains kMinExplainedShare of the loss.
// With `straggling`, some rank computes longer than its peers (an unexplained straggler): every
// rank's longer wait in the collectives is then its peers waiting for it, no evidence of the wire,
// and the comm layer's candidate is left out. *explained: what the finding's layer explains.
std::optional<Finding> job_past_finding(const JobWindow& job, double lost, double baseline_ms, std::vector<std::string> head,
                                        bool straggling = false, double* explained = nullptr) {
  if (!(lost >= std::min(kJobWideSlowdown, kJobWideDeviceSlowdown) * baseline_ms)) return std::nullopt;
  auto cs = job_layers(job, lost);
  if (straggling) std::erase_if(cs, [](const JobCandidate& c) { return c.cause == Cause::kNetworkSlow; });
  if (cs.empty() || cs.front().explained_ms < kMinExplainedShare * lost) return std::nullopt;
  JobCandidate& top = cs.front();
  const bool device = top.cause == Cause::kKernelRegression || top.cause == Cause::kGpuSlow;
  if (!(lost >= (device ? kJobWideDeviceSlowdown : kJobWideSlowdown) * baseline_ms)) return std::nullopt;
  Finding f;
  f.scope = Scope::kJob;
  f.rank = -1;
  f.cause = top.cause;
  f.layer = layer_of(top.cause);
  f.culprit = top.culprit;
  f.lost_ms_per_step = lost;
  f.confidence = clamp01(top.confidence * (0.5 + 0.5 * clamp01(top.explained_ms / lost)));
  f.evidence = std::move(head);
  for (auto& e : top.evidence) f.evidence.push_back(std::move(e));
  for (size_t i = 1; i < cs.size() && i < 3; ++i) {
    if (cs[i].explained_ms >= kAlsoShare * top.explained_ms && cs[i].explained_ms > 0)
      f.evidence.push_back(std::string("also: ") + cause_name(cs[i].cause) + " (" + cs[i].culprit + ") explains " + ms(cs[i].explained_ms) + " per step");
  }
  f.advice = top.advice;
  if (explained) *explained = top.explained_ms;
  return f;
}

// ---------------------------------------------------------------------------------------------
// Hardware: what NVML's counters say of a rank's GPU, its memory and its links. A fault here is a
// finding whether or not the job is slower yet (an uncorrectable error or a lost GPU ends the job;
// a degraded link slows every transfer through it); when the rank is also the straggler, the fault
// is why.

// Any uncorrectable ECC error is a fault: a healthy GPU has none, and each one corrupts data or
// kills the process that touched it (Xid 48).
constexpr double kMinUncorrectableEcc = 1;
// Any page retired (or row remapped) in the window: the memory is failing under the job.
constexpr double kMinRetiredPages = 1;
// PCIe replays per minute from which a link is degraded: a healthy link replays a handful of times
// over days; ten a minute is a link resending a steady share of its packets.
constexpr double kPcieReplaysPerMin = 10;
// NVLink replay + recovery + CRC errors per minute from which a link is degraded, for the same
// reason: a healthy NVLink counts a few over days.
constexpr double kNvlinkErrorsPerMin = 10;

std::string count(double v) { return fmt("%.0f", v); }

double window_min(const JobWindow& job) {
  return job.end_ns > job.start_ns ? static_cast<double>(job.end_ns - job.start_ns) / 60e9 : 0;
}

std::string nvml_of(const RankWindow& r) { return "NVML: " + rank_name(r) + "'s " + gpu_name(r); }

struct HwCase {
  const JobWindow& job;
  const RankWindow& r;
  double peer_pcie_gen;  // the median PCIe generation of every other rank's GPU (kUnknown: none known)
};

// Xids (NVIDIA's driver error codes, agent/gpu/nvml_source.h's gpu.xid) that are each cause's own
// report. 79: the GPU fell off the bus.
constexpr unsigned kXidFellOffBus = 79;
// The memory's: 48 a double-bit (uncorrectable) ECC error; 63 and 64 a page retired or a row
// remapped (64: that failed); 94 and 95 a contained and an uncontained ECC error (A100 and later).
constexpr unsigned kMemoryXids[] = {48, 63, 64, 94, 95};
// 74: an NVLink error (a link's replays, recoveries or CRC errors, or the link down).
constexpr unsigned kXidNvlink = 74;

std::string xid_evidence(const RankWindow& r, unsigned xid, const char* what) {
  return "the driver reported Xid " + std::to_string(xid) + " (" + what + ") on " + rank_name(r) + "'s " + gpu_name(r) +
         " in the window (gpu.xid)";
}

std::optional<Hypothesis> gpu_lost(const HwCase& k) {
  const bool xid = k.r.gpu.has_xid(kXidFellOffBus);
  if (!k.r.gpu.lost && !xid) return std::nullopt;
  Hypothesis h;
  h.cause = Cause::kGpuLost;
  h.culprit = gpu_name(k.r);
  if (xid) h.evidence.push_back(xid_evidence(k.r, kXidFellOffBus, "the GPU has fallen off the bus"));
  if (k.r.gpu.lost)
    h.evidence.push_back(nvml_of(k.r) + " is lost (gpu.lost: NVML answers GPU_IS_LOST): it fell off the bus" +
                         (xid ? "" : " (Xid 79 in the kernel log)"));
  return h;
}

std::optional<Hypothesis> gpu_memory_errors(const HwCase& k) {
  const GpuState& g = k.r.gpu;
  bool ecc = known(g.ecc_uncorrected) && g.ecc_uncorrected >= kMinUncorrectableEcc;
  bool retired = known(g.retired_pages) && g.retired_pages >= kMinRetiredPages;
  std::vector<unsigned> xids;
  for (unsigned x : kMemoryXids) {
    if (g.has_xid(x)) xids.push_back(x);
  }
  if (!ecc && !retired && xids.empty()) return std::nullopt;
  Hypothesis h;
  h.cause = Cause::kGpuMemoryErrors;
  h.culprit = gpu_name(k.r) + " memory";
  for (unsigned x : xids)
    h.evidence.push_back(xid_evidence(k.r, x, x == 48 ? "a double-bit ECC error" : x == 63 || x == 64 ? "a page retired or row remapped"
                                                                                                 : "an ECC error"));
  if (ecc) h.evidence.push_back(nvml_of(k.r) + " counted " + count(g.ecc_uncorrected) + " uncorrectable ECC errors in the window (gpu.ecc_uncorrected)");
  if (retired) h.evidence.push_back(nvml_of(k.r) + " retired " + count(g.retired_pages) + " memory pages in the window (gpu.retired_pages)");
  if (known(g.ecc_corrected) && g.ecc_corrected > 0)
    h.evidence.push_back("and " + count(g.ecc_corrected) + " corrected ECC errors (gpu.ecc_corrected)");
  return h;
}

std::optional<Hypothesis> nvlink_degraded(const HwCase& k) {
  const GpuState& g = k.r.gpu;
  double mins = window_min(k.job);
  const bool xid = g.has_xid(kXidNvlink);
  const bool counted = known(g.nvlink_errors) && mins > 0 && g.nvlink_errors / mins >= kNvlinkErrorsPerMin;
  if (!counted && !xid) return std::nullopt;
  Hypothesis h;
  h.cause = Cause::kNvlinkDegraded;
  h.culprit = "NVLink of " + gpu_name(k.r);
  if (xid) h.evidence.push_back(xid_evidence(k.r, kXidNvlink, "an NVLink error"));
  if (counted) h.evidence.push_back(nvml_of(k.r) + " counted " + count(g.nvlink_errors) + " NVLink errors in the window (gpu.nvlink_errors, " +
                       fmt("%.0f a minute; ", g.nvlink_errors / mins) + fmt("degraded from %.0f)", kNvlinkErrorsPerMin));
  return h;
}

std::optional<Hypothesis> pcie_degraded(const HwCase& k) {
  const GpuState& g = k.r.gpu;
  double mins = window_min(k.job);
  std::vector<std::string> ev;
  if (known(g.pcie_width) && known(g.pcie_max_width) && g.pcie_width < g.pcie_max_width)
    ev.push_back(nvml_of(k.r) + "'s PCIe link runs at x" + count(g.pcie_width) + " of its x" + count(g.pcie_max_width) +
                 " (gpu.pcie_link_width < gpu.pcie_link_max_width)");
  // NVML's current generation drops on an idle link to save power, so a rank's generation is
  // compared with its peers' (the same boards under the same job), not with the board's maximum.
  const double peer_gen = k.peer_pcie_gen;
  if (known(g.pcie_gen) && known(peer_gen) && g.pcie_gen < peer_gen)
    ev.push_back(nvml_of(k.r) + "'s PCIe link runs at generation " + count(g.pcie_gen) + " while its peers' run at " +
                 count(peer_gen) + " (gpu.pcie_link_gen)");
  if (known(g.pcie_replays) && mins > 0 && g.pcie_replays / mins >= kPcieReplaysPerMin)
    ev.push_back(nvml_of(k.r) + " replayed " + count(g.pcie_replays) + " PCIe packets in the window (gpu.pcie_replays, " +
                 fmt("%.0f a minute; ", g.pcie_replays / mins) + fmt("degraded from %.0f)", kPcieReplaysPerMin));
  if (ev.empty()) return std::nullopt;
  Hypothesis h;
  h.cause = Cause::kPcieDegraded;
  h.culprit = "PCIe link of " + gpu_name(k.r);
  h.evidence = std::move(ev);
  return h;
}

struct HardwareRule {
  Cause cause;
  std::optional<Hypothesis> (*evidence)(const HwCase&);
  double confidence;  // NVML's counters are direct evidence of the fault itself
  const char* advice;
};

// Most severe first: a rank's finding is the first rule that fires; the others are said as "also".
constexpr HardwareRule kHardwareRules[] = {
    {Cause::kGpuLost, gpu_lost, 0.95,
     "drain the node: {culprit} fell off the bus (dmesg: Xid 79); reset or reseat it, check its power and PCIe slot"},
    {Cause::kGpuMemoryErrors, gpu_memory_errors, 0.9,
     "drain the node and have {culprit} checked (nvidia-smi -q -d ECC,PAGE_RETIREMENT); restart the job from a checkpoint"},
    {Cause::kNvlinkDegraded, nvlink_degraded, 0.8,
     "check {culprit} (nvidia-smi nvlink -e); reseat the bridge or drain the node"},
    {Cause::kPcieDegraded, pcie_degraded, 0.8,
     "check {culprit} (nvidia-smi -q -d PCIE, lspci -vv: LnkSta vs LnkCap); reseat the GPU or move it to another slot"},
};

// The hardware finding of rank c, if its GPU reports a fault: no lost time yet (the caller sets it
// when the rank is also slow or hung). `pcie_gens`: every rank's known PCIe generation, sorted (a
// GPU's link is compared with every other GPU's, whatever its role).
std::optional<Finding> hardware_finding(const JobWindow& job, size_t c, const std::vector<double>& pcie_gens) {
  const RankWindow& r = job.ranks[c];
  if (!r.gpu.known) return std::nullopt;
  HwCase k{job, r, median_without(pcie_gens, r.gpu.pcie_gen)};
  std::optional<Finding> f;
  for (const auto& rule : kHardwareRules) {
    auto h = rule.evidence(k);
    if (!h) continue;
    if (f) {
      f->evidence.push_back(std::string("also: ") + cause_name(h->cause) + " (" + h->culprit + "): " + h->evidence.front());
      continue;
    }
    f.emplace();
    f->rank = r.rank;
    f->node = r.node;
    f->cause = rule.cause;
    f->layer = layer_of(rule.cause);
    f->culprit = h->culprit;
    f->confidence = clamp01(rule.confidence * h->certainty);
    f->evidence = std::move(h->evidence);
    f->advice = fill_in(fill_in(rule.advice, "{rank}", rank_name(r)), "{culprit}", h->culprit);
  }
  return f;
}

// ---------------------------------------------------------------------------------------------
// A hang's evidence, as a collective flight recorder gives it (PyTorch's Flight Recorder, CCL-D):
// the hung rank's last collective, who never entered the call the job stopped in, and where the
// hung rank's threads were while the others waited.

// Stall stacks said per rank and kind: the heaviest paths say what a rank was doing; more is noise.
constexpr size_t kHangStacksShown = 2;
// The deepest frames of a call path said in the evidence: where the thread was, without the
// start-up frames every stack shares.
constexpr size_t kHangPathFrames = 4;
// At most this many ranks are listed by number in one piece of evidence (100k-rank jobs).
constexpr size_t kHangRanksListed = 16;

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < kHangRanksListed; ++i) s += (s.empty() ? "" : ",") + std::to_string(ranks[i]);
  if (ranks.size() > kHangRanksListed) s += ",... (" + std::to_string(ranks.size()) + " ranks)";
  return "[" + s + "]";
}

std::string comm_name(const std::string& id) { return id.empty() ? "an unnamed communicator" : "communicator " + id; }

std::string path_tail(const std::string& path) {
  auto frames = split_path(path);
  if (frames.size() <= kHangPathFrames) return path;
  std::string out = "...";
  for (size_t i = frames.size() - kHangPathFrames; i < frames.size(); ++i) out += ";" + std::string(frames[i]);
  return out;
}

// The rank's latest collective call, over its communicators.
const CommProgress* latest_call(const RankWindow& r) {
  const CommProgress* best = nullptr;
  for (const auto& p : r.comms) {
    if (!best || p.last_enter_ns > best->last_enter_ns) best = &p;
  }
  return best;
}

// The call a communicator stopped in: the furthest call (by sequence number) any member entered,
// which members entered it (and completed it), and which never did.
struct StuckCall {
  std::string comm, op;
  uint64_t seq = 0;
  std::vector<int> entered, completed, missing;
  std::map<int, uint64_t> last_seq;  // each missing rank's own last call
};

std::optional<StuckCall> stuck_call(const JobWindow& job, const std::string& comm) {
  if (comm.empty()) return std::nullopt;  // no communicator id: calls of different ranks do not pair up
  StuckCall s;
  s.comm = comm;
  std::vector<std::pair<int, const CommProgress*>> members;
  for (const auto& r : job.ranks) {
    for (const auto& p : r.comms) {
      if (p.comm == comm && p.last_seq > 0) members.emplace_back(r.rank, &p);
    }
  }
  if (members.size() < 2) return std::nullopt;
  for (const auto& [rank, p] : members) {
    if (p->last_seq > s.seq) s.seq = p->last_seq, s.op = p->last_op;
  }
  for (const auto& [rank, p] : members) {
    if (p->last_seq >= s.seq) {
      s.entered.push_back(rank);
      if (p->last_completed) s.completed.push_back(rank);
    } else {
      s.missing.push_back(rank);
      s.last_seq[rank] = p->last_seq;
    }
  }
  return s;
}

// Whether a rank is inside a collective now, and since when (its entry, unix ns; 0: not inside).
// Inside means entered and not completed, as far as the store can show it:
// - the agent saw the call in flight at the rank's latest window's end (CommProgress::in_flight):
//   the host is in the call (gloo blocks there until the collective is done);
// - or its completion is observable (the rank's earlier calls were seen completing, on the device
//   for NCCL) and was never seen for this call;
// - or, where completion is not observable (NCCL without a device timeline), the host has waited
//   in a CUDA synchronize since after it entered the call: it waits for the collective's stream;
// - or, with no collective recorded at all (the communication probes did not attach), the host
//   waits in a CUDA synchronize: for device work, a collective's or a kernel's, that has not
//   finished (since that synchronize's entry).
// A rank whose calls all completed is outside every collective, however long ago its last one:
// a checkpoint, an evaluation pass, a teardown, a stalled data loader look like that, and none
// is a hang by itself.
uint64_t inside_collective_since(const RankWindow& r) {
  const CommProgress* p = latest_call(r);
  if (!p) {
    uint64_t since = 0;
    for (const auto& f : r.in_flight) {
      if (f.library == "cuda" && f.entered_ns > 0 && (since == 0 || f.entered_ns < since)) since = f.entered_ns;
    }
    return since;
  }
  if (p->last_completed || p->last_enter_ns == 0) return 0;
  if (p->in_flight || p->completed > 0) return p->last_enter_ns;
  for (const auto& f : r.in_flight) {
    if (f.library == "cuda" && f.entered_ns >= p->last_enter_ns) return p->last_enter_ns;
  }
  return 0;
}

// How long the rank has been inside its collective by the latest data (0: not inside).
double inside_s(const JobWindow& job, const RankWindow& r) {
  uint64_t since = inside_collective_since(r);
  return since > 0 && job.observed_until_ns > since ? static_cast<double>(job.observed_until_ns - since) / 1e9 : 0;
}

void hang_collective_evidence(const JobWindow& job, const RankWindow& r, std::vector<std::string>& evidence) {
  const CommProgress* mine = latest_call(r);
  if (!mine) {
    evidence.push_back("no collective call of " + rank_name(r) + " was recorded in the window");
    return;
  }
  std::string call = mine->last_op + (mine->last_seq > 0 ? " #" + std::to_string(mine->last_seq) : "");
  std::string state = mine->last_completed ? "completed"
                     : mine->in_flight    ? "entered and never completed: still inside it at the latest window (the agent saw it in flight)"
                                          : "entered and never completed";
  evidence.push_back(rank_name(r) + "'s last collective: " + call + " on " + comm_name(mine->comm) + " (" +
                     std::to_string(mine->calls) + " calls on it recorded), " + state);
  // Its host waiting for the device (a synchronize the agent saw in flight), when it does.
  for (const auto& f : r.in_flight) {
    if (f.library != "cuda" || f.seen_ns <= f.entered_ns) continue;
    evidence.push_back(rank_name(r) + "'s host waits in " + f.op + ", entered " +
                       fmt("%.1f s", static_cast<double>(f.seen_ns - f.entered_ns) / 1e9) +
                       " before its latest window ended (seen in flight)");
    break;
  }
  auto s = stuck_call(job, mine->comm);
  if (!s) return;
  std::string stuck = s->op + " #" + std::to_string(s->seq) + " on " + comm_name(s->comm);
  size_t members = s->entered.size() + s->missing.size();
  if (s->missing.empty() && s->completed.size() == s->entered.size()) {
    // A call is recorded when it returns: one that blocks in the host (gloo) is not seen, so the job
    // may be inside the next call.
    evidence.push_back("all " + std::to_string(members) + " ranks of " + comm_name(s->comm) + " completed " + s->op + " #" +
                       std::to_string(s->seq) + ", their last recorded call: the job stopped after it (a call that "
                       "never returned is not recorded)");
    return;
  }
  if (s->missing.empty()) {
    evidence.push_back("all " + std::to_string(members) + " ranks of " + comm_name(s->comm) + " entered " + s->op + " #" +
                       std::to_string(s->seq) + "; " +
                       (s->completed.empty() ? "none completed it" : "only ranks " + rank_list(s->completed) + " completed it"));
    return;
  }
  bool hung_missing = std::find(s->missing.begin(), s->missing.end(), r.rank) != s->missing.end();
  if (hung_missing) {
    std::vector<int> others;
    for (int x : s->missing) {
      if (x != r.rank) others.push_back(x);
    }
    evidence.push_back(rank_name(r) + " never entered " + stuck + " (its last call there is #" +
                       std::to_string(s->last_seq[r.rank]) + "), which ranks " + rank_list(s->entered) + " entered and wait in" +
                       (others.empty() ? "" : "; ranks " + rank_list(others) + " never entered it either"));
  } else {
    std::vector<uint64_t> at;
    for (int x : s->missing) at.push_back(s->last_seq[x]);
    auto [lo, hi] = std::minmax_element(at.begin(), at.end());
    std::string stopped = *lo == *hi ? "#" + std::to_string(*lo) : "#" + std::to_string(*lo) + "-#" + std::to_string(*hi);
    evidence.push_back("ranks " + rank_list(s->missing) + " never entered " + stuck + " (they stopped at " + stopped +
                       "), which " + rank_name(r) + " and " + std::to_string(s->entered.size() - 1) + " other rank(s) entered");
  }
}

void hang_stack_evidence(const JobWindow& job, const RankWindow& r, double stalled_s, std::vector<std::string>& evidence) {
  auto top = [&](const Values& v, const char* kind) {
    std::vector<Value> sorted(v.begin(), v.end());
    std::sort(sorted.begin(), sorted.end(), [](const Value& a, const Value& b) { return a.ms_per_step > b.ms_per_step; });
    std::string out;
    for (size_t i = 0; i < sorted.size() && i < kHangStacksShown; ++i) {
      double t = sorted[i].ms_per_step;
      out += std::string(out.empty() ? "" : "; ") + (t >= 1000 ? fmt("%.1f s", t / 1000) : ms(t)) + " in " +
             path_tail(job.names.name(sorted[i].name));
    }
    if (!out.empty())
      evidence.push_back(rank_name(r) + " " + kind + " since the job's last progress " + fmt("%.0f s", stalled_s) +
                         " ago (thread time): " + out);
    return !out.empty();
  };
  bool off = top(r.stall_offcpu, "off-CPU (waiting)");
  bool on = top(r.stall_oncpu, "on-CPU");
  if (off && !on) evidence.push_back(rank_name(r) + " ran no sampled on-CPU code in the stall: it waits, it does not compute");
  if (!off && !on) evidence.push_back("no stacks of " + rank_name(r) + " were recorded in the stall");
}

// A job whose ranks are all outside every collective and alive, with no collective progress for
// this long, gets a note (never a finding, never a hang): such a stall is the job's own code (a
// checkpoint, an evaluation pass, a teardown, a data loader that stopped) and routine ones take
// seconds to minutes on large models; 10 minutes is the time PyTorch's NCCL watchdog gives a
// collective by default, so a stall past it is one an on-call engineer wants to look at.
constexpr double kStalledOutsideNoteS = 600;

// Ranks by whether they are inside a collective now (in_s[i] > 0, the seconds since they entered).
void inside_evidence(const JobWindow& job, const std::vector<double>& in_s, std::vector<std::string>& evidence) {
  std::vector<int> in, out;
  double longest = 0;
  std::string op;
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    if (in_s[i] > 0) {
      in.push_back(job.ranks[i].rank);
      if (in_s[i] > longest) {
        longest = in_s[i];
        if (const CommProgress* p = latest_call(job.ranks[i])) op = p->last_op + (p->last_seq > 0 ? " #" + std::to_string(p->last_seq) : "");
      }
    } else {
      out.push_back(job.ranks[i].rank);
    }
  }
  if (in.empty()) return;
  evidence.push_back("ranks " + rank_list(in) + " are inside a collective (the longest: " + op + ", for " + fmt("%.1f s", longest) +
                     ")" + (out.empty() ? "" : "; ranks " + rank_list(out) + " are inside none: they never entered it"));
}

// How far behind its peers' latest step a rank's data may end and still be waited for. An agent
// ships a window when it closes, each node at its own phase, and retries a batch the collector
// refused: with 10 s windows (the default) a node's latest time lags the freshest by up to a
// window, a retry and a send, about 30 s (the collector's join wait, server/diagnoser.h's
// kJoinGraceNs, for the same reason). Further behind, its agent has stopped sending; waiting for it
// would hold the job's verdict back for good.
constexpr uint64_t kLateDataNs = 30'000'000'000ull;

// The first few of `late` by name and node ("rank 3 (node-1), ... and N more"), for a note that waits
// for their data.
std::string late_ranks_named(const JobWindow& job, const std::vector<size_t>& late) {
  constexpr size_t kNamed = 3;
  std::string who;
  for (size_t k = 0; k < late.size() && k < kNamed; ++k) {
    const auto& r = job.ranks[late[k]];
    who += (k ? ", " : "") + rank_name(r) + (r.node.empty() ? "" : " (" + r.node + ")");
  }
  if (late.size() > kNamed) who += " and " + std::to_string(late.size() - kNamed) + " more";
  return who;
}

// A GPU that finished no work later than this share of a step after the job's last progress stopped
// with that progress: the hung one. Its peers compute the next step before they wait in its
// collective, so their last work ends most of a step later (at least the step's compute); the
// device's clock, converted to the host's, agrees with the host's progress far closer than this.
constexpr double kStoppedWithProgressShare = 0.1;

// The ranks whose data ends before the job's last progress, by kLateDataNs at most behind the job's
// latest data: their agents' windows that saw the stall are on their way (a window closes at each
// node's own moment, a refused batch is retried). Nothing of theirs says where they stopped: their
// last collective and last device work are old news, not evidence.
std::vector<bool> late_for_hang(const JobWindow& job, uint64_t last_progress_ns) {
  std::vector<bool> late(job.ranks.size(), false);
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    const uint64_t seen = job.ranks[i].observed_until_ns;
    late[i] = seen > 0 && seen < last_progress_ns && job.observed_until_ns - seen <= kLateDataNs;
  }
  return late;
}

// A hang: a rank stuck inside a collective (entered, not completed) for opt.hang_s or more, with no
// collective progress for as long, while rank processes are alive (or were, until a watchdog ended
// them). No progress with every rank outside every collective is no hang (inside_collective_since).
// Hangs have no step time, so they come first. A hang whose culprit may be among the ranks whose
// data has not reached the stall yet (late_for_hang) is no verdict yet: `waiting` says whose data
// it waits for.
std::optional<Finding> find_hang(const JobWindow& job, const Options& opt, std::string& waiting) {
  const size_t n = job.ranks.size();
  uint64_t last = 0;
  size_t alive = 0;
  for (const auto& r : job.ranks) {
    last = std::max(last, r.last_progress_ns);
    alive += r.alive ? 1 : 0;
  }
  std::vector<double> in_s(n, 0);
  double longest = 0;
  size_t inside = 0;
  for (size_t i = 0; i < n; ++i) {
    in_s[i] = inside_s(job, job.ranks[i]);
    longest = std::max(longest, in_s[i]);
    inside += in_s[i] > 0 ? 1 : 0;
  }
  if (longest < opt.hang_s) return std::nullopt;  // nobody stuck inside a collective
  // Ranks that are gone now but ran on, without progress, for hang_s after the job's last progress
  // while stuck inside a collective: a hang that a watchdog ended (NCCL's watchdog aborts after its
  // timeout, a launcher kills a job that stopped). A job that ends normally has completed its calls.
  size_t stalled_then_gone = 0;
  if (alive == 0 && last > 0) {
    for (const auto& r : job.ranks) {
      stalled_then_gone += r.last_seen_ns >= last + static_cast<uint64_t>(opt.hang_s * 1e9) ? 1 : 0;
    }
  }
  if (!(last > 0 && (alive > 0 || stalled_then_gone > 0) && job.observed_until_ns > last &&
        static_cast<double>(job.observed_until_ns - last) >= opt.hang_s * 1e9))
    return std::nullopt;
  double stalled_s = static_cast<double>(job.observed_until_ns - last) / 1e9;
  // The rank whose device stopped first holds the others in the collective; without a device
  // timeline, the one that made progress last is the least likely culprit.
  size_t c = 0;
  bool by_device = true;
  for (size_t i = 0; i < n; ++i) {
    if (job.ranks[i].last_device_ns == 0) by_device = false;
  }
  // Without a device timeline, a rank that never entered the call its peers wait in holds them
  // (a host-side hang: a deadlock, a data loader that stopped): when such ranks are a minority of the
  // communicator, the culprit is among them. (With a device timeline the GPU that stopped first
  // says more: an asynchronous launch lets a hung GPU's host run ahead of its peers.)
  // A late rank is no candidate: it looks as if it never entered the call and stopped early only
  // because its latest windows are not in (measured at 8,000 ranks: a node whose batch the collector
  // had refused was named, 4 s before the hung rank).
  const std::vector<bool> late = late_for_hang(job, last);
  std::vector<size_t> late_ranks;
  for (size_t i = 0; i < n; ++i) {
    if (late[i]) late_ranks.push_back(i);
  }
  std::vector<bool> candidate = late;
  candidate.flip();  // every rank whose data is in
  bool by_calls = false, by_inside = false;
  bool wait = false;  // the culprit may be a late rank
  if (!by_device) {
    std::string comm = job.communicator;
    if (comm.empty()) {
      if (const CommProgress* p = latest_call(job.ranks[0])) comm = p->comm;
    }
    if (auto s = stuck_call(job, comm); s && !s->missing.empty() && s->missing.size() < s->entered.size()) {
      std::fill(candidate.begin(), candidate.end(), false);
      for (size_t i = 0; i < n; ++i) {
        const bool missing = std::find(s->missing.begin(), s->missing.end(), job.ranks[i].rank) != s->missing.end();
        candidate[i] = missing && !late[i];
      }
      by_calls = true;
    } else {
      // Calls that do not pair up across ranks (no communicator id: gloo): the ranks inside no
      // collective, when they are fewer than those inside one, never entered it (alive, or gone:
      // a rank that died holds its peers as well). A late rank is inside none as far as the store
      // shows: not counted.
      size_t outside = 0;
      for (size_t i = 0; i < n; ++i) outside += in_s[i] == 0 && !late[i] ? 1 : 0;
      if (outside > 0 && outside < inside) {
        for (size_t i = 0; i < n; ++i) candidate[i] = in_s[i] == 0 && !late[i];
        by_inside = true;
      } else if (outside == 0 && !late_ranks.empty()) {
        wait = true;  // the rank that never entered may be a late one
      }
    }
    // Every rank that never entered is late: one of them holds the others.
    if (by_calls && std::none_of(candidate.begin(), candidate.end(), [](bool b) { return b; })) wait = true;
  }
  const auto first = std::find(candidate.begin(), candidate.end(), true);
  if (first == candidate.end()) wait = wait || !late_ranks.empty();
  if (!wait && first != candidate.end()) {
    c = static_cast<size_t>(first - candidate.begin());
    for (size_t i = c + 1; i < n; ++i) {
      if (!candidate[i]) continue;
      const auto& a = job.ranks[i];
      const auto& b = job.ranks[c];
      if (by_device ? a.last_device_ns < b.last_device_ns : a.last_progress_ns < b.last_progress_ns) c = i;
    }
    // With a device timeline, a late rank's GPU may have stopped first, unless the GPU named
    // stopped with the job's last progress (no late GPU can have stopped before that: each ran the
    // collective that completed then).
    if (by_device && !late_ranks.empty()) {
      const double step_ms = median(column(job, [](const RankWindow& x) { return x.base.steps > 0 ? x.base.step_ms : x.now.step_ms; }));
      const double tol_ns = known(step_ms) ? kStoppedWithProgressShare * step_ms * 1e6 : 0;
      if (static_cast<double>(job.ranks[c].last_device_ns) > static_cast<double>(last) + tol_ns) wait = true;
    }
  }
  if (wait) {
    uint64_t lag = 0;
    for (size_t i : late_ranks) lag = std::max(lag, job.observed_until_ns - job.ranks[i].observed_until_ns);
    const std::string who = late_ranks_named(job, late_ranks);
    waiting = fmt("no collective completed for %.1f s, but ", stalled_s) + std::to_string(late_ranks.size()) + " of " +
              std::to_string(n) + " ranks have no data since the job's last progress: " + who + " (their data ends up to " +
              fmt("%.1f s", static_cast<double>(lag) / 1e9) +
              " before the job's latest; their agents' latest windows have not reached the store). The rank that holds the "
              "others may be among them: the verdict waits for their data";
    return std::nullopt;
  }
  const auto& r = job.ranks[c];
  Finding f;
  f.rank = r.rank;
  f.node = r.node;
  f.cause = Cause::kHang;
  f.layer = by_device ? "gpu" : "comm";
  f.culprit = by_device ? "GPU " + std::to_string(r.gpu.index >= 0 ? r.gpu.index : r.rank) : rank_name(r);
  f.lost_ms_per_step = stalled_s * 1000;
  const std::string inside_part = "; " + std::to_string(inside) + " of " + std::to_string(n) +
                                  " ranks are inside a collective, the longest for " + fmt("%.1f s", longest);
  if (alive > 0)
    f.evidence.push_back(fmt("no collective completed for %.1f s", stalled_s) + " while " + std::to_string(alive) + " of " +
                         std::to_string(n) + " rank processes are alive" + inside_part);
  else
    f.evidence.push_back(fmt("no collective completed for %.1f s", stalled_s) + ": " + std::to_string(stalled_then_gone) +
                         " of " + std::to_string(n) + " rank processes ran on for " + fmt("%.0f s", opt.hang_s) +
                         " or more without progress, then exited" + inside_part);
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
    // A rank its peers wait for in a numbered call is as direct as a GPU that stopped first; one
    // that is merely inside no collective while they are inside one, a little less (its calls do
    // not pair up with theirs).
    f.confidence = by_calls ? 0.8 : by_inside ? 0.7 : 0.5;
  }
  hang_collective_evidence(job, r, f.evidence);
  if (!by_calls) inside_evidence(job, in_s, f.evidence);
  hang_stack_evidence(job, r, stalled_s, f.evidence);
  if (!late_ranks.empty()) {
    std::vector<int> ranks;
    for (size_t i : late_ranks) ranks.push_back(job.ranks[i].rank);
    f.evidence.push_back("ranks " + rank_list(ranks) + " have no data since the job's last progress yet (their agents' latest "
                         "windows have not reached the store): what is said above of them is of their earlier data, and they "
                         "were not judged");
  }
  f.advice = "dump the stacks of " + rank_name(r) + " (py-spy dump / cuda-gdb); check the GPU with nvidia-smi and dmesg (Xid)";
  return f;
}

// A job stalled outside every collective for kStalledOutsideNoteS or more, its ranks alive: a note
// with where the ranks' threads are (no finding: nothing says it is stuck). "" otherwise.
std::string stalled_outside_note(const JobWindow& job) {
  uint64_t last = 0;
  size_t alive = 0;
  for (const auto& r : job.ranks) {
    last = std::max(last, r.last_progress_ns);
    alive += r.alive ? 1 : 0;
    if (inside_collective_since(r) > 0) return "";
  }
  if (alive == 0 || last == 0 || job.observed_until_ns <= last) return "";
  double stalled_s = static_cast<double>(job.observed_until_ns - last) / 1e9;
  if (stalled_s < kStalledOutsideNoteS) return "";
  std::string note = "no collective for " + fmt("%.0f s", stalled_s) + " while " + std::to_string(alive) + " of " +
                     std::to_string(job.ranks.size()) +
                     " rank processes are alive, none inside a collective: the job is stalled in its own code (a "
                     "checkpoint, an evaluation, a data loader), not hung in a collective";
  // Where the threads are: the heaviest stall path of the first alive rank with stacks.
  for (const auto& r : job.ranks) {
    const Values& v = !r.stall_oncpu.empty() ? r.stall_oncpu : r.stall_offcpu;
    if (!r.alive || v.empty()) continue;
    const Value* top = &v.front();
    for (const auto& x : v) {
      if (x.ms_per_step > top->ms_per_step) top = &x;
    }
    note += "; " + rank_name(r) + (&v == &r.stall_oncpu ? " runs " : " waits in ") + path_tail(job.names.name(top->name));
    break;
  }
  return note;
}

// The ranks whose data for the window has not reached the store yet: no step in the window while
// their peers have some, and their latest recording window ends before the job's latest step, by
// kLateDataNs at most. In a job that steps together every rank makes the same steps, so a rank
// without any is one whose node's batch is still on its way (or a hang, found before this).
std::vector<size_t> late_ranks(const JobWindow& job) {
  std::vector<size_t> late;
  bool any_steps = false;
  for (const auto& r : job.ranks) any_steps = any_steps || r.now.steps > 0;
  if (!any_steps) return late;
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    const auto& r = job.ranks[i];
    if (r.now.steps == 0 && r.observed_until_ns > 0 && r.observed_until_ns < job.end_ns &&
        job.end_ns - r.observed_until_ns <= kLateDataNs)
      late.push_back(i);
  }
  return late;
}

// The note of a verdict that waits for late ranks (late_ranks).
std::string late_note(const Diagnosis& dx, const JobWindow& job, const std::vector<size_t>& late) {
  const std::string who = late_ranks_named(job, late);
  uint64_t lag = 0;
  for (size_t i : late) lag = std::max(lag, job.end_ns - job.ranks[i].observed_until_ns);
  return "the job slowed (step " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms) + ") and no rank whose data is in computes longer, but " +
         std::to_string(late.size()) + " of " + std::to_string(job.ranks.size()) + " ranks have no step in the window yet: " + who +
         " (their data ends up to " + fmt("%.1f s", static_cast<double>(lag) / 1e9) +
         " before the job's latest step; their agents' latest windows have not reached the store). One of them may be the "
         "straggler: the verdict waits for their data";
}

// A slow link: everyone waits longer in the collectives and nobody computes longer. Its end is the
// rank on every slow TCP connection when those were recorded; else, in a ring, the ranks on both
// sides of the slow link wait longest. Every link slower: the communicator, job-wide.
void find_slow_link(const JobWindow& job, Diagnosis& dx, double lost, double wait_med, double wait_base) {
  const size_t n = job.ranks.size();
  const double wait_up = wait_med - wait_base;
  auto links = find_slow_links(job);
  // A ring end is read by how much longer each rank waits than it did in the job's healthy past,
  // when every rank has one: what a rank waited before is the machine's shape (a rank alone on its
  // CPU waits for the two that share one, from the first step), not the link. Read by level, three
  // pinned ranks whose every link got 30 ms slower named "link of rank 0", the rank that waited
  // least by design.
  bool all_past = true;
  for (const auto& r : job.ranks) all_past = all_past && r.base.steps > 0 && known(r.base.wait_ms);
  auto waited = [all_past](const RankWindow& r) { return all_past ? r.now.wait_ms - r.base.wait_ms : r.now.wait_ms; };
  size_t best = 0;
  double best_score = -1e300;
  for (size_t i = 0; i < n && !links; ++i) {
    const auto& prev = job.ranks[(i + n - 1) % n];
    const auto& next = job.ranks[(i + 1) % n];
    double score = (waited(prev) + waited(next)) / 2 - waited(job.ranks[i]);
    if (known(score) && score > best_score) {
      best_score = score;
      best = i;
    }
  }
  if (links) best = links->culprit;
  // Without a slow connection among recorded ones, or without a ring end that stands out (its
  // neighbours wait clearly longer than it does), every link got slower (a fabric, a switch):
  // the job's communicator, not a rank's link, if the job's past says its collectives grew.
  bool fabric = !links && (tcp_recorded(job) || !(best_score >= kRingEndShare * wait_up)) && has_past(job);
  if (n == 2 && !links) {
    // Two ranks have one link between them: a slow end of it (either rank's NIC or port) and a
    // slower fabric stretch the same connections alike, in both directions, and each rank is the
    // other's only ring neighbour; neither the waits nor the TCP connections can tell them apart.
    // Named as the link it is, at job scope (no rank can be singled out). With the job's past, only
    // when its layers say the collectives grew while the hosts did not (job_layers' network rule: a
    // slower host stretches gloo's collectives too).
    const std::string link = "the link between " + rank_name(job.ranks[0]) + " and " + rank_name(job.ranks[1]);
    const std::string one_link = "a job of two ranks has one link: which end of it (or the fabric between) is slow cannot be told "
                                 "from the waits or the TCP connections";
    const std::string advice = "check both ends of " + link + " (ethtool -S, link speed, tc qdisc on each node) and the switch port between them";
    if (has_past(job)) {
      std::vector<std::string> head{"job step time " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms) +
                                    "; both ranks wait longer in collectives, and " + one_link};
      auto f = job_past_finding(job, lost, dx.baseline_step_ms, std::move(head));
      if (f && f->cause == Cause::kNetworkSlow) {
        f->culprit = link;
        f->advice = advice;
      }
      if (f) dx.findings.push_back(std::move(*f));
      else dx.note = unexplained(dx);
      return;
    }
    Finding f;
    f.scope = Scope::kJob;
    f.rank = -1;
    f.cause = Cause::kNetworkSlow;
    f.layer = "comm";
    f.culprit = link;
    f.lost_ms_per_step = lost;
    f.confidence = kJobWideLocate;
    f.evidence.push_back("job step time " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms));
    f.evidence.push_back("both ranks wait longer in collectives" + (job.communicator.empty() ? "" : " of communicator " + job.communicator) +
                         ": " + ms(wait_med) + " per step vs " + ms(wait_base) + " before; neither computes longer than the other");
    f.evidence.push_back(one_link);
    f.advice = advice;
    dx.findings.push_back(std::move(f));
  } else if (fabric) {
    std::vector<std::string> head{"job step time " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms) +
                                  "; every rank waits longer in collectives and no one link is slower than the others"};
    if (auto f = job_past_finding(job, lost, dx.baseline_step_ms, std::move(head))) dx.findings.push_back(std::move(*f));
    else dx.note = unexplained(dx);
  } else {
    const auto& r = job.ranks[best];
    Finding f;
    f.rank = r.rank;
    f.node = r.node;
    f.cause = Cause::kNetworkSlow;
    f.layer = "comm";
    f.culprit = "link of rank " + std::to_string(r.rank);
    f.lost_ms_per_step = lost;
    f.evidence.push_back("job step time " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms));
    f.evidence.push_back("all " + std::to_string(n) + " ranks wait longer in collectives" +
                         (job.communicator.empty() ? "" : " of communicator " + job.communicator) + ": " + ms(wait_med) +
                         " per step vs " + ms(wait_base) + " before; no rank computes longer than its peers");
    if (links) {
      f.evidence.push_back(slow_links_evidence(job, *links));
      f.confidence = 0.9;
    } else {
      const auto& prev = job.ranks[(best + n - 1) % n];
      const auto& next = job.ranks[(best + 1) % n];
      f.evidence.push_back("ring neighbours rank " + std::to_string(prev.rank) + " and rank " + std::to_string(next.rank) +
                           " wait " + ms((waited(prev) + waited(next)) / 2) + (all_past ? " longer than in the job's past" : "") + " vs " +
                           ms(waited(r)) + " for rank " + std::to_string(r.rank));
      f.confidence = clamp01(0.5 + (best_score > 0 && wait_med > 0 ? best_score / wait_med : 0));
    }
    f.advice = "check the NIC / link of " + rank_name(r) + " (ethtool -S, link speed, tc qdisc) and NCCL_IB/SOCKET settings";
    dx.findings.push_back(std::move(f));
  }
}

// ---------------------------------------------------------------------------------------------
// One rank's own CPU work slows every rank through the CPUs they share: a rank's DataLoader workers
// burning the node's CPUs in an augmentation (prefetched, so its own loop never waits for them), a
// rank compressing a checkpoint beside the step. Its step is as long as its peers' (they all wait
// for a CPU alike), so no straggler stands out and every rank slowed alike; its processes are the
// job's own, so they are no neighbour of the others either. What sets it apart: its processes (its
// workers counted) run on the CPU much more per step than its peers', more than they did in the
// job's healthy past, and the ranks beside it on its node wait longer for a CPU.

// A rank's CPU time per step exceeds its peers' by at least this share of theirs (against the past:
// grew beyond their growth by this share of their past CPU time): ranks that do the same work
// differ by ~10% in CPU per step (see kImbalanceCpuGrowth), and a whole job that drifts grows
// alike; a quarter more is the rank's own work.
constexpr double kOwnCpuShare = 0.25;
// How sure the finding is of its rank: located by its CPU time against its peers' (and its own
// past), not by a step longer than theirs, which it is not; as sure as a job-wide finding measured
// on one rank (kJobWideLocate).
constexpr double kSharedCpuLocate = kJobWideLocate;

struct SharedCpuHog {
  size_t c = 0;
  bool past = false;         // measured against the job's healthy past (else against peers only)
  double extra_cpu = 0;      // its CPU per step beyond its peers' (growth beyond their growth)
  double cpu_ref = 0;        // its CPU per step in its past, or its peers' now
  double runq = 0;           // the run-queue wait per step of the other ranks on its node (its growth, with a past)
  size_t beside = 0;         // the other ranks on its node
};

// Ranks whose CPU stands out are measured exactly against their peers, at most this many of them
// (the most above their group's median first): one rank's own work is the case this rule is for,
// and the exact comparison reads every peer (100k ranks).
constexpr size_t kMaxSharedCpuCandidates = 16;

// The rank whose own CPU work stands out most; with `past`, against the job's healthy past per
// layer (every rank has one), else against its peers now.
std::optional<SharedCpuHog> find_shared_cpu_hog(const JobWindow& job, bool past) {
  auto growth = [](const RankWindow& r, Os m) {
    return r.past.windows > 0 && known(r.get(m)) && known(r.past.get(m)) ? r.get(m) - r.past.get(m) : kUnknown;
  };
  auto cpu = [&](const RankWindow& x) { return past ? growth(x, Os::kCpu) : x.get(Os::kCpu); };
  // Candidates: above their peer group's median, the furthest first.
  const size_t n = job.ranks.size();
  const bool grouped = job.peer_group.size() == n;
  std::map<int, std::vector<double>> by_group;
  std::map<std::string, std::vector<size_t>> by_node;
  for (size_t i = 0; i < n; ++i) {
    by_group[grouped ? job.peer_group[i] : 0].push_back(cpu(job.ranks[i]));
    by_node[job.ranks[i].node].push_back(i);
  }
  std::map<int, double> group_med;
  for (auto& [g, v] : by_group) group_med[g] = median(std::move(v));
  std::vector<std::pair<double, size_t>> cands;
  for (size_t i = 0; i < n; ++i) {
    double d = cpu(job.ranks[i]) - group_med[grouped ? job.peer_group[i] : 0];
    if (known(d) && d > 0) cands.push_back({d, i});
  }
  std::sort(cands.begin(), cands.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  if (cands.size() > kMaxSharedCpuCandidates) cands.resize(kMaxSharedCpuCandidates);
  std::optional<SharedCpuHog> best;
  for (const auto& [unused, c] : cands) {
    const RankWindow& r = job.ranks[c];
    auto peers = peers_of(job, c);
    const double mine = cpu(r);
    const double theirs = peer_median(job, peers, cpu);
    const double scale = past ? peer_median(job, peers, [](const RankWindow& x) { return x.past.windows > 0 ? x.past.get(Os::kCpu) : kUnknown; })
                              : theirs;
    if (!known(mine) || !known(theirs) || !known(scale) || scale <= 0) continue;
    const double extra = mine - (past ? std::max(0.0, theirs) : theirs);
    if (extra < kOwnCpuShare * scale || (best && extra <= best->extra_cpu)) continue;
    // Whom it can slow: the other ranks on its node, through the CPUs they share.
    std::vector<double> runq;
    for (size_t i : by_node[r.node]) {
      if (i != c) runq.push_back(past ? growth(job.ranks[i], Os::kRunqWait) : job.ranks[i].get(Os::kRunqWait));
    }
    const double wait = median(runq);
    if (runq.empty() || !known(wait) || wait <= 0) continue;
    best = SharedCpuHog{c, past, extra, past ? r.past.get(Os::kCpu) : theirs, wait, runq.size()};
  }
  return best;
}

// Whether every rank has the job's healthy past of its OS layer (a change point with a whole
// metrics window before it).
bool os_past(const JobWindow& job) {
  for (const auto& r : job.ranks) {
    if (r.past.windows == 0 || !known(r.past.get(Os::kCpu)) || !known(r.past.get(Os::kRunqWait))) return false;
  }
  return !job.ranks.empty();
}

// The rank-scope finding for a rank whose own CPU work slowed every rank beside it, and what it
// explains; none when no rank stands out or it explains under kMinExplainedShare of the loss.
// Without the job's past per layer, only when the job slowed by kJobWideSlowdown (beyond a loaded
// machine's drift: nothing says the rank's extra work is new).
std::optional<Finding> shared_cpu_finding(const JobWindow& job, double lost, double baseline_ms, std::vector<std::string> head,
                                          double* explained) {
  *explained = 0;
  const bool past = os_past(job);
  if (!past && !(lost >= kJobWideSlowdown * baseline_ms)) return std::nullopt;
  auto hog = find_shared_cpu_hog(job, past);
  if (!hog) return std::nullopt;
  const RankWindow& r = job.ranks[hog->c];
  const std::string who = rank_name(r);
  Hypothesis h;
  h.cause = Cause::kHostHotspot;
  // Named for what it explains, as a neighbour is: at most its own extra run time on the CPUs the
  // others wait for, and never more than they wait.
  h.explained_ms = std::min({hog->extra_cpu, hog->runq, lost});
  // Under kMinExplainedShare of the loss it is no cause, and the rank is no straggler either: the
  // other rules have their say.
  if (!(h.explained_ms >= kMinExplainedShare * lost)) return std::nullopt;
  auto d = differential_profile(job, hog->c, peers_of(job, hog->c), &RankWindow::oncpu);
  h.culprit = d ? d->function : "CPU work";
  const std::string others = "the " + std::to_string(hog->beside) + (hog->beside == 1 ? " other rank" : " other ranks") + " on " + who +
                             "'s node";
  if (hog->past) {
    h.evidence.push_back(others + " wait " + ms(hog->runq) + " more per step for a CPU than in the job's healthy past");
    h.evidence.push_back(who + "'s processes run on the CPU " + ms(r.get(Os::kCpu)) + " per step vs " + ms(hog->cpu_ref) +
                         " in its past, " + ms(hog->extra_cpu) + " more than its peers' growth: its own work takes the CPUs they need");
  } else {
    h.evidence.push_back(others + " wait " + ms(hog->runq) + " per step for a CPU (no past of the job's OS layer to compare with)");
    h.evidence.push_back(who + "'s processes run on the CPU " + ms(r.get(Os::kCpu)) + " per step vs " + ms(hog->cpu_ref) +
                         " on its peers (+" + ms(hog->extra_cpu) + "): its own work takes the CPUs they need");
  }
  if (d) {
    h.evidence.push_back("differential on-CPU profile: " + d->function + (d->caller.empty() ? "" : " (called from " + d->caller + ")") +
                         " " + ms(d->culprit_ms) + " per step vs " + ms(d->peers_ms) + " on peers");
    if (d->in_worker) {
      std::string pids;
      for (uint32_t p : r.workers) pids += (pids.empty() ? "" : ", ") + std::to_string(p);
      h.evidence.push_back("it runs in a worker process of " + who + " (a DataLoader worker" + (pids.empty() ? "" : ": pid " + pids) +
                           "), counted for the rank: prefetching hides it from " + who + "'s own loop, not from the CPUs");
    }
  }
  *explained = h.explained_ms;
  const CauseRule* rule = nullptr;
  for (const auto& x : kRules) {
    if (x.cause == Cause::kHostHotspot) rule = &x;
  }
  return to_finding(job, hog->c, lost, {Ranked{std::move(h), rule}}, std::move(head), kSharedCpuLocate, Scope::kRank);
}

// No past per layer: the layer that explains the loss on the rank that suffers most, measured
// with absolute numbers (another process on our CPUs is never normal); what its top hypothesis
// explains goes to *explained. Only when the job slowed by kJobWideSlowdown (beyond a loaded
// machine's drift: without a past nothing says what the numbers were before).
std::optional<Finding> absolute_finding(const JobWindow& job, const Diagnosis& dx, double lost, const std::vector<double>& busy,
                                        std::vector<std::string> head, double* explained) {
  *explained = 0;
  if (!(lost >= kJobWideSlowdown * dx.baseline_step_ms)) return std::nullopt;
  size_t c = 0;
  double best = -1;
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    double v = 0;
    for (const auto& nbv : job.ranks[i].neighbours) {
      if (!is_agent(job.names.name(nbv.name))) v = std::max(v, nbv.ms_per_step);
    }
    v += known(busy[i]) ? busy[i] * 1e-3 : 0;  // tie-break by busy time
    if (v > best) {
      best = v;
      c = i;
    }
  }
  auto hs = descend(job, c, lost, true);
  if (!hs.empty()) *explained = hs.front().h.explained_ms;
  head.push_back("measured on " + rank_name(job.ranks[c]) + ", the rank whose CPUs other processes use most");
  return to_finding(job, c, lost, std::move(hs), std::move(head), kJobWideLocate, Scope::kJob);
}

// A rank found slow for its own CPU work (host-hotspot, workload-imbalance, launch-bound: a launch
// loop is CPU work too) takes CPUs that other ranks on its node share; a rank beside it then
// computes longer too, and no layer of its own names why: the process that takes its CPUs is the
// job's own (never a neighbour). Its layers say
// nothing (the rank that owns the work waits for those CPUs as long as it does, so it waits no
// longer than "its peers": an unexplained straggler) or that its CPUs are oversubscribed with no
// one process to name (cpu-contention, kOversubscribed). Such a straggler is the found rank's
// victim, not a second cause: it is folded into that finding as evidence when find_shared_cpu_hog
// names the same rank as the one whose CPU time takes the node's CPUs, and the victim's own wait
// for a CPU (its growth against the job's past where the OS layer has one) is at least
// kMinExplainedShare of what it adds (the share every cause must explain). Seen live on a 3-rank
// job pinned on two CPUs: rank 0's DataLoader workers burned the CPU that rank 2 shares with it;
// rank 0 was named (augment_sample), and rank 2, waiting 50 ms more per step for that CPU, was
// printed as an unexplained straggler.
void fold_cpu_victims(const JobWindow& job, Diagnosis& dx, double lost) {
  if (dx.findings.empty()) return;
  const bool past = os_past(job);
  auto hog = find_shared_cpu_hog(job, past);
  if (!hog) return;
  const RankWindow& h = job.ranks[hog->c];
  auto owner = [&](const Finding& x) {
    return x.scope == Scope::kRank && x.rank == h.rank && x.node == h.node &&
           (x.cause == Cause::kHostHotspot || x.cause == Cause::kWorkloadImbalance || x.cause == Cause::kLaunchBound);
  };
  if (std::none_of(dx.findings.begin(), dx.findings.end(), owner)) return;
  // Whether the straggler (rank, node) that adds `extra` per step waited for the hog's CPUs; if
  // so, the line that says so.
  auto victim = [&](int rank, const std::string& node, double extra) -> std::optional<std::string> {
    if (node != h.node || rank == h.rank) return std::nullopt;
    auto v = std::find_if(job.ranks.begin(), job.ranks.end(), [&](const RankWindow& x) { return x.rank == rank && x.node == node; });
    if (v == job.ranks.end()) return std::nullopt;
    const double now = v->get(Os::kRunqWait);
    const double before = v->past.windows > 0 ? v->past.get(Os::kRunqWait) : kUnknown;
    const double wait = past ? (known(now) && known(before) ? now - before : kUnknown) : now;
    if (!known(wait) || !(wait > 0) || wait < kMinExplainedShare * std::min(extra, lost)) return std::nullopt;
    return rank_name(*v) + " computes " + ms(extra) + " per step longer than its peers too: it waits " + ms(now) +
           " per step runnable but not running" + (past ? " (+" + ms(wait) + " vs the job's past)" : "") + " on the CPUs of " +
           rank_name(h) + "'s node, which " + rank_name(h) + "'s processes take (the job's own processes: no neighbour of its own names them)";
  };
  std::vector<std::string> lines;
  std::vector<Finding> kept;
  for (auto& f : dx.findings) {
    std::optional<std::string> line;
    if (f.scope == Scope::kRank && f.cause == Cause::kCpuContention && f.culprit == kOversubscribed)
      line = victim(f.rank, f.node, f.lost_ms_per_step);
    if (!line) {
      kept.push_back(std::move(f));
      continue;
    }
    lines.push_back(std::move(*line));
    dx.victims.push_back(f.rank);
  }
  std::vector<Diagnosis::Unexplained> left;
  for (auto& u : dx.unexplained) {
    auto line = victim(u.rank, u.node, u.lost_ms_per_step);
    if (!line) {
      left.push_back(std::move(u));
      continue;
    }
    lines.push_back(std::move(*line));
    dx.victims.push_back(u.rank);
  }
  dx.findings = std::move(kept);
  dx.unexplained = std::move(left);
  auto f = std::find_if(dx.findings.begin(), dx.findings.end(), owner);
  f->evidence.insert(f->evidence.end(), lines.begin(), lines.end());
}

// Every rank got slower by itself (no straggler, collective waits did not grow). One rank whose own
// CPU work takes the CPUs the others share (shared_cpu_finding) is reported when it explains at
// least as much as the job-wide reading does. That reading is each layer against the job's own past
// (job_layers) where the job has one; else, and also where that past names nothing while the OS
// layer has no past on every rank, the layers' absolute numbers on the rank that suffers most
// (absolute_finding). A step history alone (the healthy steps shared one metrics window with the
// slowdown's start, so no metrics window lies wholly before it) says that the job slowed, not what
// its OS layer measured before: job_layers cannot judge that layer, so its silence there is no
// verdict. A layer the past does name wins over absolute numbers, which say what is there now,
// not what changed. Returns what the finding it makes explains (ms per step; 0: none made).
double find_slowed_alike(const JobWindow& job, Diagnosis& dx, double lost, const std::vector<double>& busy, double wait_up) {
  std::vector<std::string> head{"job step time " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms) +
                                "; all ranks slowed alike (no straggler, " +
                                (known(wait_up) && wait_up > 0 ? "collective waits grew " + ms(wait_up) + " per step of it" : "collective waits did not grow") +
                                ")"};
  double hog_ms = 0;
  auto hog = shared_cpu_finding(job, lost, dx.baseline_step_ms, head, &hog_ms);
  if (has_past(job)) {
    auto layers = job_layers(job, lost);
    if (hog && (layers.empty() || layers.front().explained_ms <= hog_ms)) {
      dx.findings.push_back(std::move(*hog));
      return hog_ms;
    }
    if (auto f = job_past_finding(job, lost, dx.baseline_step_ms, head)) {
      dx.findings.push_back(std::move(*f));
      return layers.front().explained_ms;
    }
    if (hog) {
      dx.findings.push_back(std::move(*hog));
      return hog_ms;
    }
    if (os_past(job)) {
      dx.note = unexplained(dx);
      return 0;
    }
  }
  double abs_ms = 0;
  auto f = absolute_finding(job, dx, lost, busy, std::move(head), &abs_ms);
  if (hog && (!f || abs_ms <= hog_ms)) {
    dx.findings.push_back(std::move(*hog));
    return hog_ms;
  }
  if (f) {
    dx.findings.push_back(std::move(*f));
    return abs_ms;
  }
  dx.note = unexplained(dx);
  return 0;
}

// A link slower than the others from the job's first window on (a bad cable, port or NIC the job
// started with) changes nothing over time: the job is no slower than its past, and no rank is a
// straggler (a slow link stretches every rank's collectives alike). The ranks' TCP connections still
// show it: every bulk connection through one rank slow while every other rank has a fast one
// (find_slow_links: 2x the runner-up). It is said when
// - the ranks wait in collectives for at least kMinExplainedShare of the step (the share any cause
//   must explain: a link the ranks seldom wait for is not what paces them), and
// - the rank's own host does not explain its long RTTs: a rank that waits for a CPU longer than its
//   peers by more than kStandingLinkRunqShare of the collectives' wait delays its own ACKs (a loaded
//   node's loopback connections reached ~10 ms smoothed RTT), so its connections are slow because
//   its host is.
// What the link costs cannot be measured without a healthy past to compare with: the finding costs
// the ranks' collective wait, an upper bound, and says so; its confidence is the job-wide one.
constexpr double kStandingLinkRunqShare = 0.25;

void standing_slow_link(const JobWindow& job, Diagnosis& dx, double wait_med) {
  if (!(known(wait_med) && known(dx.step_ms) && dx.step_ms > 0 && wait_med >= kMinExplainedShare * dx.step_ms)) return;
  auto links = find_slow_links(job);
  if (!links) return;
  const RankWindow& r = job.ranks[links->culprit];
  auto peers = peers_of(job, links->culprit);
  if (os_excess(job, links->culprit, peers, Os::kRunqWait) > kStandingLinkRunqShare * wait_med) return;
  Finding f;
  f.rank = r.rank;
  f.node = r.node;
  f.cause = Cause::kNetworkSlow;
  f.layer = "comm";
  f.culprit = "link of " + rank_name(r);
  f.lost_ms_per_step = wait_med;
  f.confidence = kJobWideLocate;
  f.evidence.push_back(slow_links_evidence(job, *links));
  f.evidence.push_back("the ranks wait " + ms(wait_med) + " per step in collectives" +
                       (job.communicator.empty() ? "" : " of communicator " + job.communicator) + ", " +
                       fmt("%.0f%%", 100 * wait_med / dx.step_ms) + " of the step, and no rank computes longer than its peers");
  f.evidence.push_back("the job is no slower than its own past: the link was slow before the first window compared with "
                       "(since the job started, or since before its baseline), so what it costs cannot be measured; "
                       "the cost shown is the collectives' whole wait, an upper bound");
  if (known(r.get(Os::kRunqWait)))
    f.evidence.push_back(rank_name(r) + " waits " + ms(r.get(Os::kRunqWait)) + " per step for a CPU (peers " +
                         ms(peer_median(job, peers, [](const RankWindow& x) { return x.get(Os::kRunqWait); })) +
                         "): its host does not delay its connections");
  f.advice = "check " + rank_name(r) + "'s network path (ethtool -S, link speed and errors, tc qdisc on its node) and the switch port it uses";
  dx.findings.push_back(std::move(f));
}

// The collectives' growth names the link by itself when it is most of the job's loss (the other
// layers are not asked).
constexpr double kLinkMostOfTheLoss = 0.5;

// Below that, a rank whose transport is measurably worse than every other rank's (find_slow_links:
// every bulk TCP connection through it slow, the others' fast) and the busy hosts of a loaded node
// are two causes of one slowdown: the one that explains the larger share of the loss wins. The
// link explains the growth of the collective waits, which must be at least kMinExplainedShare of the
// loss, as any cause's; the other reading (a neighbour, a layer of the job's past, a rank's own CPU
// work) explains what find_slowed_alike says it does. So a busy neighbour that explains less than
// the wire does not mask the link, and a link that explains less is said as "also".
void link_or_slowed_alike(const JobWindow& job, Diagnosis& dx, double lost, const std::vector<double>& busy, double wait_med,
                          double wait_base) {
  Diagnosis alike;
  alike.step_ms = dx.step_ms;
  alike.baseline_step_ms = dx.baseline_step_ms;
  const double wait_up = wait_med - wait_base;
  const double alike_ms = find_slowed_alike(job, alike, lost, busy, wait_up);
  auto links = wait_up >= kMinExplainedShare * lost ? find_slow_links(job) : std::nullopt;
  if (links && wait_up > alike_ms) {
    find_slow_link(job, dx, lost, wait_med, wait_base);
    if (!dx.findings.empty()) {
      Finding& f = dx.findings.back();
      f.evidence.push_back("the collectives grew " + ms(wait_up) + " per step, " + fmt("%.0f%%", 100 * wait_up / lost) + " of the loss");
      if (!alike.findings.empty())
        f.evidence.push_back(std::string("also: ") + cause_name(alike.findings.front().cause) + " (" + alike.findings.front().culprit +
                             ") explains " + ms(alike_ms) + " per step, less than the collectives' growth");
    }
    return;
  }
  for (auto& f : alike.findings) {
    if (links && wait_up > 0)
      f.evidence.push_back("also: network-slow (link of " + rank_name(job.ranks[links->culprit]) + ", every bulk TCP connection slow) explains " +
                           ms(wait_up) + " per step, less than this");
    dx.findings.push_back(std::move(f));
  }
  if (dx.note.empty()) dx.note = alike.note;
}

// A straggler arrives last at each collective, so what it waits there is the collective's own time
// (the transfer), not a wait for a peer; what every rank, the straggler included, waits more than
// in the job's baseline is how much longer the collectives themselves take. When that growth is
// at least kMinExplainedShare of the loss and more than the straggler's extra busy time, the
// collectives explain the larger share, and the link is named (as find_slow_link names it: the
// rank on every slow TCP connection, the link of a two-rank job), with the straggler as "also".
// Only when the link's own evidence names it (a rank whose connections are all slow, or the two
// ranks' one link with the job's layers saying the hosts did not slow); else the straggler stands.
// True when the link's finding was made.
bool collectives_over_straggler(const JobWindow& job, Diagnosis& dx, double lost, double straggler_ms, size_t straggler,
                                double wait_med) {
  double floor_up = kUnknown;
  for (const auto& r : job.ranks) {
    if (r.base.steps == 0 || !known(r.base.wait_ms) || !known(r.now.wait_ms)) return false;
    double up = r.now.wait_ms - r.base.wait_ms;
    floor_up = known(floor_up) ? std::min(floor_up, up) : up;
  }
  if (!(known(floor_up) && floor_up >= kMinExplainedShare * lost && floor_up > straggler_ms)) return false;
  if (job.ranks.size() > 2 && !find_slow_links(job)) return false;
  double wait_base = median(column(job, [](const RankWindow& r) { return r.base.steps > 0 ? r.base.wait_ms : kUnknown; }));
  Diagnosis link;
  link.step_ms = dx.step_ms;
  link.baseline_step_ms = dx.baseline_step_ms;
  find_slow_link(job, link, lost, wait_med, wait_base);
  if (link.findings.empty() || link.findings.front().cause != Cause::kNetworkSlow) return false;
  Finding f = std::move(link.findings.front());
  const RankWindow& s = job.ranks[straggler];
  f.evidence.push_back("every rank, " + rank_name(s) + " that arrives last included, waits at least " + ms(floor_up) +
                       " more per step in the collectives than in the baseline: the collectives themselves take longer");
  f.evidence.push_back("also: " + rank_name(s) + " is busier than its peers by " + ms(straggler_ms) +
                       " per step, less than the collectives' growth");
  dx.findings.push_back(std::move(f));
  return true;
}

std::string joined(const std::vector<int>& ranks) {
  std::string s;
  for (int x : ranks) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

// Whether the statistical opinions agree with the findings, said in the summary. Two models:
// the z-scores across ranks (3 ranks or more) and the mixture over time (when steps were kept).
// They disagree with the findings when a model flags a rank the findings do not name, or when the
// top finding names a rank neither model flags. A model without an opinion never disagrees.
void compare_opinions(Diagnosis& dx) {
  const size_t n = dx.ranks;
  // The findings' ranks a model could see (a hang or a job-wide cause need not single out any rank,
  // nor a hardware fault that costs nothing yet or stopped its GPU: the metrics the models score
  // cannot show them).
  auto& so = dx.second;
  const auto& ot = so.over_time;
  std::vector<int> mine;
  int top = -1;  // the top finding's rank, when a model could see it
  for (size_t i = 0; i < dx.findings.size(); ++i) {
    const auto& f = dx.findings[i];
    bool hardware = f.cause == Cause::kGpuMemoryErrors || f.cause == Cause::kPcieDegraded || f.cause == Cause::kNvlinkDegraded;
    bool unseen_hardware = f.cause == Cause::kGpuLost || (hardware && f.lost_ms_per_step == 0);
    if (f.cause != Cause::kNetworkSlow && f.cause != Cause::kHang && !unseen_hardware && f.scope == Scope::kRank) {
      mine.push_back(f.rank);
      if (i == 0) top = f.rank;
    }
  }
  // A straggler no layer explains is still where the time goes: the models agree when they flag it.
  for (const auto& u : dx.unexplained) mine.push_back(u.rank);
  for (int v : dx.victims) mine.push_back(v);
  std::sort(mine.begin(), mine.end());
  mine.erase(std::unique(mine.begin(), mine.end()), mine.end());
  bool job_level = !dx.findings.empty() && mine.empty();
  auto has = [](const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); };

  // The z-scores: they agree when they flag exactly the findings' ranks.
  std::string z_summary;
  bool z_disagrees = false;
  std::vector<int> theirs = so.outlier_ranks;
  std::sort(theirs.begin(), theirs.end());
  if (!so.compared) {
    z_summary = "no statistical opinion: " + std::to_string(n) + " ranks are too few to compare";
  } else {
    z_disagrees = !job_level && mine != theirs;
    z_summary = z_disagrees ? "the statistical opinion flags rank(s) [" + joined(theirs) + "] where the layered diagnosis names [" +
                                  joined(mine) + "]"
                            : "the statistical opinion agrees";
  }
  // Over time: a rank it flags that the findings do not name, or the top finding's rank that
  // neither model flags.
  bool t_disagrees = false;
  std::string t_summary;
  if (ot.fitted && !job_level) {
    std::vector<int> extra;
    for (int r : ot.outlier_ranks) {
      if (!has(mine, r)) extra.push_back(r);
    }
    bool top_unseen = top >= 0 && !has(ot.outlier_ranks, top) && !(so.compared && has(so.outlier_ranks, top));
    t_disagrees = !extra.empty() || top_unseen;
    if (!extra.empty()) t_summary = "rank(s) [" + joined(extra) + "] changed, which the layered diagnosis does not name";
    if (top_unseen)
      t_summary += std::string(t_summary.empty() ? "" : "; ") + "neither model flags rank " + std::to_string(top) + " of the top finding";
  }
  so.disagrees = z_disagrees || t_disagrees;
  so.summary = z_summary;
  if (ot.fitted) so.summary += "; over time: " + (t_disagrees ? t_summary : std::string("agrees"));
}

// A rank alone in its parallel role (a pipeline stage of one rank: pp without data-parallel
// replicas) has no peer to compare with; the job's past is its reference. Its busy time's growth
// over its own baseline, beyond the median growth of the other ranks (a machine that slowed grows
// every rank's busy time; one rank's own slower work grows its own). Unknown without a baseline.
std::optional<double> own_past_excess(const JobWindow& job, size_t c, const std::vector<double>& busy) {
  auto growth = [&](size_t i) {
    const RankWindow& r = job.ranks[i];
    return r.base.steps > 0 && known(busy[i]) && known(r.base.busy_ms()) ? busy[i] - r.base.busy_ms() : kUnknown;
  };
  double mine = growth(c);
  if (!known(mine)) return std::nullopt;
  std::vector<double> others;
  for (size_t i = 0; i < job.ranks.size(); ++i) {
    if (i != c) others.push_back(growth(i));
  }
  double theirs = others.empty() ? 0.0 : median(std::move(others));
  if (!known(theirs)) return std::nullopt;
  return mine - theirs;
}

// Rank c and its own healthy past as its one peer: a job of two ranks for the layer rules.
JobWindow with_own_past(const JobWindow& job, size_t c) {
  JobWindow alone;
  alone.job = job.job;
  alone.start_ns = job.start_ns;
  alone.end_ns = job.end_ns;
  alone.observed_until_ns = job.observed_until_ns;
  alone.communicator = job.communicator;
  alone.names = job.names;
  alone.python_functions = job.python_functions;
  alone.python_library_functions = job.python_library_functions;
  alone.cuda_runtime_frames = job.cuda_runtime_frames;
  const RankWindow& r = job.ranks[c];
  RankWindow before;
  before.rank = r.rank;
  before.pid = r.pid;
  before.node = r.node;
  before.now = r.base;
  before.base = r.base;
  before.os = r.past.os;
  before.gpu = r.gpu;
  before.kernels = r.past.kernels;
  before.oncpu = r.past.oncpu;
  before.offcpu = r.past.offcpu;
  before.neighbours = r.past.neighbours;
  before.process = r.process;
  before.workers = r.workers;
  alone.ranks = {r, std::move(before)};
  alone.peer_group = {0, 0};
  return alone;
}

}  // namespace

Diagnosis diagnose(const JobWindow& job, const Options& opt) {
  Diagnosis dx;
  dx.job = job.job;
  dx.ranks = job.ranks.size();
  dx.data_notes = job.data_notes;
  if (job.ranks.empty()) return dx;
  auto n = job.ranks.size();

  // -- 1. detect: the job against its own history; hangs first, as they have no step time.
  dx.step_ms = median(column(job, [](const RankWindow& r) { return r.now.step_ms; }));
  dx.baseline_step_ms = median(column(job, [](const RankWindow& r) { return r.base.steps > 0 ? r.base.step_ms : kUnknown; }));
  dx.second = second_opinion(job);
  // Hardware faults NVML reports, per rank: found whether or not the job is slower yet.
  std::map<size_t, Finding> hw;
  std::vector<double> pcie_gens;
  for (const auto& r : job.ranks) {
    if (known(r.gpu.pcie_gen)) pcie_gens.push_back(r.gpu.pcie_gen);
  }
  std::sort(pcie_gens.begin(), pcie_gens.end());
  for (size_t i = 0; i < n; ++i) {
    if (auto f = hardware_finding(job, i, pcie_gens)) hw.emplace(i, std::move(*f));
  }
  std::string hang_waits;
  auto hang = find_hang(job, opt, hang_waits);
  if (!hang_waits.empty()) {
    dx.note = hang_waits;
    dx.waiting_for_data = true;
  }
  if (hang) {
    // A lost GPU is why the job hangs: its finding takes the hang's cost and evidence.
    bool explained = false;
    for (auto& [i, f] : hw) {
      if (f.cause != Cause::kGpuLost) continue;
      f.lost_ms_per_step = hang->lost_ms_per_step;
      f.evidence.push_back("the job hangs: " + hang->evidence.front());
      // and what the hang's own evidence says of the collective and the stacks.
      f.evidence.insert(f.evidence.end(), hang->evidence.begin() + 1, hang->evidence.end());
      explained = true;
    }
    if (!explained) dx.findings.push_back(std::move(*hang));
  } else if (!dx.waiting_for_data) {  // a stalled job waiting for a hang's data has no step to judge
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
    // The same in the job's healthy past (kUnknown: no past), for what a straggler's gap was then.
    auto base_busy = column(job, [](const RankWindow& r) { return r.base.steps > 0 ? r.base.busy_ms() : kUnknown; });
    double busy_noise = robust_sigma(busy, busy_med);
    double wait_med = median(column(job, [](const RankWindow& r) { return r.now.wait_ms; }));
    struct Cand {
      size_t i;
      double extra;
      bool own_past = false;  // alone in its parallel role: measured against its own healthy past
    };
    std::vector<Cand> cands;
    // Ranks in different parallel roles (pipeline stages) differ by design: each is compared
    // with its peer group only.
    const bool grouped = job.peer_group.size() == n;
    std::vector<double> rank_noise(n, busy_noise);
    double base_busy_med = median(base_busy);
    // A small group cannot tell its noise from one or two other values: its noise is pooled over
    // the other groups, as each rank's distance from its own group's median (the rank's own group
    // left out, so that a straggler in a group of two does not make its own noise).
    std::map<int, std::vector<double>> group_resid;
    std::vector<double> all_resid;
    std::map<int, std::vector<double>> by_group;         // known busy times per group
    std::map<int, std::vector<size_t>> group_members;   // rank indices per group
    std::map<int, double> group_med, group_noise, group_base_med;
    if (grouped) {
      std::map<int, std::vector<double>> base_by_group;
      for (size_t i = 0; i < n; ++i) {
        group_members[job.peer_group[i]].push_back(i);
        if (known(busy[i])) by_group[job.peer_group[i]].push_back(busy[i]);
        base_by_group[job.peer_group[i]].push_back(base_busy[i]);
      }
      for (auto& [g, v] : base_by_group) group_base_med[g] = median(std::move(v));
      for (auto& [g, v] : by_group) {
        group_med[g] = median(v);
        group_noise[g] = robust_sigma(v, group_med[g]);
        if (v.size() < 2) continue;
        for (double x : v) group_resid[g].push_back(x - group_med[g]);
        all_resid.insert(all_resid.end(), group_resid[g].begin(), group_resid[g].end());
      }
    }
    std::map<int, double> pooled_cache;
    auto pooled_noise = [&](int g) {
      if (group_resid.size() > kMaxExactPooledGroups) return robust_sigma(all_resid, 0.0);
      auto [it, fresh] = pooled_cache.emplace(g, 0.0);
      if (fresh) {
        std::vector<double> r;
        for (const auto& [h, v] : group_resid) {
          if (h != g) r.insert(r.end(), v.begin(), v.end());
        }
        it->second = r.empty() ? 0.0 : robust_sigma(r, 0.0);
      }
      return it->second;
    };
    // A slow job is asked what changed: the noise a straggler's excess must clear is the spread of
    // the other ranks' growth from their healthy past, not of their levels. A spread that was there
    // before is the machine's shape, not noise: three pinned ranks on two CPUs, two of them sharing
    // one and each 23 ms busier than the third from the first step, made a 17 ms "noise" whose 4x
    // floor (68 ms) hid a rank that tripled its batch (+44 ms, the others +-1.5). The same holds for
    // a group or a large job (nodes of two CPU generations). kUnknown: the job is not slow, or a
    // rank among them has no past.
    auto growth_noise = [&](const std::vector<size_t>& among) {
      if (!slow || among.empty()) return kUnknown;
      std::vector<double> growth;
      growth.reserve(among.size());
      for (size_t k : among) {
        if (!known(busy[k]) || !known(base_busy[k])) return kUnknown;
        growth.push_back(busy[k] - base_busy[k]);
      }
      return robust_sigma(growth, median(growth));
    };
    std::vector<size_t> all_ranks(n);
    std::iota(all_ranks.begin(), all_ranks.end(), size_t{0});
    const double job_growth_noise = n > kSmallGroup && !grouped ? growth_noise(all_ranks) : kUnknown;
    std::map<int, double> group_growth_noise;
    for (const auto& [g, members] : group_members) {
      if (members.size() > kSmallGroup) group_growth_noise[g] = growth_noise(members);
    }
    // The least extra busy time that makes a straggler, above its reference's noise.
    auto straggler_floor = [&](double noise) {
      return slow ? std::max({0.25 * lost, 0.03 * dx.step_ms, 4 * noise, 2.0}) : std::max({opt.min_spatial * dx.step_ms, 6 * noise, 5.0});
    };
    if (known(busy_med)) {
      for (size_t i = 0; i < n; ++i) {
        if (!known(busy[i])) continue;
        // Small jobs: compare with the others only, so the culprit pulls neither the median nor
        // the noise (with 4 ranks, one straggler and one long waiter would double the MAD).
        double ref = busy_med, noise = known(job_growth_noise) ? job_growth_noise : busy_noise;
        double base_ref = base_busy_med;  // the same reference's busy time in the job's past
        if (grouped && group_members[job.peer_group[i]].size() > kSmallGroup) {
          // A large group, as a large job: its own median and noise (linear in ranks, not square).
          const int g = job.peer_group[i];
          ref = group_med[g];
          noise = rank_noise[i] = group_noise[g];
          if (known(group_growth_noise[g])) noise = group_growth_noise[g];
          base_ref = group_base_med[g];
        } else if (grouped) {
          std::vector<double> others, others_base;
          std::vector<size_t> other_ranks;
          for (size_t k : group_members[job.peer_group[i]]) {
            if (k != i && known(busy[k])) others.push_back(busy[k]), others_base.push_back(base_busy[k]), other_ranks.push_back(k);
          }
          base_ref = median(std::move(others_base));
          if (others.empty()) {
            // No rank does its work (the only rank of its pipeline stage): its own healthy past is
            // its reference, and its growth stands out against the other ranks' growth.
            if (auto e = own_past_excess(job, i, busy); slow && e && *e >= straggler_floor(0))
              cands.push_back({i, *e, true});
            continue;
          }
          ref = median(others);
          if (!known(ref)) continue;
          noise = others.size() >= kMinGroupNoise ? robust_sigma(others, ref) : pooled_noise(job.peer_group[i]);
          rank_noise[i] = noise;
          if (const double g = growth_noise(other_ranks); others.size() >= kMinGroupNoise && known(g)) noise = g;
        } else if (n <= kSmallGroup) {
          std::vector<double> others, others_base;
          std::vector<size_t> other_ranks;
          for (size_t k = 0; k < n; ++k) {
            if (k != i) others.push_back(busy[k]), others_base.push_back(base_busy[k]), other_ranks.push_back(k);
          }
          ref = median(others);
          // Two other ranks' spread is no noise (kMinGroupNoise): they can differ by placement
          // (three pinned ranks on two CPUs: the two that share one are each 2x busier than the
          // third), and one of them can move with the straggler (the rank that shares its CPU
          // finishes sooner once the CPU's other half is the straggler's alone). Its own steps say
          // it instead (median_step_excess below), as for a rank with one peer. Seen: rank 0 of a
          // held-out 3-rank DDP job tripled its batch (+56 ms busy per step over its peers, who
          // waited 62 ms for it) under a 110 ms "noise" made of its two peers' growths (-1, -38).
          if (others.size() >= kMinGroupNoise) {
            noise = robust_sigma(others, ref);
            if (const double g = growth_noise(other_ranks); known(g)) noise = g;
          } else {
            noise = 0;
          }
          base_ref = median(std::move(others_base));
        }
        double floor = straggler_floor(noise);
        double e = busy[i] - ref;
        if (e < floor) continue;
        // Too few peers for their spread to say what noise is: most of its steps must show the gap
        // (kMinStepsCompared says why).
        if (!grouped && n - 1 < kMinGroupNoise) {
          if (const double m = median_step_excess(job, i, peers_of(job, i)); known(m) && m < floor) continue;
        }
        // Why the job slowed is what changed: a rank that was busier than the same peers by as much
        // in the job's healthy past (a slower CPU it is pinned to, a share of the work that is its
        // by design) is not it. Its gap's growth must clear the floor. A healthy 2-rank DDP job,
        // pinned one rank per CPU, slowed 11% on a busy node while rank 1 stayed 55-80 ms per
        // step busier than rank 0, as it had been from its first step.
        if (slow && known(base_ref) && known(base_busy[i]) && e - std::max(0.0, base_busy[i] - base_ref) < floor) continue;
        // Without a temporal slowdown, demand that the peers really wait for this rank.
        if (!slow && !(known(wait_med) && wait_med >= 0.5 * e)) continue;
        cands.push_back({i, e});
      }
      std::sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.extra > b.extra; });
      // The straggler is what its peers wait for. In a synchronous job every rank's step is the
      // same, so a rank's extra busy time is its peers' extra wait; a rank that also waits longer
      // than they do has longer steps than its peers, which is a measurement that does not
      // compare (its steps were cut at other boundaries, or measured over other times), not more
      // work: it is waiting for them, and is no straggler.
      // Checked in order of extra time until kMaxStragglers are kept: each check reads the peers.
      std::vector<Cand> kept;
      for (const auto& k : cands) {
        if (kept.size() == kMaxStragglers) break;
        double wait_peers = peer_median(job, peers_of(job, k.i), [](const RankWindow& x) { return x.now.wait_ms; });
        double own = job.ranks[k.i].now.wait_ms;
        if (known(own) && known(wait_peers) && own - wait_peers > kStragglerOwnWaitShare * k.extra) continue;
        if (known(own) && known(wait_peers) && wait_peers >= kStragglerPeerWaitShare * k.extra &&
            wait_peers - own < kStragglerPeerWaitShare * k.extra)
          continue;
        kept.push_back(k);
      }
      cands = std::move(kept);
    }

    // A straggler that explains less of the loss than the collectives' own growth is not why the
    // job slowed: the link is (collectives_over_straggler).
    bool link_named = false;
    if (slow && !cands.empty() && collectives_over_straggler(job, dx, lost, std::min(cands.front().extra, lost), cands.front().i, wait_med)) {
      cands.clear();
      link_named = true;
    }

    // -- 3./4. descend on each straggler and keep its best-explained hypothesis.
    for (const auto& k : cands) {
      const auto& r = job.ranks[k.i];
      auto hf = hw.find(k.i);
      auto peers = peers_of(job, k.i);
      double wait_peers = peer_median(job, peers, [](const RankWindow& x) { return x.now.wait_ms; });
      double busy_peers = peer_median(job, peers, [](const RankWindow& x) { return typical_busy(x, true); });
      std::vector<std::string> head;
      if (slow) {
        head.push_back("job step time " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms) + " (+" +
                       fmt("%.0f%%", 100 * lost / dx.baseline_step_ms) + ")");
      }
      if (k.own_past)
        head.push_back(rank_name(r) + " is the straggler: busy " + ms(typical_busy(r, true)) + " per step vs " + ms(typical_busy(r, false)) +
                       " in its own past; waits " + ms(r.now.wait_ms) + " in collectives vs " + ms(r.base.wait_ms));
      else
        head.push_back(rank_name(r) + " is the straggler: busy " + ms(typical_busy(r, true)) + " per step vs " + ms(busy_peers) +
                       " on its peers; waits " + ms(r.now.wait_ms) + " in collectives vs " + ms(wait_peers));
      if (job.peer_group.size() == n && !k.own_past)
        head.push_back("its peers: the " + std::to_string(peers.size()) + (peers.size() == 1 ? " other rank" : " other ranks") +
                       " of its parallel role (its pipeline stage, from the communicators it shares)");
      double z = rank_noise[k.i] > 0 ? k.extra / rank_noise[k.i] : 100;
      double locate = clamp01(0.6 + z / 25);
      // The job loses what this rank adds beyond its peers, but never more than it got slower.
      double cost = slow ? std::min(k.extra, lost) : k.extra;
      if (hf != hw.end()) {
        // The straggler's GPU reports a fault: that is why it is slow. What the layers would have
        // said is kept as "also".
        Finding& f = hf->second;
        f.lost_ms_per_step = cost;
        head.insert(head.end(), f.evidence.begin(), f.evidence.end());
        f.evidence = std::move(head);
        if (auto other = to_finding(job, k.i, cost, descend(job, k.i, k.extra, false), {}, locate, Scope::kRank);
            other && other->cause != Cause::kGpuSlow)
          f.evidence.push_back(std::string("also: ") + cause_name(other->cause) + " (" + other->culprit + ")");
        continue;
      }
      // The layers' verdict on rank i of `on`: a finding, or a line that says where the time goes
      // and what the layers saw when none of them explains it.
      auto descend_on = [&](const JobWindow& on, size_t i) {
        std::vector<std::string> seen;
        auto hs = descend(on, i, k.extra, false, &seen);
        if (hs.empty() || !(hs.front().h.explained_ms >= kMinExplainedShare * cost)) head.insert(head.end(), seen.begin(), seen.end());
        Diagnosis::Unexplained why_not;
        if (auto f = to_finding(on, i, cost, std::move(hs), std::move(head), locate, Scope::kRank, &why_not))
          dx.findings.push_back(std::move(*f));
        else if (!why_not.text.empty())
          dx.unexplained.push_back(std::move(why_not));
      };
      if (k.own_past) {
        // Its past as its one peer: every layer's rule reads "its peers" as the rank before.
        JobWindow alone = with_own_past(job, k.i);
        head.push_back(rank_name(r) + " does work no other rank does (alone in its parallel role): compared with its own healthy past, "
                       "its busy time grew " + ms(k.extra) + " per step more than the other ranks' did; \"its peers\" below is "
                       "the rank itself before");
        descend_on(alone, 0);
        continue;
      }
      descend_on(job, k.i);
    }
    // Stragglers that none of their layers explains, on a job that slowed against its own past:
    // what they add beyond their peers is no cause, and the job's loss may be the whole job's. Each
    // layer of every rank against the job's healthy past (job_past_finding: the median rank, so one
    // or two stragglers move it little, and the cause must explain kMinExplainedShare of the loss)
    // is read as when no straggler stands out, less the collectives' waits (the stragglers' peers
    // wait for them). Seen on a 4-rank job whose one kernel took twice as
    // long on every GPU (+30 ms per step) while two ranks sharing a slower CPU computed 22-28 ms
    // longer than the other two from before the regression on: two unexplained stragglers and no
    // finding, where every GPU computed 30 ms more per step than before.
    // Or they wait for CPUs that another rank's own processes take (shared_cpu_finding: its
    // DataLoader workers, prefetching, so its own loop never waits): the job's own processes are no
    // neighbour of the stragglers, so no layer of theirs names them; they are unexplained, or their
    // CPUs read as oversubscribed with no one process to name (kOversubscribed). Said when every
    // such straggler is on that rank's node and the rank explains kMinExplainedShare of the loss
    // (shared_cpu_finding's own bar), and, where the stragglers are unexplained, at least as much
    // as the job's layers against its past. Seen on a 3-rank job pinned on two CPUs: rank 0's
    // worker burned the CPU that rank 2 shares with it; rank 2 computed 55 ms longer than its
    // peers, its layers saying only that it waited for a CPU.
    const bool only_oversubscribed =
        !dx.findings.empty() && std::all_of(dx.findings.begin(), dx.findings.end(), [](const Finding& f) {
          return f.cause == Cause::kCpuContention && f.culprit == kOversubscribed;
        });
    if (slow && !link_named && !cands.empty() && (only_oversubscribed || (dx.findings.empty() && !dx.unexplained.empty()))) {
      std::vector<std::pair<int, std::string>> waiting;  // (rank, node) of those stragglers
      for (const auto& f : dx.findings) waiting.emplace_back(f.rank, f.node);
      for (const auto& u : dx.unexplained) waiting.emplace_back(u.rank, u.node);
      std::string who;
      for (const auto& [rank, node] : waiting) who += (who.empty() ? "" : ", ") + std::string("rank ") + std::to_string(rank);
      const std::string step_line = "job step time " + ms(dx.step_ms) + " vs its baseline " + ms(dx.baseline_step_ms) + "; " + who +
                                    (waiting.size() == 1 ? " computes" : " compute") + " longer than the peers and none of ";
      double hog_ms = 0;
      auto hog = shared_cpu_finding(job, lost, dx.baseline_step_ms,
                                    {step_line + "the layers names what takes their CPUs (they see no neighbour: the "
                                                 "processes on their CPUs are the job's own)"},
                                    &hog_ms);
      if (hog && !std::all_of(waiting.begin(), waiting.end(), [&](const auto& w) { return w.second == hog->node && w.first != hog->rank; }))
        hog.reset();
      std::optional<Finding> whole;
      double whole_ms = 0;
      if (has_past(job) && !only_oversubscribed) {
        std::vector<std::string> head{step_line + "the layers says why (below), while every rank's layers, against the job's "
                                                  "healthy past, say what the whole job lost"};
        whole = job_past_finding(job, lost, dx.baseline_step_ms, std::move(head), true, &whole_ms);
      }
      if (hog && (!whole || whole_ms <= hog_ms)) {
        // The wait its layers measured (runq_evidence), as theirs.
        for (const auto& f : dx.findings) {
          for (const auto& e : f.evidence) {
            if (e.find("runnable but not running") != std::string::npos) hog->evidence.push_back(e);
          }
        }
        dx.findings.clear();
        dx.findings.push_back(std::move(*hog));
        dx.unexplained.clear();  // they waited for its CPUs: explained
      } else if (whole) {
        dx.findings.push_back(std::move(*whole));
      }
    }

    // A straggler whose own work takes the CPUs may slow another rank on its node beside it.
    if (slow && !link_named) fold_cpu_victims(job, dx, lost);

    // Everyone waits longer and no one computes longer: a link, the fabric, or the job slowed
    // alike. That reads "no one" over the ranks whose data is in; with some still on their way, the
    // straggler may be among them (all its peers wait for it, the loss is in every rank's waits).
    std::vector<size_t> late;
    if (cands.empty() && slow && !link_named) late = late_ranks(job);
    if (!late.empty()) {
      dx.note = late_note(dx, job, late);
      dx.waiting_for_data = true;
    } else if (cands.empty() && slow && !link_named) {
      double wait_base = median(column(job, [](const RankWindow& r) { return r.base.steps > 0 ? r.base.wait_ms : kUnknown; }));
      double wait_up = known(wait_base) ? wait_med - wait_base : 0;
      if (wait_up >= kLinkMostOfTheLoss * lost) {
        find_slow_link(job, dx, lost, wait_med, wait_base);
      } else {
        link_or_slowed_alike(job, dx, lost, busy, wait_med, wait_base);
      }
    }
    // Not slower than its past and no straggler: a link that was slow from the start shows only in
    // the connections.
    if (cands.empty() && !slow && dx.findings.empty()) standing_slow_link(job, dx, wait_med);
  }

  for (auto& [i, f] : hw) {
    if (f.lost_ms_per_step == 0)
      f.evidence.push_back(rank_name(job.ranks[i]) + " is not slower than its peers yet in this window");
    dx.findings.push_back(std::move(f));
  }
  std::stable_sort(dx.findings.begin(), dx.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.lost_ms_per_step > b.lost_ms_per_step; });

  if (dx.findings.empty()) {
    if (std::string stall = stalled_outside_note(job); !stall.empty()) dx.note += (dx.note.empty() ? "" : "; ") + stall;
  }
  compare_opinions(dx);
  return dx;
}

bool may_join_past(const Diagnosis& dx) { return dx.findings.empty() && dx.unexplained.empty() && !dx.waiting_for_data; }

bool healthy(const Diagnosis& dx) { return may_join_past(dx) && dx.note.empty(); }

}  // namespace strata::diagnose
