#include "testbed/sim/agents.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "agent/shipper/batching_writer.h"
#include "common/clock.h"
#include "testbed/sim/spec.h"
#include "testbed/synth/job.h"

namespace testbed::sim {

using strata::Error;
using strata::Result;
namespace fs = std::filesystem;
namespace shipper = strata::agent::shipper;
namespace synth = strata::synth;

namespace {

// Shipping threads by default: each drives a share of the agents (building and sealing their
// batches; every agent's own shipper thread sends them). A few are enough for 1,000 nodes and leave
// the machine's other cores to the collector under test.
constexpr int kDefaultThreads = 4;
// Agents do not close their windows in lockstep: real agents start at different times, so each
// node's windows end up to this share of a window later than the job's clock (spread by node), and
// each node sends a window when it ends. (Windows that all ended at once and were only sent late
// made every node's data as old as the latest node's: a hang showed up a window later than real
// agents show it.)
constexpr double kPhaseShare = 0.5;

struct Parsed {
  synth::JobSpec spec;
  std::string server, token, truth, spool_dir;
  std::string fault_name = "none";
  FaultSpec fault;
  int fault_node = -1, fault_local = -1;
  double speed = 1;
  int threads = kDefaultThreads;
  double drain_timeout_s = 120;
  bool quiet = false;
};

Result<long> integer(const char* flag, const std::string& v, long lo, long hi) {
  char* end = nullptr;
  long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != 0 || n < lo || n > hi)
    return Error{std::string(flag) + " " + v + ": want an integer in " + std::to_string(lo) + ".." + std::to_string(hi)};
  return n;
}

Result<double> number(const char* flag, const std::string& v, double lo, double hi) {
  char* end = nullptr;
  double n = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != 0 || !std::isfinite(n) || n < lo || n > hi)
    return Error{std::string(flag) + " " + v + ": want a number in " + std::to_string(lo) + ".." + std::to_string(hi)};
  return n;
}

// "600", "90s", "10m", "1h", "1d", "1w" -> seconds.
Result<double> duration(const char* flag, const std::string& v) {
  static const std::map<char, double> kUnits = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}, {'w', 604800}};
  std::string num = v;
  double unit = 1;
  if (!v.empty() && kUnits.count(v.back())) {
    unit = kUnits.at(v.back());
    num.pop_back();
  }
  auto n = number(flag, num, 0, 1e9);
  if (!n) return Error{std::string(flag) + " " + v + ": want a duration (600, 90s, 10m, 1h, 1d, 1w)"};
  return *n * unit;
}

// "KIND:node=K,local_rank=L[,start_step=..,param=..]" -> strata-sim run's spec with rank=K*R+L.
Result<FaultSpec> agents_fault(const std::string& text, int nodes, int per_node, int steps, int& node, int& local) {
  std::string kind = text.substr(0, text.find(':'));
  std::string rest = text.find(':') == std::string::npos ? "" : text.substr(text.find(':') + 1);
  std::string kept;
  std::stringstream items(rest);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (key == "node" || key == "local_rank") {
      auto n = integer(key == "node" ? "node=" : "local_rank=", value, 0, key == "node" ? nodes - 1 : per_node - 1);
      if (!n) return n.error();
      (key == "node" ? node : local) = static_cast<int>(*n);
      continue;
    }
    if (key == "rank") return Error{"rank= is not an option here: name the culprit by node=K,local_rank=L"};
    kept += (kept.empty() ? "" : ",") + item;
  }
  static const FaultKind kSimulated[] = {FaultKind::kNone, FaultKind::kGpuSlow, FaultKind::kCpuContention,
                                         FaultKind::kHostHotspot, FaultKind::kNetworkSlow, FaultKind::kHang};
  if (kind != "none") {
    if (node < 0 || local < 0) return Error{"fault " + kind + " needs node=K,local_rank=L"};
    kept = "rank=" + std::to_string(node * per_node + local) + (kept.empty() ? "" : "," + kept);
  }
  auto spec = parse_fault(kind + (kept.empty() ? "" : ":" + kept), nodes * per_node, steps);
  if (!spec) return spec.error();
  if (std::find(std::begin(kSimulated), std::end(kSimulated), spec->kind) == std::end(kSimulated))
    return Error{"fault " + spec->name + " is not simulated by agents (they simulate gpu-slow, cpu-contention, host-hotspot, "
                 "network-slow, hang)"};
  return *spec;
}

