#include <cstring>
#include <iostream>
#include <tuple>

#include "agent/recorder.h"
#include "agent/sources.h"
#include "cli/cli_app.h"
#include "cli/commands.h"
#include "cli/values.h"

namespace strata::cli {

namespace {
const char* kRecordUsage =
    "usage: strata record [-F HZ] [-o FILE.db] [--duration S] [--window S] (-p PID[,PID...] | -- CMD [ARGS...])\n";
const char* kRecordAbout = R"(Samples the on-CPU stacks (user and kernel) of a process tree with eBPF: a command started here,
or running processes given by pid; children and threads started later are included.
With -- CMD, strata exits with CMD's status (128+N when a signal N killed it), as time(1) does, so a
job script wrapped in it still sees the job fail.
)";
const char* kRecordFooter = R"(Needs root, or CAP_BPF + CAP_PERFMON. Exit codes: 0 ok, 1 bad input, 2 environment; with -- CMD,
CMD's own status once it ran.
)";
}  // namespace

int fail(const std::string& message, int code) {
  std::cerr << "strata: " << message << "\n";
  return code;
}

int record_main(std::vector<std::string> argv) {
  CLI::App app{kRecordAbout, "record"};
  configure(app, kRecordUsage, kRecordFooter);
  std::string hz, duration, window, layers, unwind_mb;
  std::vector<std::string> pid_lists;
  agent::RecordOptions opts;
  app.add_option("-F,--freq", hz, "sampling frequency per CPU (default 99, at most 1000)")->type_name("HZ");
  std::string budget;
  app.add_option("--budget", budget,
                 "the agent's cost budget, in percent of the watched processes' CPU (at least one core's worth): over it the agent steps down (half, then a quarter of the sampling rate and of the off-CPU stack captures, then CFI unwinding off), keeping a step only if it cut a fifth of the cost; 0: no budget (default 0.2)")
      ->type_name("PCT");
  app.add_option("-o,--output", opts.output, "store to write (default strata.db); an existing strata store gets a new recording")
      ->type_name("FILE.db");
  app.add_option("--duration", duration, "stop after S seconds (the command keeps running)")->type_name("S");
  app.add_option("--window", window, "aggregation window in seconds (default 10)")->type_name("S");
  app.add_option("--layers", layers, "what to record: cpu (on-CPU stacks), offcpu, os, gpu, comm, or all (default all)")
      ->type_name("L,...");
  app.add_option("--unwind-tables-mb", unwind_mb,
                 "memory for the modules' unwind tables together (CFI rows, by build id; the least recently used are "
                 "dropped and rebuilt when needed); fractions allowed, at least 0.0625 (default 128)")
      ->type_name("N");
  app.add_option("--save-events", opts.save_events,
                 "also write what the pipeline read (kernel events, clocks, /proc reads, GPU device records) to FILE, "
                 "to replay the run through the pipeline without root (tests/unit/replay_test.cpp); zstd-compressed, at most 256 MiB of records")
      ->type_name("FILE");
  app.add_option("--node", opts.node, "node name on the records (default: hostname)")->type_name("NAME");
  app.add_option("-p,--pid", pid_lists, "watch running processes (repeatable)")->type_name("PID[,PID...]")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("CMD", opts.command, "after --: run CMD and watch it until it exits")->option_text("[ARGS...]");
  if (auto done = parse(app, std::move(argv))) return *done;

  if (!budget.empty()) {
    auto v = parse_percent("--budget", budget, 100);
    if (!v) return fail(v.error().message, 1);
    opts.budget_share = *v;
  }
  if (!hz.empty()) {
    auto v = parse_uint("-F", hz, 1, 1000);  // never above ~1 kHz per CPU: the machine locks up
    if (!v) return fail(v.error().message, 1);
    opts.frequency_hz = static_cast<unsigned>(*v);
  }
  for (auto [text, flag, to] : {std::tuple{&duration, "--duration", &opts.duration_s},
                                std::tuple{&window, "--window", &opts.window_s}}) {
    if (text->empty()) continue;
    auto v = parse_seconds(flag, *text);
    if (!v) return fail(v.error().message, 1);
    *to = *v;
  }
  for (const auto& list : pid_lists) {
    auto pids = parse_pid_list(list);
    if (!pids) return fail(pids.error().message, 1);
    opts.pids.insert(opts.pids.end(), pids->begin(), pids->end());
  }
  if (!layers.empty()) {
    auto l = agent::parse_layers(layers);
    if (!l) return fail(l.error().message, 1);
    opts.layers = *l;
  }
  if (!unwind_mb.empty()) {
    auto bytes = parse_mib("--unwind-tables-mb", unwind_mb, 1.0 / 16, 65536);
    if (!bytes) return fail(bytes.error().message, 1);
    opts.unwind_table_bytes = *bytes;
  }
  if (opts.pids.empty() == opts.command.empty())
    return fail("record: give either -p PID[,PID...] or -- CMD [ARGS...] (see strata record --help)", 1);

  auto summary = agent::run_record(opts, std::cerr);
  if (!summary) return fail(summary.error().message, summary.error().exit_code);
  agent::print_summary(*summary, opts.output, std::cerr);
  // CMD's status, as time(1) passes it on: a failed job stays failed under strata record.
  if (summary->command_exit > 0) {
    if (summary->command_signal > 0) {
      // As a shell says it: the signal's name, and the 128+N status passed on.
      std::cerr << "strata: record: " << opts.command[0] << " was killed by signal " << summary->command_signal << " ("
                << strsignal(summary->command_signal) << "); exiting with status " << summary->command_exit << "\n";
    } else {
      std::cerr << "strata: record: " << opts.command[0] << " exited with status " << summary->command_exit << "\n";
    }
    return summary->command_exit;
  }
  return 0;
}

}  // namespace strata::cli
