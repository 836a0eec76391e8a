#include <cstring>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "strata_version.h"

namespace {

const char* kUsage = R"(strata: find why distributed training is slow

usage: strata <command> [options]

commands:
  record     sample a process tree with eBPF and write a store (SQLite)
  report     print or export what a store holds (text, folded, pprof, chrome-trace)
  diagnose   say why the job is slow: rank, layer, cause, culprit, ms per step, evidence
  agent      node daemon: find training processes, watch them, ship to a collector
  serve      collector: ingest from agents, store (SQLite or ClickHouse), query API, /metrics
  drilldown  a node agent's raw recent collectives and device records, through the collector

Run `strata <command> --help` for the options of a command.
Exit codes: 0 ok, 1 usage or bad input, 2 environment (permissions, address in use, collector
unreachable); `strata record -- CMD` exits with CMD's status once CMD ran.
)";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
    std::cout << kUsage;
    return args.empty() ? 1 : 0;
  }
  if (args[0] == "--version") {
    std::cout << "strata " << STRATA_VERSION << "\n";
    return 0;
  }
  std::string cmd = args[0];
  args.erase(args.begin());
  try {
    if (cmd == "record") return strata::cli::record_main(args);
    if (cmd == "report") return strata::cli::report_main(args);
    if (cmd == "diagnose") return strata::cli::diagnose_main(args);
    if (cmd == "agent") return strata::cli::agent_main(args);
    if (cmd == "serve") return strata::cli::serve_main(args);
    if (cmd == "drilldown") return strata::cli::drilldown_main(args);
  } catch (const std::exception& e) {
    // Only for the unexpected: recoverable errors travel as Result and are reported by the commands.
    return strata::cli::fail(std::string("internal error: ") + e.what(), 1);
  }
  return strata::cli::fail("unknown command '" + cmd + "' (see strata --help)", 1);
}