Result<Parsed> parse(const AgentsArgs& a) {
  Parsed p;
  if (a.server.empty()) return Error{"--server URL is required"};
  if (a.nodes.empty()) return Error{"--nodes N is required"};
  if (a.ranks_per_node.empty()) return Error{"--ranks-per-node R is required"};
  if (a.steps.empty()) return Error{"--steps S is required"};
  p.server = a.server;
  while (!p.server.empty() && p.server.back() == '/') p.server.pop_back();
  if (!a.token_file.empty()) {
    std::ifstream in(a.token_file);
    if (!in) return Error{"--token-file " + a.token_file + ": cannot read it"};
    std::getline(in, p.token);
    while (!p.token.empty() && std::isspace(static_cast<unsigned char>(p.token.back()))) p.token.pop_back();
    if (p.token.empty()) return Error{"--token-file " + a.token_file + ": empty"};
  }
  auto nodes = integer("--nodes", a.nodes, 1, 100000);
  if (!nodes) return nodes.error();
  auto per = integer("--ranks-per-node", a.ranks_per_node, 1, 64);
  if (!per) return per.error();
  auto steps = integer("--steps", a.steps, 1, 10000000);
  if (!steps) return steps.error();
  auto step_ms = number("--step-ms", a.step_ms, 1, 3600e3);
  if (!step_ms) return step_ms.error();
  auto window = number("--window-s", a.window_s, 0.1, 3600);
  if (!window) return window.error();
  auto speed = number("--speed", a.speed, 0, 1e6);
  if (!speed) return speed.error();
  auto seed = integer("--seed", a.seed, 0, 2147483647);
  if (!seed) return seed.error();
  auto history = duration("--history", a.history);
  if (!history) return history.error();
  auto every = duration("--history-every", a.history_every);
  if (!every) return every.error();
  if (*history > 0 && *every <= 0) return Error{"--history-every must be positive"};
  auto drain = number("--drain-timeout", a.drain_timeout, 0, 86400);
  if (!drain) return drain.error();
  if (!a.threads.empty()) {
    auto t = integer("--threads", a.threads, 1, 256);
    if (!t) return t.error();
    p.threads = static_cast<int>(*t);
  }
  p.threads = std::min<int>(p.threads, static_cast<int>(*nodes));
  p.speed = *speed;
  p.drain_timeout_s = *drain;
  p.truth = a.truth;
  p.spool_dir = a.spool_dir;
  p.quiet = a.quiet;
  auto& s = p.spec;
  s.job = a.job.empty() ? "sim-agents-" + std::to_string(::getpid()) : a.job;
  s.nodes = static_cast<int>(*nodes);
  s.ranks_per_node = static_cast<int>(*per);
  s.steps = static_cast<int>(*steps);
  s.step_ms = *step_ms;
  s.window_s = *window;
  s.same_pids = a.same_pids;
  s.seed = static_cast<uint64_t>(*seed);
  s.history_s = *history;
  if (!a.pid_base.empty()) {
    auto b = integer("--pid-base", a.pid_base, 2, 4194304 - static_cast<long>(s.nodes) * s.ranks_per_node);
    if (!b) return b.error();
    s.pid_base = *b;
  }
  s.history_every_s = *every;
  auto fault = agents_fault(a.fault, s.nodes, s.ranks_per_node, s.steps, p.fault_node, p.fault_local);
  if (!fault) return fault.error().context("--fault " + a.fault);
  p.fault = *fault;
  s.fault_rank = p.fault.rank;
  s.fault_start_step = p.fault.start_step;
  switch (p.fault.kind) {
    case FaultKind::kGpuSlow: s.fault = synth::Fault::kGpuSlow, s.fault_param = p.fault.param("factor"); break;
    case FaultKind::kCpuContention: s.fault = synth::Fault::kCpuContention, s.fault_param = p.fault.param("hogs"); break;
    case FaultKind::kHostHotspot: s.fault = synth::Fault::kHostHotspot, s.fault_param = p.fault.param("ms"); break;
    case FaultKind::kNetworkSlow: s.fault = synth::Fault::kNetworkSlow, s.fault_param = p.fault.param("rate_mbit"); break;
    case FaultKind::kHang: s.fault = synth::Fault::kHang; break;
    default: s.fault = synth::Fault::kNone; break;
  }
  return p;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o;
}

