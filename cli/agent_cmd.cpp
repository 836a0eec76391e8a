#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iostream>

#include "agent/daemon/daemon.h"
#include "agent/process_info.h"
#include "agent/sources.h"
#include "cli/args.h"
#include "cli/commands.h"

namespace strata::cli {

namespace {
const char* kAgentHelp = R"(usage: strata agent (--server URL | -o FILE.db) [--node NAME] [--token-file F] [--window S]
                    [--select KEY[=V1,V2...]]... [--listen-metrics ADDR] [--advertise HOST:PORT]
                    [--spool DIR] [--spool-max-mb N]
                    [--unwind-tables-mb N]
                    [-F HZ] [--layers L,...] [--duration S]
       strata agent --pod-env

Runs on a training node: finds training processes by their environment (RANK, WORLD_SIZE,
TORCHELASTIC_RUN_ID or STRATA_JOB set; or every --select term matching), watches them while they
live, and every window ships summaries to a collector (`strata serve`) or writes a local store.

options:
  --server URL        collector, http://HOST:PORT (batches are spooled on disk while it is away)
  -o FILE.db          write a local SQLite store instead
  --node NAME         this node's name on the records (default: hostname)
  --token-file F      bearer token for the collector (first line of F)
  --window S          aggregation and send interval in seconds (default 10)
  --select KEY=V,...  watch processes whose environment has KEY set to one of the values (repeatable)
  --listen-metrics A  serve the agent's health on http://A/metrics (default 127.0.0.1:9465; "off"),
                      and its flight recorder on http://A/drilldown (behind the token)
  --advertise H:P     where the collector reaches /drilldown (default: the --listen-metrics address;
                      the hostname when that is 0.0.0.0)
  --spool DIR         where unsent batches wait (default /var/lib/strata/spool)
  --spool-max-mb N    spool bound; the oldest batches are dropped, and counted, past it (default 256;
                      fractions allowed, at least 0.0625)
  --unwind-tables-mb N  memory for the modules' unwind tables together, least recently used dropped
                      and rebuilt when needed (default 128; fractions allowed, at least 0.0625)
  -F HZ, --layers L   as for strata record
  --duration S        stop after S seconds (default: until SIGINT/SIGTERM)
  --pod-env           print the environment (and host paths to mount) that gives every training
                      container the CUPTI injection, so the agent reads each rank's GPU device
                      timeline; then exit

Needs root, or CAP_BPF + CAP_PERFMON (+ CAP_SYS_PTRACE to read other users' processes).
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
  Args args(std::move(argv));
  agent::daemon::AgentOptions opts;
  std::string spool;
  while (!args.done()) {
    std::string a = args.next();
    if (a == "-h" || a == "--help") {
      std::cout << kAgentHelp;
      return 0;
    }
    if (a == "--pod-env") {
      auto text = agent::daemon::pod_environment();
      if (!text) return fail("agent --pod-env: " + text.error().message, text.error().exit_code);
      std::cout << *text;
      return 0;
    }
    if (a != "--server" && a != "-o" && a != "--output" && a != "--node" && a != "--token-file" && a != "--window" &&
        a != "--select" && a != "--listen-metrics" && a != "--advertise" && a != "--spool" && a != "--spool-max-mb" &&
        a != "--unwind-tables-mb" && a != "-F" && a != "--layers" && a != "--duration")
      return fail("agent: unknown option '" + a + "' (see strata agent --help)", 1);
    auto v = args.value(a);
    if (!v) return fail(v.error().message, 1);
    if (a == "--server") {
      opts.server = *v;
      while (!opts.server.empty() && opts.server.back() == '/') opts.server.pop_back();
    } else if (a == "-o" || a == "--output") {
      opts.output = *v;
    } else if (a == "--node") {
      opts.node = *v;
    } else if (a == "--token-file") {
      auto t = read_token_file(*v);
      if (!t) return fail(t.error().message, 1);
      opts.token = *t;
    } else if (a == "--window" || a == "--duration") {
      auto s = parse_seconds(a, *v);
      if (!s) return fail(s.error().message, 1);
      (a == "--window" ? opts.window_s : opts.duration_s) = *s;
    } else if (a == "--select") {
      auto t = agent::daemon::parse_selector_term(*v);
      if (!t) return fail(t.error().message, 1);
      opts.selector.terms[t->first] = t->second;
    } else if (a == "--listen-metrics") {
      opts.listen_metrics = *v;
    } else if (a == "--advertise") {
      opts.advertise = *v;
    } else if (a == "--spool") {
      spool = *v;
    } else if (a == "--spool-max-mb" || a == "--unwind-tables-mb") {
      auto n = parse_mib(a, *v, 1.0 / 16, 1 << 20);
      if (!n) return fail(n.error().message, 1);
      (a == "--spool-max-mb" ? opts.spool_max_bytes : opts.unwind_table_bytes) = *n;
    } else if (a == "-F") {
      auto hz = parse_uint(a, *v, 1, 1000);
      if (!hz) return fail(hz.error().message, 1);
      opts.frequency_hz = static_cast<unsigned>(*hz);
    } else if (a == "--layers") {
      auto layers = agent::parse_layers(*v);
      if (!layers) return fail(layers.error().message, 1);
      opts.layers = *layers;
    }
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
