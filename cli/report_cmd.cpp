#include <httplib.h>

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "cli/cli_app.h"
#include "cli/commands.h"
#include "cli/values.h"
#include "report/chrome_trace.h"
#include "report/exporters.h"
#include "report/os_table.h"
#include "server/web_api.h"
#include "store/store.h"

namespace strata::cli {

namespace {
const char* kReportUsage = R"(usage: strata report (FILE.db | --server URL [--token-file F]) [--job J] [--rank R] [--pid P] [--tid T] [--kind oncpu|offcpu]
                     [--last DURATION | --from NS [--to NS]] [--format text|folded|pprof|chrome-trace] [-o OUT]
)";
const char* kReportAbout = R"(Prints or exports what a store holds.

formats:
  text      processes, the agent's own cost, and the top functions by self and total samples (default)
  folded    one line per stack, root first: "frame;frame;...;leaf COUNT" (flamegraph.pl input)
  pprof     gzipped profile.proto for go tool pprof, Pyroscope, Parca (written to -o, default profile.pb.gz)
  chrome-trace  Trace Event JSON for Perfetto / chrome://tracing: a process per rank with its CPU
            threads, GPU streams, communicators and steps (written to -o, default trace.json);
            with --server, the ranks of the job with the most ranks (--job: that job's; --rank:
            one), at most 1h of rank time (six ranks' 10 minutes)

A filter (--job, --rank, --pid, --tid) that matches nothing in the store is an error (exit 1), not an
empty report. A span (--last, --from/--to) keeps the samples of the windows that overlap it and the
timeline rows inside it: a file a collector has written for weeks is read for that span only.
With --server the span is at most 1h (--from alone: the 10 minutes from NS; --to alone: the 10
minutes before it) and, given none, the collector's latest 10 minutes up to its latest step.
)";
const char* kReportFooter = "Exit codes: 0 ok, 1 bad input (no such store, a filter that matches nothing), 2 environment\n"
                            "(collector unreachable).\n";

// The OS layer's metrics per process (rank), after the profile (report/os_table.h).
void print_os_metrics(store::Reader& st, const std::vector<store::ProcessInfo>& procs, std::ostream& out) {
  auto rows = st.metrics("os.");
  if (!rows || rows->empty()) return;
  std::vector<report::OsProcess> ps;
  std::set<std::pair<std::string, uint32_t>> shown;  // (node, pid): pids repeat across nodes
  for (const auto& p : procs) {
    ps.push_back({p.pid, p.rank, p.comm});
    shown.insert({p.node, p.pid});
  }
  std::vector<report::OsMetricRow> rs;
  for (const auto& r : *rows) {
    if (shown.count({r.node, r.metric.pid})) rs.push_back({r.metric.pid, r.metric.name, r.metric.label, r.metric.value});
  }
  out << "\n";
  report::write_os_table(ps, rs, out);
}

// Runs of reduced fidelity shown at most; a months-long agent that stays stepped down has many.
constexpr size_t kMaxFidelityLines = 20;

// Where the agent's cost budget reduced the fidelity (issue 19: a lowered sampling rate, CFI
// unwinding off), on the nodes of `procs` (the processes the filters keep): said wherever a profile
// is shown, so nobody reads a 24 Hz stretch or cut-short stacks as the job's behaviour. `prefix`
// starts each line ("" in the text report, "strata: " on stderr beside an exported file).
void print_fidelity(store::Reader& st, const std::vector<store::ProcessInfo>& procs, const std::string& prefix,
                    std::ostream& out) {
  auto runs = st.reduced_fidelity();
  if (!runs || runs->empty()) return;
  std::set<std::string> nodes;
  for (const auto& p : procs) nodes.insert(p.node);
  std::vector<const store::ReducedFidelity*> shown;
  for (const auto& r : *runs)
    if (nodes.count(r.node)) shown.push_back(&r);
  if (shown.empty()) return;
  out << prefix << "reduced fidelity: the agent's cost budget lowered the sampling rate or turned CFI unwinding off"
      << " (profiles weigh each sample by its window's period; frame-pointer stacks through code without them are"
      << " cut short):\n";
  for (size_t i = 0; i < shown.size() && i < kMaxFidelityLines; ++i)
    out << prefix << "  " << store::describe_reduced_fidelity(*shown[i], procs) << "\n";
  if (shown.size() > kMaxFidelityLines)
    out << prefix << "  ... and " << shown.size() - kMaxFidelityLines << " more\n";
}

// `procs`: the processes the filters keep (all without filters).
void print_text(store::Reader& st, const report::Profile& p, const std::vector<store::ProcessInfo>& procs,
                std::ostream& out) {
  auto rec = st.latest_recording();
  if (!procs.empty()) {
    out << "processes:\n";
    std::map<uint32_t, uint64_t> per_pid;
    for (const auto& s : p.samples) per_pid[s.pid] += s.count;
    for (const auto& pr : procs) {
      out << "  pid " << std::setw(7) << pr.pid << "  " << std::setw(8) << per_pid[pr.pid] << " samples  ";
      if (pr.rank >= 0) out << "rank " << pr.rank << "  ";
      std::string cmd = pr.command.size() > 80 ? pr.command.substr(0, 77) + "..." : pr.command;
      out << cmd << "\n";
    }
  }
  if (rec && *rec) {
    auto stats = st.stats(**rec);
    if (stats && !stats->empty()) {
      std::map<std::string, double> m(stats->begin(), stats->end());
      out << "agent (last recording): " << static_cast<uint64_t>(m["samples_stored"]) << " samples stored, "
          << static_cast<uint64_t>(m["ringbuf_drops"]) << " lost; CPU " << std::fixed << std::setprecision(1)
          << m["agent_cpu_s"] * 1000 << " ms + BPF " << m["bpf_run_s"] * 1000 << " ms for "
          << std::setprecision(2) << m["target_cpu_s"] << " s of target CPU\n";
      out.unsetf(std::ios::fixed);
    }
  }
  print_fidelity(st, procs, "", out);
  out << "\n";
  report::write_top(p, out);
  print_os_metrics(st, procs, out);
}

// The processes that --rank and --pid keep, or an error when they keep none: an empty report
// would read as "nothing happened" when the filter was wrong.
Result<std::vector<store::ProcessInfo>> filtered_processes(store::Reader& st, const store::ProfileFilter& f,
                                                           const std::string& where) {
  auto procs = st.processes();
  if (!procs) return procs.error();
  if (!f.rank && !f.pid && !f.job) return std::move(*procs);
  std::vector<store::ProcessInfo> kept;
  std::set<int> ranks;
  std::set<std::string> jobs;
  for (auto& p : *procs) {
    if (!p.job.empty()) jobs.insert(p.job);
    if (f.job && p.job != *f.job) continue;
    if (p.rank >= 0) ranks.insert(p.rank);
    if ((!f.rank || p.rank == *f.rank) && (!f.pid || p.pid == *f.pid)) kept.push_back(std::move(p));
  }
  if (!kept.empty()) return kept;
  if (f.job && !jobs.count(*f.job)) {
    std::string known;
    for (const auto& j : jobs) known += (known.empty() ? "" : ", ") + j;
    return Error{"report: no job '" + *f.job + "' in " + where + (jobs.empty() ? " (it names no job)" : " (its jobs: " + known + ")")};
  }
  std::string what = f.rank && f.pid ? "process " + std::to_string(*f.pid) + " of rank " + std::to_string(*f.rank)
                     : f.rank       ? "process of rank " + std::to_string(*f.rank)
                                    : "process " + std::to_string(*f.pid);
  std::string known;
  if (f.rank) {
    known = ranks.empty() ? " (it has no ranked processes)"
                          : " (its ranks: " + std::to_string(*ranks.begin()) +
                                (ranks.size() > 1 ? ".." + std::to_string(*ranks.rbegin()) : "") + ")";
  }
  return Error{"report: no " + what + " in " + (f.job ? "job '" + *f.job + "' of " : "") + where + known};
}

// A collector's trace of the ranks of `procs` (the processes the filters keep) over the span of `f`:
// its GET /api/v1/timeline, which reads each rank's rows for the span (the export carries profiles,
// not timelines), for the job of --job, else the job with the most ranks. A trace holds at most kMaxSpanNs of rank time
// (one rank's hour, six ranks' default 10 minutes): the size the span's bound is set by, about what
// a trace viewer opens; more ranks are asked for with --rank or a shorter span.
Result<std::string> remote_trace(std::string server, const std::string& token,
                                 const std::vector<store::ProcessInfo>& procs, const store::ProfileFilter& f) {
  std::set<int> ranks;
  for (const auto& p : procs) {
    if (p.rank >= 0) ranks.insert(p.rank);
  }
  if (ranks.empty()) return Error{"report: " + server + " holds no ranked processes here: a trace is of training ranks"};
  const uint64_t span = f.from_ns && f.to_ns ? *f.to_ns - *f.from_ns : server::kDefaultSpanNs;
  if (ranks.size() > 1 && ranks.size() * span > server::kMaxSpanNs)
    return Error{"report: a trace holds at most 1h of rank time; " + std::to_string(ranks.size()) + " ranks x " +
                 std::to_string(span / 1'000'000'000) + " s is more: give --rank R, or a shorter span (--last)"};
  std::string path = "/api/v1/timeline?ranks=";
  for (int r : ranks) path += std::to_string(r) + (r == *ranks.rbegin() ? "" : ",");
  if (f.job) path += "&job=" + httplib::detail::encode_query_param(*f.job);
  if (f.from_ns) path += "&from=" + std::to_string(*f.from_ns);
  if (f.to_ns) path += "&to=" + std::to_string(*f.to_ns);
  return store::remote_get(server, token, path);
}

Result<report::TimelineData> load_timeline(store::Reader& st, const store::ProfileFilter& f) {
  report::TimelineData d;
  auto procs = st.processes();
  if (!procs) return procs.error();
  // The rank filter picks processes; everything else filters by process, (node, pid): pids repeat
  // across nodes in a collector's store.
  std::optional<std::set<std::pair<std::string, uint32_t>>> keep;
  if (f.pid || f.rank || f.job) {
    keep.emplace();
    for (const auto& p : *procs) {
      if ((f.node && p.node != *f.node) || (f.job && p.job != *f.job)) continue;
      if ((!f.pid && !f.rank) || (f.pid && p.pid == *f.pid) || (f.rank && p.rank == *f.rank)) keep->insert({p.node, p.pid});
    }
  }
  auto wanted = [&](const std::string& node, uint32_t pid) { return !keep || keep->count({node, pid}) > 0; };
  d.processes = *procs;
  auto comms = st.communicators();
  auto hz = st.sample_hz();
  if (!comms) return comms.error();
  if (!hz) return hz.error();
  for (auto& c : *comms) if (wanted(c.node, c.pid)) d.communicators.push_back(std::move(c));
  if (keep) {
    for (const auto& [node, pid] : *keep) {
      if (auto read = report::append_process(st, node, pid, d, f.from_ns, f.to_ns); !read) return read.error();
    }
  } else if (f.from_ns || f.to_ns) {
    // Every process's rows of the span, by the tables' time indexes.
    store::RowQuery q;
    q.from_ns = f.from_ns;
    q.to_ns = f.to_ns;
    if (auto read = report::append_rows(st, std::move(q), d); !read) return read.error();
  } else {
    auto colls = st.collectives();
    auto dev = st.device_activity();
    auto steps = st.steps();
    auto threads = st.thread_windows();
    auto counters = st.metrics("os.");
    if (!colls) return colls.error();
    if (!dev) return dev.error();
    if (!steps) return steps.error();
    if (!threads) return threads.error();
    if (!counters) return counters.error();
    d.collectives = std::move(*colls);
    d.device = std::move(*dev);
    d.steps = std::move(*steps);
    report::add_threads(*threads, d);
    d.counters = std::move(*counters);
  }
  d.sample_hz = *hz ? *hz : 99;
  return d;
}

}  // namespace

int report_main(std::vector<std::string> argv) {
  CLI::App app{kReportAbout, "report"};
  configure(app, kReportUsage, kReportFooter);
  std::string file, format = "text", output, server, token_file, kind, pid, tid, rank, job;
  store::ProfileFilter filter;
  app.add_option("store", file, "the store to read (a file that strata record or strata agent -o wrote)")
      ->type_name("FILE.db");
  app.add_option("--server", server, "read from `strata serve` at URL (http://HOST:PORT) instead of a file")
      ->type_name("URL");
  app.add_option("--token-file", token_file, "the collector's bearer token (first line of F)")->type_name("F");
  app.add_option("-f,--format", format, "text (default), folded, pprof or chrome-trace")->type_name("FORMAT");
  app.add_option("-o,--output", output, "where to write (default: stdout; profile.pb.gz, trace.json)")
      ->type_name("OUT");
  app.add_option("--job", job,
                 "only the processes of job J (its TORCHELASTIC_RUN_ID or STRATA_JOB; `strata diagnose` names it): a "
                 "collector holds many jobs, and --rank R is rank R of each")
      ->type_name("J");
  app.add_option("--rank", rank, "only processes of training rank R")->type_name("R");
  app.add_option("--pid", pid, "only process P")->type_name("P");
  app.add_option("--tid", tid, "only thread T")->type_name("T");
  app.add_option("--kind", kind, "oncpu (default) or offcpu samples")->type_name("oncpu|offcpu");
  std::string from_text, to_text, last_text;
  app.add_option("--from", from_text, "only what the file holds from NS on (unix nanoseconds)")->type_name("NS");
  app.add_option("--to", to_text, "only what the file holds before NS (unix nanoseconds)")->type_name("NS");
  app.add_option("--last", last_text, "only the latest DURATION the file holds, up to its latest step (90s, 10m, 2h, 1d)")
      ->type_name("DURATION");
  if (auto done = parse(app, std::move(argv))) return *done;
  for (auto [text, flag, out] : {std::tuple{&from_text, "--from", &filter.from_ns}, std::tuple{&to_text, "--to", &filter.to_ns}}) {
    if (text->empty()) continue;
    auto n = parse_uint(std::string("report: ") + flag, *text, 0, UINT64_MAX);
    if (!n) return fail(n.error().message, 1);
    *out = *n;
  }
  std::optional<uint64_t> last_ns;
  if (!last_text.empty()) {
    auto d = parse_duration("report: --last", last_text);
    if (!d) return fail(d.error().message, 1);
    if (filter.from_ns || filter.to_ns) return fail("report: --last or --from/--to, not both", 1);
    last_ns = *d;
  }
  if (filter.from_ns && filter.to_ns && *filter.from_ns >= *filter.to_ns) return fail("report: --from must come before --to", 1);

  std::string token;
  if (!token_file.empty()) {
    auto t = read_token_file(token_file);
    if (!t) return fail(t.error().message, 1);
    token = *t;
  }
  if (kind == "offcpu") filter.kind = store::CountKind::kOffCpu;
  else if (!kind.empty() && kind != "oncpu") return fail("--kind: expected oncpu or offcpu, got '" + kind + "'", 1);
  for (auto [text, flag] : {std::pair{&pid, "--pid"}, std::pair{&tid, "--tid"}, std::pair{&rank, "--rank"}}) {
    if (text->empty()) continue;
    auto n = parse_uint(flag, *text, 0, 4194304);
    if (!n) return fail(n.error().message, 1);
    if (text == &pid) filter.pid = static_cast<uint32_t>(*n);
    if (text == &tid) filter.tid = static_cast<uint32_t>(*n);
    if (text == &rank) filter.rank = static_cast<int>(*n);
  }
  if (!job.empty()) filter.job = job;
  if (file.empty() == server.empty())
    return fail("report: which store? (strata report FILE.db, or strata report --server URL)", 1);
  if (format != "text" && format != "folded" && format != "pprof" && format != "chrome-trace")
    return fail("report: unknown format '" + format + "' (text, folded, pprof, chrome-trace)", 1);
  // A collector reads a span of at most an hour a request (server/web_api.h read_span), and by
  // default its latest 10 minutes: the same here, said before the read rather than after it.
  if (!server.empty()) {
    if (filter.from_ns && filter.to_ns && *filter.to_ns - *filter.from_ns > server::kMaxSpanNs)
      return fail("report: --server reads at most 1h at a time; ask for a shorter span, or several", 1);
    if (last_ns && *last_ns > server::kMaxSpanNs)
      return fail("report: --server reads at most 1h at a time (--last " + last_text + "); ask for a shorter span, or several", 1);
    if (!last_ns && !filter.from_ns && !filter.to_ns) last_ns = server::kDefaultSpanNs;
  }

  auto st = [&]() -> Result<std::unique_ptr<store::Reader>> {
    if (!server.empty()) return store::Store::open_remote(server, token);
    auto s = store::Store::open_sqlite(file, store::Store::Mode::kReadOnly);
    if (!s) return s.error();
    return std::unique_ptr<store::Reader>(std::move(*s));
  }();
  if (!st) return fail(st.error().message, st.error().exit_code);
  const std::string where = server.empty() ? file : server;
  if (last_ns) {
    auto latest = (*st)->latest_step_ns();
    if (!latest) return fail(latest.error().message, latest.error().exit_code);
    if (*latest) {
      filter.to_ns = **latest + 1;
      filter.from_ns = *filter.to_ns - std::min(*last_ns, *filter.to_ns);
    } else if (!last_text.empty()) {
      return fail("report: --last: " + where + " holds no steps to count back from; give --from/--to", 1);
    }  // else the collector's default span of a store without steps: read whole, as the server does
  }
  if (!server.empty() && filter.from_ns && filter.to_ns)
    std::cerr << "strata: " << server << ": " << (*filter.to_ns - *filter.from_ns) / 1'000'000'000 << " s, from "
              << *filter.from_ns << " to " << *filter.to_ns << " ns (--last, --from/--to for another span)\n";
  if (format == "chrome-trace") {
    if (!server.empty() && (filter.pid || filter.tid))
      return fail("report: --server --format chrome-trace reads ranks: give --rank R, not --pid/--tid", 1);
    auto kept = filtered_processes(**st, filter, where);
    if (!kept) return fail(kept.error().message, kept.error().exit_code);
    if (output.empty()) output = "trace.json";
    // A file's rows are made into the trace here; a collector's trace comes made (its timeline).
    std::optional<report::TimelineData> data;
    std::string made;
    if (server.empty()) {
      auto d = load_timeline(**st, filter);
      if (!d) return fail(d.error().message, 1);
      data = std::move(*d);
    } else {
      auto t = remote_trace(server, token, *kept, filter);
      if (!t) return fail(t.error().message, t.error().exit_code);
      made = std::move(*t);
    }
    std::ofstream f(output);
    if (!f) return fail("cannot write " + output, 1);
    if (data) report::write_chrome_trace(*data, f);
    else f << made;
    f.flush();
    if (!f) return fail("writing " + output + " failed", 1);
    std::cerr << "strata: wrote " << output << " (open it in https://ui.perfetto.dev or chrome://tracing)\n";
    print_fidelity(**st, *kept, "strata: ", std::cerr);
    return 0;
  }
  auto profile = (*st)->load_profile(filter);
  if (!profile) return fail(profile.error().message, profile.error().exit_code);
  auto procs = filtered_processes(**st, filter, where);
  if (!procs) return fail(procs.error().message, procs.error().exit_code);
  if (filter.tid && profile->samples.empty())
    return fail("report: no samples of thread " + std::to_string(*filter.tid) + " in " + where, 1);

  if (format == "pprof") {
    if (output.empty()) output = "profile.pb.gz";
    // Rank, node and job labels by pid; a pid two different processes share (two nodes) gets none.
    std::set<uint32_t> ambiguous;
    for (const auto& pr : *procs) {
      auto [it, added] = profile->processes.try_emplace(pr.pid, report::ProcessLabels{pr.rank, pr.node, pr.job});
      const auto& had = it->second;
      if (!added && (had.rank != pr.rank || had.node != pr.node || had.job != pr.job)) ambiguous.insert(pr.pid);
    }
    for (uint32_t pid : ambiguous) profile->processes.erase(pid);
    if (auto s = report::write_pprof(*profile, output); !s) return fail(s.error().message, 1);
    std::cerr << "strata: wrote " << output << " (" << profile->total() << " samples)\n";
    print_fidelity(**st, *procs, "strata: ", std::cerr);
    return 0;
  }
  std::ofstream file_out;
  if (!output.empty()) {
    file_out.open(output);
    if (!file_out) return fail("cannot write " + output, 1);
  }
  std::ostream& out = output.empty() ? std::cout : file_out;
  if (format == "folded") {
    report::write_folded(*profile, out);
    print_fidelity(**st, *procs, "strata: ", std::cerr);
  } else {
    print_text(**st, *profile, *procs, out);
  }
  out.flush();
  if (!out) return fail("writing " + (output.empty() ? std::string("stdout") : output) + " failed", 1);
  return 0;
}

}  // namespace strata::cli