std::string kinds_json(const shipper::KindCounts& k) {
  std::string o = "{";
  for (const auto& [name, n] : k) o += (o.size() > 1 ? ", " : "") + ("\"" + name + "\": " + std::to_string(n));
  return o + "}";
}

uint64_t total(const shipper::KindCounts& k) {
  uint64_t n = 0;
  for (const auto& [_, v] : k) n += v;
  return n;
}

}  // namespace

void add_agents_options(CLI::App& app, AgentsArgs& a) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--server", a.server, "the collector, http://HOST:PORT (strata serve) (required)")->type_name("URL");
  app.add_option("--token-file", a.token_file, "a file holding the collector's bearer token")->type_name("F");
  app.add_option("--nodes", a.nodes, "simulated nodes, one agent each, named node-0.. (required)")->type_name("N");
  app.add_option("--ranks-per-node", a.ranks_per_node, "ranks per node; global rank = node * R + local rank (required)")
      ->type_name("R");
  app.add_option("--steps", a.steps, "training steps after the history (required)")->type_name("S");
  app.add_option("--step-ms", a.step_ms, "a healthy step's duration (default 1000)")->type_name("MS");
  app.add_option("--window-s", a.window_s, "each agent's window: one batch per node per window (default 10)")
      ->type_name("SEC");
  app.add_option("--speed", a.speed,
                 "data seconds per wall-clock second (default 1: as real agents; 0: as fast as the collector "
                 "takes them, the job ending now). The collector's diagnosis reads time from the data")
      ->type_name("F");
  app.add_option("--fault", a.fault,
                 "the fault (default none): gpu-slow[factor] cpu-contention[hogs] host-hotspot[ms] "
                 "network-slow[rate_mbit] hang, on the rank node=K,local_rank=L, from start_step (default steps/10), "
                 "as in strata-sim run")
      ->type_name("KIND:node=K,local_rank=L[,start_step=..,key=value]");
  app.add_flag("--same-pids", a.same_pids, "every node's ranks have the same pids (as in containers)");
  app.add_option("--seed", a.seed, "seed of the per-rank, per-step noise (default 1)")->type_name("N");
  app.add_option("--job", a.job, "the job's name (default sim-agents-PID)")->type_name("NAME");
  app.add_option("--pid-base", a.pid_base,
                 "the ranks' first pid (default: one of 400 ranges of 10,000 chosen by the job's name; jobs shipped "
                 "to one collector need pids of their own: the collector joins rows to ranks by node and pid)")
      ->type_name("PID");
  app.add_option("--history", a.history,
                 "a healthy past before the live steps, shipped first as fast as taken: one step per rank every "
                 "--history-every (e.g. 1h, 1d, 1w; default 0)")
      ->type_name("DURATION");
  app.add_option("--history-every", a.history_every, "spacing of the history's steps (default 600 s)")->type_name("DURATION");
  app.add_option("--threads", a.threads, "threads that build the agents' batches (default 4)")->type_name("N");
  app.add_option("--spool-dir", a.spool_dir, "where the agents spool (default a temporary folder, removed after)")
      ->type_name("DIR");
  app.add_option("--drain-timeout", a.drain_timeout, "at the end, wait this long for every batch to be acknowledged (default 120)")
      ->type_name("SEC");
  app.add_option("--truth", a.truth, "write the ground truth (job, fault, culprit, per-rank steps, shipping counts) here")
      ->type_name("FILE.json");
  app.add_flag("--quiet", a.quiet, "no progress lines");
}

