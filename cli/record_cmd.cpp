#include <iostream>

#include "agent/recorder.h"
#include "agent/sources.h"
#include "cli/args.h"
#include "cli/commands.h"

namespace strata::cli {

namespace {
const char* kRecordHelp = R"(usage: strata record [-F HZ] [-o FILE.db] [--duration S] [--window S] (-p PID[,PID...] | -- CMD [ARGS...])

Samples the on-CPU stacks (user and kernel) of a process tree with eBPF: a command started here,
or running processes given by pid; children and threads started later are included.

options:
  -F HZ            sampling frequency per CPU (default 99, at most 1000)
  -o FILE.db       store to write (default strata.db); an existing strata store gets a new recording
  --duration S     stop after S seconds (the command keeps running)
  --window S       aggregation window in seconds (default 10)
  --layers L,...   what to record: cpu (on-CPU stacks), offcpu, os, gpu, comm, or all (default all)
  --unwind-tables-mb N
                   memory for the modules' unwind tables together (CFI rows, by build id; the
                   least recently used are dropped and rebuilt when needed); fractions allowed,
                   at least 0.0625 (default 128)
  -p PID[,PID]     watch running processes
  -- CMD ARGS...   run CMD and watch it until it exits

Needs root, or CAP_BPF + CAP_PERFMON. Exit codes: 0 ok, 1 bad input, 2 environment.
)";
}  // namespace

int fail(const std::string& message, int code) {
  std::cerr << "strata: " << message << "\n";
  return code;
}

int record_main(std::vector<std::string> argv) {
  Args args(std::move(argv));
  agent::RecordOptions opts;
  while (!args.done()) {
    std::string a = args.next();
    if (a == "-h" || a == "--help") {
      std::cout << kRecordHelp;
      return 0;
    } else if (a == "-F" || a == "--freq") {
      auto v = args.value(a);
      if (!v) return fail(v.error().message, 1);
      auto hz = parse_uint(a, *v, 1, 1000);  // never above ~1 kHz per CPU: the machine locks up
      if (!hz) return fail(hz.error().message, 1);
      opts.frequency_hz = static_cast<unsigned>(*hz);
    } else if (a == "-o" || a == "--output") {
      auto v = args.value(a);
      if (!v) return fail(v.error().message, 1);
      opts.output = *v;
    } else if (a == "--duration" || a == "--window") {
      auto v = args.value(a);
      if (!v) return fail(v.error().message, 1);
      auto s = parse_seconds(a, *v);
      if (!s) return fail(s.error().message, 1);
      (a == "--duration" ? opts.duration_s : opts.window_s) = *s;
    } else if (a == "-p" || a == "--pid") {
      auto v = args.value(a);
      if (!v) return fail(v.error().message, 1);
      auto pids = parse_pid_list(*v);
      if (!pids) return fail(pids.error().message, 1);
      opts.pids.insert(opts.pids.end(), pids->begin(), pids->end());
    } else if (a == "--layers") {
      auto v = args.value(a);
      if (!v) return fail(v.error().message, 1);
      auto layers = agent::parse_layers(*v);
      if (!layers) return fail(layers.error().message, 1);
      opts.layers = *layers;
    } else if (a == "--unwind-tables-mb") {
      auto v = args.value(a);
      if (!v) return fail(v.error().message, 1);
      auto bytes = parse_mib(a, *v, 1.0 / 16, 65536);
      if (!bytes) return fail(bytes.error().message, 1);
      opts.unwind_table_bytes = *bytes;
    } else if (a == "--node") {
      auto v = args.value(a);
      if (!v) return fail(v.error().message, 1);
      opts.node = *v;
    } else if (a == "--") {
      opts.command = args.rest();
    } else {
      return fail("record: unknown option '" + a + "' (see strata record --help)", 1);
    }
  }
  if (opts.pids.empty() == opts.command.empty())
    return fail("record: give either -p PID[,PID...] or -- CMD [ARGS...] (see strata record --help)", 1);

  auto summary = agent::run_record(opts, std::cerr);
  if (!summary) return fail(summary.error().message, summary.error().exit_code);
  agent::print_summary(*summary, opts.output, std::cerr);
  return 0;
}

}  // namespace strata::cli
