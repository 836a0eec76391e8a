#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <tuple>

#include "agent/daemon/daemon.h"
#include "agent/process_info.h"
#include "agent/sources.h"
#include "cli/cli_app.h"
#include "cli/commands.h"
#include "cli/values.h"

namespace strata::cli {

namespace {
const char* kAgentUsage = R"(usage: strata agent (--server URL | -o FILE.db) [--node NAME] [--token-file F] [--window S]
                    [--select KEY[=V1,V2...]]... [--listen-metrics ADDR] [--advertise HOST:PORT]
                    [--spool DIR] [--spool-max-mb N]
                    [--unwind-tables-mb N]
                    [-F HZ] [--layers L,...] [--duration S]
       strata agent --pod-env
)";
const char* kAgentAbout = R"(Runs on a training node: finds training processes by their environment (RANK, WORLD_SIZE,
TORCHELASTIC_RUN_ID or STRATA_JOB set, or MASTER_ADDR with MASTER_PORT; or every --select term
matching), watches them while they
live, and every window ships summaries to a collector (`strata serve`) or writes a local store.
)";
const char* kAgentFooter = R"(Needs root, or CAP_BPF + CAP_PERFMON (+ CAP_SYS_PTRACE to read other users' processes).
Exit codes: 0 ok, 1 bad input, 2 environment.
)";

std::atomic<bool> g_stop{false};
void on_stop(int) { g_stop = true; }

}  // namespace

Result<std::string> read_token_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) return Error{"--token-file " + path + ": cannot read it"};
  std::string token;
  std::getline(f, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) token.pop_back();
  if (token.empty()) return Error{"--token-file " + path + ": the first line is empty"};
  return token;
}