int run_agents(const AgentsArgs& args) {
  auto parsed = parse(args);
  if (!parsed) {
    std::fprintf(stderr, "strata-sim: agents: %s\n", parsed.error().message.c_str());
    return 1;
  }
  Parsed& p = *parsed;
  const uint64_t wall0 = strata::wall_clock_ns();
  // Data time: with the wall clock when paced; unpaced, the job ends about now.
  {
    synth::Job probe(p.spec);
    const auto& w = probe.windows();
    uint64_t live = w.empty() ? 0 : w.back().end_ns;
    p.spec.t0_ns = p.speed > 0 ? wall0 : wall0 - live;
  }
  const synth::Job job(p.spec);
  const int nodes = p.spec.nodes;

  bool own_spool = p.spool_dir.empty();
  if (own_spool) {
    char tmpl[] = "/tmp/strata-sim-agents-XXXXXX";
    if (!::mkdtemp(tmpl)) {
      std::fprintf(stderr, "strata-sim: agents: cannot make a spool folder in /tmp\n");
      return 3;
    }
    p.spool_dir = tmpl;
  }
  std::random_device rd;
  const std::string run_tag = std::to_string(rd()) + std::to_string(::getpid());
  std::vector<std::unique_ptr<shipper::BatchingWriter>> writers;
  for (int n = 0; n < nodes; ++n) {
    shipper::ShipperOptions so;
    so.server = p.server;
    so.token = p.token;
    so.node = synth::Job::node_name(n);
    so.agent_id = "sim-" + p.spec.job + "-" + so.node + "-" + run_tag;
    so.spool_dir = p.spool_dir + "/" + so.node;
    so.interval_s = p.speed > 0 ? p.spec.window_s / p.speed : p.spec.window_s;
    const int watched = p.spec.ranks_per_node;
    auto w = shipper::BatchingWriter::open(so, nullptr, [watched](strata::ingest::AgentHealth& h) {
      h.set_sent_ns(strata::wall_clock_ns());
      h.set_version("strata-sim agents");
      h.set_watched_processes(static_cast<uint32_t>(watched));
      h.set_gpu_processes(static_cast<uint32_t>(watched));
    });
    if (!w) {
      std::fprintf(stderr, "strata-sim: agents: %s\n", w.error().message.c_str());
      return 1;
    }
    writers.push_back(std::move(*w));
  }

  // Each thread drives the agents n % threads == t, window by window; paced, an agent seals its
  // window when the window (plus its node's phase) has passed on the wall clock.
  const auto& windows = job.windows();
  std::atomic<bool> failed{false};
  std::mutex err_mu;
  std::string failure;
  std::atomic<size_t> windows_done{0};
  const auto steady0 = std::chrono::steady_clock::now();
  // The live windows are paced from when every worker has written its history (which goes as fast
  // as it can be built) and the collector has acknowledged it: paced from the start instead, the
  // live windows of a week's history at 100 x 8 went out while the collector still took in the
  // history (46 s of it at 77k rows/s), and cluster_scale's job-age phase measured the rounds of
  // that catch-up, not the live rounds after the history.
  const bool has_history = !windows.empty() && windows.front().history;
  std::atomic<int> history_written{0};
  std::atomic<int64_t> live0_ns{has_history ? -1 : 0};  // the live clock's start, after steady0
  auto wait_for_live = [&] {
    if (history_written.fetch_add(1) + 1 == p.threads) {
      const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(p.drain_timeout_s);
      for (auto& w : writers) w->drain(std::max(0.0, std::chrono::duration<double>(end - std::chrono::steady_clock::now()).count()));
      live0_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - steady0).count();
    }
    while (live0_ns.load() < 0 && !failed) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  };
  auto phase_s = [&](int n) {
    return kPhaseShare * p.spec.window_s * static_cast<double>((static_cast<uint64_t>(n) * 2654435761ull) % 1000) / 1000;
  };
  auto worker = [&](int t) {
    std::vector<int> mine;
    for (int n = t; n < nodes; n += p.threads) mine.push_back(n);
    std::sort(mine.begin(), mine.end(), [&](int a, int b) { return phase_s(a) < phase_s(b); });
    std::vector<synth::Job::NodeWriter> nw;
    std::vector<std::vector<synth::Job::Window>> node_windows;  // each node's, ending at its phase
    for (int n : mine) {
      nw.emplace_back(job, *writers[static_cast<size_t>(n)], n);
      node_windows.push_back(job.windows(static_cast<uint64_t>(phase_s(n) * 1e9)));
    }
    size_t most = 0;
    for (const auto& ws : node_windows) most = std::max(most, ws.size());
    auto fail = [&](const std::string& why) {
      std::lock_guard lock(err_mu);
      if (failure.empty()) failure = why;
      failed = true;
    };
    for (size_t i = 0; i < mine.size(); ++i) {
      if (auto st = nw[i].begin(p.spec.t0_ns); !st) return fail(st.error().message);
    }
    bool live = !has_history;
    for (size_t wi = 0; wi < most && !failed; ++wi) {
      for (size_t i = 0; i < mine.size() && !failed; ++i) {
        const auto& ws = node_windows[i];
        if (wi >= ws.size()) continue;  // its first window was longer: one window fewer
        const auto& w = ws[wi];
        if (!live && !w.history) {
          wait_for_live();
          live = true;
        }
        if (p.speed > 0 && !w.history) {
          double due_s = static_cast<double>(w.end_ns - p.spec.t0_ns) / 1e9 / p.speed;
          std::this_thread::sleep_until(steady0 + std::chrono::nanoseconds(live0_ns.load()) +
                                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                            std::chrono::duration<double>(due_s)));
        }
        auto& out = *writers[static_cast<size_t>(mine[i])];
        if (auto st = nw[i].window(w); !st) return fail(st.error().message);
        if (wi + 1 == ws.size()) {
          if (auto st = nw[i].end(w.end_ns); !st) return fail(st.error().message);
        }
        if (auto st = out.commit(); !st) return fail(st.error().message);
      }
      if (t == 0) windows_done = wi + 1;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < p.threads; ++t) threads.emplace_back(worker, t);
  std::thread progress;
  std::atomic<bool> stop_progress{false};
  if (!p.quiet) {
    progress = std::thread([&] {
      while (!stop_progress) {
        for (int i = 0; i < 50 && !stop_progress; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (stop_progress) break;
        uint64_t acked = 0, sealed = 0;
        for (const auto& w : writers) {
          auto c = w->counters();
          acked += total(c.records_acked);
          sealed += total(c.records_sealed);
        }
        std::printf("strata-sim: agents: window %zu of %zu, rows sealed %llu, acknowledged %llu\n", windows_done.load(),
                    windows.size(), static_cast<unsigned long long>(sealed), static_cast<unsigned long long>(acked));
        std::fflush(stdout);
      }
    });
  }
  for (auto& t : threads) t.join();
  const double built_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - steady0).count();
  bool drained = true;
  const auto drain_end = std::chrono::steady_clock::now() + std::chrono::duration<double>(p.drain_timeout_s);
  for (auto& w : writers) {
    double left = std::chrono::duration<double>(drain_end - std::chrono::steady_clock::now()).count();
    drained = w->drain(std::max(0.0, left)) && drained;
  }
  const double elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - steady0).count();
  stop_progress = true;
  if (progress.joinable()) progress.join();

  shipper::KindCounts sealed, acked;
  uint64_t batches_sealed = 0, batches_sent = 0, send_failures = 0, rejected = 0, dropped = 0;
  std::map<int, uint64_t> kept;
  for (const auto& w : writers) {
    auto c = w->counters();
    for (const auto& [k, v] : c.records_sealed) sealed[k] += v;
    for (const auto& [k, v] : c.records_acked) acked[k] += v;
    batches_sealed += c.batches_sealed;
    batches_sent += c.batches_sent;
    send_failures += c.send_failures;
    rejected += c.batches_rejected;
    dropped += c.batches_dropped;
    for (const auto& [s, n] : c.kept_answers) kept[s] += n;
  }
  // Stops the shipping threads, all at once (a thread each, as each agent has one already): each may
  // be inside a POST (up to its read timeout, 30 s), so one after the other a thousand could take hours.
  {
    std::vector<std::thread> stoppers;
    for (auto& w : writers) stoppers.emplace_back([&w] { w.reset(); });
    for (auto& t : stoppers) t.join();
    writers.clear();
  }
  if (own_spool) {
    std::error_code ec;
    fs::remove_all(p.spool_dir, ec);
  }

  const uint64_t fault_ns = job.fault_start_ns();
  const uint64_t fault_wall_ns =
      fault_ns == 0 ? 0
                    : wall0 + (p.speed > 0 ? static_cast<uint64_t>(static_cast<double>(fault_ns - p.spec.t0_ns) / p.speed)
                                           : 0);
  std::printf("strata-sim: agents: job %s, %d nodes x %d ranks, %zu windows, %zu history steps; fault %s\n",
              p.spec.job.c_str(), nodes, p.spec.ranks_per_node, windows.size(), job.history_steps(),
              p.fault.kind == FaultKind::kNone ? "none"
                                               : (p.fault.name + " on rank " + std::to_string(p.fault.rank) + " (node-" +
                                                  std::to_string(p.fault_node) + ", local rank " +
                                                  std::to_string(p.fault_local) + ")")
                                                     .c_str());
  std::printf("strata-sim: agents: batches sealed %llu, acknowledged %llu, send failures %llu, rejected %llu, dropped %llu\n",
              static_cast<unsigned long long>(batches_sealed), static_cast<unsigned long long>(batches_sent),
              static_cast<unsigned long long>(send_failures), static_cast<unsigned long long>(rejected),
              static_cast<unsigned long long>(dropped));
  std::printf("strata-sim: agents: rows sealed %llu, acknowledged %llu in %.1f s (built in %.1f s): %.0f rows/s\n",
              static_cast<unsigned long long>(total(sealed)), static_cast<unsigned long long>(total(acked)), elapsed_s,
              built_s, elapsed_s > 0 ? static_cast<double>(total(acked)) / elapsed_s : 0.0);

  int code = 0;
  std::string why = failure;
  if (why.empty() && !drained) why = "not every batch was acknowledged within --drain-timeout";
  if (why.empty() && (rejected > 0 || dropped > 0)) why = "the collector refused batches, or the spool dropped some";
  if (!why.empty()) code = 3;

  if (!p.truth.empty()) {
    const auto& s = p.spec;
    std::ostringstream o;
    o << "{\n  \"fault\": {\"kind\": \"" << p.fault.name << "\"";
    if (p.fault.kind != FaultKind::kNone) {
      o << ", \"scope\": \"rank\", \"rank\": " << p.fault.rank << ", \"node\": \"node-" << p.fault_node
        << "\", \"local_rank\": " << p.fault_local << ", \"layer\": \"" << fault_layer(p.fault.kind) << "\", \"cause\": \""
        << fault_cause(p.fault) << "\", \"culprit\": \"" << json_escape(job.culprit()) << "\", \"start_step\": "
        << p.fault.start_step << ", \"start_ns\": " << fault_ns << ", \"start_wall_ns\": " << fault_wall_ns
        << ", \"params\": {";
      bool first = true;
      for (const auto& [k, v] : p.fault.params) {
        o << (first ? "" : ", ") << "\"" << k << "\": " << v;
        first = false;
      }
      o << "}";
    }
    o << "},\n  \"job\": \"" << json_escape(s.job) << "\", \"nodes\": " << s.nodes << ", \"ranks_per_node\": "
      << s.ranks_per_node << ", \"ranks\": " << job.world() << ", \"steps\": " << s.steps << ", \"step_ms\": " << s.step_ms
      << ", \"window_s\": " << s.window_s << ", \"seed\": " << s.seed << ", \"same_pids\": "
      << (s.same_pids ? "true" : "false") << ",\n  \"t0_ns\": " << s.t0_ns << ", \"wall_t0_ns\": " << wall0
      << ", \"speed\": " << p.speed << ", \"history_s\": " << s.history_s << ", \"history_steps\": " << job.history_steps()
      << ",\n  \"shipping\": {\"agents\": " << nodes << ", \"windows\": " << windows.size()
      << ", \"batches_sealed\": " << batches_sealed << ", \"batches_acknowledged\": " << batches_sent
      << ", \"send_failures\": " << send_failures << ", \"rejected\": " << rejected << ", \"dropped\": " << dropped
      << ", \"kept_answers\": {";
    bool first = true;
    for (const auto& [st, n] : kept) {
      o << (first ? "" : ", ") << "\"" << st << "\": " << n;
      first = false;
    }
    o << "}, \"rows_sealed\": " << kinds_json(sealed) << ", \"rows_acknowledged\": " << kinds_json(acked)
      << ", \"data_s\": " << (windows.empty() ? 0.0 : static_cast<double>(windows.back().end_ns - s.t0_ns) / 1e9)
      << ", \"elapsed_s\": " << elapsed_s << ", \"built_s\": " << built_s << ", \"drained\": " << (drained ? "true" : "false")
      << "},\n  \"per_rank\": [\n";
    const size_t steps_done = job.steps_done();
    for (int r = 0; r < job.world(); ++r) {
      o << "    {\"rank\": " << r << ", \"node\": \"node-" << r / s.ranks_per_node << "\", \"local_rank\": "
        << r % s.ranks_per_node << ", \"pid\": " << job.pid(r) << ", \"steps\": " << steps_done << "}"
        << (r + 1 < job.world() ? "," : "") << "\n";
    }
    o << "  ]\n}\n";
    std::ofstream out(p.truth);
    out << o.str();
    if (!out) {
      std::fprintf(stderr, "strata-sim: agents: cannot write %s\n", p.truth.c_str());
      if (code == 0) code = 2;
    }
  }
  if (!why.empty()) std::fprintf(stderr, "strata-sim: agents: %s\n", why.c_str());
  return code;
}

}  // namespace testbed::sim
