#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "cli/args.h"
#include "cli/commands.h"
#include "report/chrome_trace.h"
#include "report/exporters.h"
#include "report/os_table.h"
#include "store/store.h"

namespace strata::cli {

namespace {
const char* kReportHelp = R"(usage: strata report (FILE.db | --server URL [--token-file F]) [--rank R] [--pid P] [--tid T] [--kind oncpu|offcpu]
                     [--format text|folded|pprof|chrome-trace] [-o OUT]

Prints or exports what a store holds.

formats:
  text      processes, the agent's own cost, and the top functions by self and total samples (default)
  folded    one line per stack, root first: "frame;frame;...;leaf COUNT" (flamegraph.pl input)
  pprof     gzipped profile.proto for go tool pprof, Pyroscope, Parca (written to -o, default profile.pb.gz)
  chrome-trace  Trace Event JSON for Perfetto / chrome://tracing: a process per rank with its CPU
            threads, GPU streams, communicators and steps (written to -o, default trace.json)

from a collector:
  --server URL      read from `strata serve` at URL (http://HOST:PORT) instead of a file
  --token-file F    its bearer token (first line of F)

filters:
  --rank R  only processes of training rank R      --pid P  only process P      --tid T  only thread T
)";

// The OS layer's metrics per process (rank), after the profile (report/os_table.h).
void print_os_metrics(store::Store& st, const std::vector<store::ProcessInfo>& procs, std::ostream& out) {
  auto rows = st.metrics("os.");
  if (!rows || rows->empty()) return;
  std::vector<report::OsProcess> ps;
  for (const auto& p : procs) ps.push_back({p.pid, p.rank, p.comm});
  std::vector<report::OsMetricRow> rs;
  for (const auto& r : *rows) rs.push_back({r.metric.pid, r.metric.name, r.metric.label, r.metric.value});
  out << "\n";
  report::write_os_table(ps, rs, out);
}

void print_text(store::Store& st, const report::Profile& p, std::ostream& out) {
  auto rec = st.latest_recording();
  auto procs = st.processes();
  if (procs && !procs->empty()) {
    out << "processes:\n";
    std::map<uint32_t, uint64_t> per_pid;
    for (const auto& s : p.samples) per_pid[s.pid] += s.count;
    for (const auto& pr : *procs) {
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
  out << "\n";
  report::write_top(p, out);
  print_os_metrics(st, procs ? *procs : std::vector<store::ProcessInfo>{}, out);
}

Result<report::TimelineData> load_timeline(store::Store& st, const store::ProfileFilter& f) {
  report::TimelineData d;
  auto procs = st.processes();
  if (!procs) return procs.error();
  // The rank filter picks processes; everything else filters by process, (node, pid): pids repeat
  // across nodes in a collector's store.
  std::optional<std::set<std::pair<std::string, uint32_t>>> keep;
  if (f.pid || f.rank) {
    keep.emplace();
    for (const auto& p : *procs) {
      if ((f.node && p.node != *f.node)) continue;
      if ((f.pid && p.pid == *f.pid) || (f.rank && p.rank == *f.rank)) keep->insert({p.node, p.pid});
    }
  }
  auto wanted = [&](const std::string& node, uint32_t pid) { return !keep || keep->count({node, pid}) > 0; };
  d.processes = *procs;
  auto comms = st.communicators();
  auto colls = st.collectives();
  auto dev = st.device_activity();
  auto steps = st.steps();
  auto threads = st.thread_windows();
  auto counters = st.metrics("os.");
  auto hz = st.sample_hz();
  if (!comms) return comms.error();
  if (!colls) return colls.error();
  if (!dev) return dev.error();
  if (!steps) return steps.error();
  if (!threads) return threads.error();
  if (!counters) return counters.error();
  if (!hz) return hz.error();
  for (auto& c : *comms) if (wanted(c.node, c.pid)) d.communicators.push_back(std::move(c));
  for (auto& c : *colls) if (wanted(c.node, c.pid)) d.collectives.push_back(std::move(c));
  for (auto& a : *dev) if (wanted(a.node, a.pid)) d.device.push_back(std::move(a));
  for (auto& s : *steps) if (wanted(s.node, s.pid)) d.steps.push_back(std::move(s));
  for (auto& t : *threads) {
    if (wanted(t.node, t.pid)) d.threads.push_back({t.start_ns, t.end_ns, t.pid, t.tid, t.comm, t.samples, t.node});
  }
  for (auto& m : *counters) if (wanted(m.node, m.metric.pid)) d.counters.push_back(std::move(m));
  d.sample_hz = *hz ? *hz : 99;
  return d;
}

}  // namespace

int report_main(std::vector<std::string> argv) {
  Args args(std::move(argv));
  std::string file, format = "text", output, server, token;
  store::ProfileFilter filter;
  while (!args.done()) {
    std::string a = args.next();
    if (a == "-h" || a == "--help") {
      std::cout << kReportHelp;
      return 0;
    }
    if (a == "--format" || a == "-f" || a == "-o" || a == "--output" || a == "--pid" || a == "--tid" ||
        a == "--rank" || a == "--kind" || a == "--server" || a == "--token-file") {
      auto v = args.value(a);
      if (!v) return fail(v.error().message, 1);
      if (a == "--server") {
        server = *v;
      } else if (a == "--token-file") {
        auto t = read_token_file(*v);
        if (!t) return fail(t.error().message, 1);
        token = *t;
      } else if (a == "--format" || a == "-f") {
        format = *v;
      } else if (a == "-o" || a == "--output") {
        output = *v;
      } else if (a == "--kind") {
        if (*v == "oncpu") filter.kind = store::CountKind::kOnCpu;
        else if (*v == "offcpu") filter.kind = store::CountKind::kOffCpu;
        else return fail("--kind: expected oncpu or offcpu, got '" + *v + "'", 1);
      } else {
        auto n = parse_uint(a, *v, 0, 4194304);
        if (!n) return fail(n.error().message, 1);
        if (a == "--pid") filter.pid = static_cast<uint32_t>(*n);
        if (a == "--tid") filter.tid = static_cast<uint32_t>(*n);
        if (a == "--rank") filter.rank = static_cast<int>(*n);
      }
    } else if (!a.empty() && a[0] == '-') {
      return fail("report: unknown option '" + a + "' (see strata report --help)", 1);
    } else if (file.empty()) {
      file = a;
    } else {
      return fail("report: more than one store given ('" + file + "', '" + a + "')", 1);
    }
  }
  if (file.empty() == server.empty())
    return fail("report: which store? (strata report FILE.db, or strata report --server URL)", 1);
  if (format != "text" && format != "folded" && format != "pprof" && format != "chrome-trace")
    return fail("report: unknown format '" + format + "' (text, folded, pprof, chrome-trace)", 1);

  auto st = server.empty() ? store::Store::open_sqlite(file, store::Store::Mode::kReadOnly)
                           : store::Store::open_remote(server, token);
  if (!st) return fail(st.error().message, st.error().exit_code);
  if (format == "chrome-trace") {
    if (output.empty()) output = "trace.json";
    auto data = load_timeline(**st, filter);
    if (!data) return fail(data.error().message, 1);
    std::ofstream f(output);
    if (!f) return fail("cannot write " + output, 1);
    report::write_chrome_trace(*data, f);
    f.flush();
    if (!f) return fail("writing " + output + " failed", 1);
    std::cerr << "strata: wrote " << output << " (open it in https://ui.perfetto.dev or chrome://tracing)\n";
    return 0;
  }
  auto profile = (*st)->load_profile(filter);
  if (!profile) return fail(profile.error().message, 1);

  if (format == "pprof") {
    if (output.empty()) output = "profile.pb.gz";
    if (auto s = report::write_pprof(*profile, output); !s) return fail(s.error().message, 1);
    std::cerr << "strata: wrote " << output << " (" << profile->total() << " samples)\n";
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
  } else {
    print_text(**st, *profile, out);
  }
  out.flush();
  if (!out) return fail("writing " + (output.empty() ? std::string("stdout") : output) + " failed", 1);
  return 0;
}

}  // namespace strata::cli