int agent_main(std::vector<std::string> argv) {
  CLI::App app{kAgentAbout, "agent"};
  configure(app, kAgentUsage, kAgentFooter);
  agent::daemon::AgentOptions opts;
  std::string spool, token_file, window, duration, spool_mb, unwind_mb, hz, layers;
  std::vector<std::string> selects;
  app.add_option("--server", opts.server, "collector, http://HOST:PORT (batches are spooled on disk while it is away)")
      ->type_name("URL");
  app.add_option("-o,--output", opts.output, "write a local SQLite store instead")->type_name("FILE.db");
  app.add_option("--node", opts.node, "this node's name on the records (default: hostname)")->type_name("NAME");
  app.add_option("--token-file", token_file, "bearer token for the collector (first line of F)")->type_name("F");
  app.add_option("--window", window, "aggregation and send interval in seconds (default 10)")->type_name("S");
  app.add_option("--select", selects,
                 "watch processes whose environment has KEY set to one of the values (repeatable)")
      ->type_name("KEY=V,...")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--listen-metrics", opts.listen_metrics,
                 "serve the agent's health on http://A/metrics (default 127.0.0.1:9465; \"off\"), and its flight "
                 "recorder on http://A/drilldown (behind the token)")
      ->type_name("A");
  app.add_option("--advertise", opts.advertise,
                 "where the collector reaches /drilldown (default: the --listen-metrics address; the hostname when "
                 "that is 0.0.0.0)")
      ->type_name("H:P");
  app.add_option("--spool", spool, "where unsent batches wait (default /var/lib/strata/spool)")->type_name("DIR");
  app.add_option("--spool-max-mb", spool_mb,
                 "spool bound; the oldest batches are dropped, and counted, past it (default 256; fractions allowed, "
                 "at least 0.0625)")
      ->type_name("N");
  app.add_option("--unwind-tables-mb", unwind_mb,
                 "memory for the modules' unwind tables together, least recently used dropped and rebuilt when "
                 "needed (default 128; fractions allowed, at least 0.0625)")
      ->type_name("N");
  app.add_option("-F,--freq", hz, "sampling frequency per CPU, as for strata record (default 99)")->type_name("HZ");
  std::string budget;
  app.add_option("--budget", budget,
                 "the agent's cost budget, in percent of the watched processes' CPU (at least one core's worth): over it the agent steps down (half, then a quarter of the sampling rate and of the off-CPU stack captures, then CFI unwinding off), keeping a step only if it cut a fifth of the cost; 0: no budget (default 0.2)")
      ->type_name("PCT");
  app.add_option("--layers", layers, "what to record, as for strata record (default all)")->type_name("L,...");
  app.add_option("--duration", duration, "stop after S seconds (default: until SIGINT/SIGTERM)")->type_name("S");
  bool pod_env = false;
  app.add_flag("--pod-env", pod_env,
               "print the environment (and host paths to mount) that gives every training container the CUPTI "
               "injection, so the agent reads each rank's GPU device timeline; then exit");
  if (auto done = parse(app, std::move(argv))) return *done;
  if (pod_env) {
    auto text = agent::daemon::pod_environment();
    if (!text) return fail("agent --pod-env: " + text.error().message, text.error().exit_code);
    std::cout << *text;
    return 0;
  }

  while (!opts.server.empty() && opts.server.back() == '/') opts.server.pop_back();
  if (!token_file.empty()) {
    auto t = read_token_file(token_file);
    if (!t) return fail(t.error().message, 1);
    opts.token = *t;
  }
  for (auto [text, flag, to] : {std::tuple{&window, "--window", &opts.window_s},
                                std::tuple{&duration, "--duration", &opts.duration_s}}) {
    if (text->empty()) continue;
    auto s = parse_seconds(flag, *text);
    if (!s) return fail(s.error().message, 1);
    *to = *s;
  }
  for (const auto& term : selects) {
    auto t = agent::daemon::parse_selector_term(term);
    if (!t) return fail(t.error().message, 1);
    opts.selector.terms[t->first] = t->second;
  }
  for (auto [text, flag, to] : {std::tuple{&spool_mb, "--spool-max-mb", &opts.spool_max_bytes},
                                std::tuple{&unwind_mb, "--unwind-tables-mb", &opts.unwind_table_bytes}}) {
    if (text->empty()) continue;
    auto n = parse_mib(flag, *text, 1.0 / 16, 1 << 20);
    if (!n) return fail(n.error().message, 1);
    *to = *n;
  }
  if (!budget.empty()) {
    auto v = parse_percent("--budget", budget, 100);
    if (!v) return fail(v.error().message, 1);
    opts.budget_share = *v;
  }
  if (!hz.empty()) {
    auto v = parse_uint("-F", hz, 1, 1000);
    if (!v) return fail(v.error().message, 1);
    opts.frequency_hz = static_cast<unsigned>(*v);
  }
  if (!layers.empty()) {
    auto l = agent::parse_layers(layers);
    if (!l) return fail(l.error().message, 1);
    opts.layers = *l;
  }
  if (opts.server.empty() == opts.output.empty())
    return fail("agent: give either --server URL or -o FILE.db (see strata agent --help)", 1);
  if (opts.window_s < 0.5) return fail("--window: at least 0.5 seconds", 1);
  std::string node = opts.node.empty() ? agent::node_name() : opts.node;
  // One spool per node name: two agents on one machine (tests, or two --node views) never share.
  opts.spool_dir = spool.empty() ? "/var/lib/strata/spool/" + node : spool;

  struct sigaction sa{};
  sa.sa_handler = on_stop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a collector that hangs up must not kill the agent

  auto s = agent::daemon::run_agent(opts, g_stop, std::cerr);
  if (!s) return fail(s.error().message, s.error().exit_code);
  std::cerr << "strata: agent: " << s->windows << " window(s), " << s->processes << " process(es), " << s->samples
            << " samples";
  if (!opts.server.empty()) {
    std::cerr << "; batches sent " << s->batches_sent << ", pending " << s->batches_pending << ", dropped "
              << s->batches_dropped << ", rejected " << s->batches_rejected << ", " << s->bytes_sent << " bytes\n";
    // One machine-readable line: rows per kind that the collector acknowledged (tests compare it).
    std::cerr << "strata: agent: acked";
    for (const auto& [k, v] : s->records_acked) std::cerr << " " << k << "=" << v;
    std::cerr << "\nstrata: agent: sealed";
    for (const auto& [k, v] : s->records_sealed) std::cerr << " " << k << "=" << v;
    std::cerr << "\nstrata: agent: dropped";
    for (const auto& [k, v] : s->records_dropped) std::cerr << " " << k << "=" << v;
  }
  std::cerr << "\n";
  return 0;
}

}  // namespace strata::cli
