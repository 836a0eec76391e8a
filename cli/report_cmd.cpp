#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>

#include "cli/args.h"
#include "cli/commands.h"
#include "report/exporters.h"
#include "store/store.h"

namespace strata::cli {

namespace {
const char* kReportHelp = R"(usage: strata report FILE.db [--rank R] [--pid P] [--tid T] [--kind oncpu|offcpu]
                     [--format text|folded|pprof] [-o OUT]

Prints or exports what a store holds.

formats:
  text      processes, the agent's own cost, and the top functions by self and total samples (default)
  folded    one line per stack, root first: "frame;frame;...;leaf COUNT" (flamegraph.pl input)
  pprof     gzipped profile.proto for go tool pprof, Pyroscope, Parca (written to -o, default profile.pb.gz)

filters:
  --rank R  only processes of training rank R      --pid P  only process P      --tid T  only thread T
)";

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
}

}  // namespace

int report_main(std::vector<std::string> argv) {
  Args args(std::move(argv));
  std::string file, format = "text", output;
  store::ProfileFilter filter;
  while (!args.done()) {
    std::string a = args.next();
    if (a == "-h" || a == "--help") {
      std::cout << kReportHelp;
      return 0;
    }
    if (a == "--format" || a == "-f" || a == "-o" || a == "--output" || a == "--pid" || a == "--tid" ||
        a == "--rank" || a == "--kind") {
      auto v = args.value(a);
      if (!v) return fail(v.error().message, 1);
      if (a == "--format" || a == "-f") {
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
  if (file.empty()) return fail("report: which store? (strata report FILE.db)", 1);
  if (format != "text" && format != "folded" && format != "pprof")
    return fail("report: unknown format '" + format + "' (text, folded, pprof)", 1);

  auto st = store::Store::open_sqlite(file, store::Store::Mode::kReadOnly);
  if (!st) return fail(st.error().message, 1);
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
