#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <iostream>

#include "cli/args.h"
#include "common/capabilities.h"
#include "cli/commands.h"
#include "server/server.h"

namespace strata::cli {

namespace {
const char* kServeHelp = R"(usage: strata serve [--store sqlite:FILE.db | --store clickhouse://HOST:PORT/DB]
                    [--listen 127.0.0.1:7878] [--token-file F] [--web-dir DIR]

The collector: takes batches from `strata agent` (POST /api/v1/ingest), answers the query API
under /api/v1/ (jobs, nodes, processes, profile, metrics, steps, collectives, findings), its own
health at /metrics, and the web UI at /.

options:
  --store S         sqlite:FILE.db (default sqlite:strata-server.db) or clickhouse://HOST:PORT/DB
                    (ClickHouse's HTTP port, usually 8123)
  --listen A        address to listen on (default 127.0.0.1:7878: loopback only)
  --token-file F    require "Authorization: Bearer TOKEN" (first line of F) on every /api/ call
  --web-dir DIR     static files for / (default: the web UI built beside this program,
                    BIN/../web or BIN/../share/strata/web; else a placeholder page)
  --silent-after S  call a node silent after S seconds without a batch (default: 3 of its intervals)
  --diagnose-every S  diagnose the jobs that got new data every S seconds and keep the findings
                    (default 2; 0: only when the findings are asked for). GET /api/v1/findings and
                    `strata diagnose --server` read the kept findings and their history.
  --user NAME       run as this user (started as root; the store must be writable by it). The
                    server needs no privilege: it drops every capability in any case.

Exit codes: 0 ok, 1 bad input, 2 environment (address in use, store unreachable).
)";

// The web UI the build puts beside the programs (build/bin/strata -> build/web), or an install's.
std::string default_web_dir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  for (const char* rel : {"../web", "../share/strata/web"}) {
    auto dir = exe.parent_path() / rel;
    if (std::filesystem::exists(dir / "index.html", ec)) return std::filesystem::weakly_canonical(dir, ec).string();
  }
  return "";
}

std::atomic<bool> g_stop{false};
void on_stop(int) { g_stop = true; }
}  // namespace

int serve_main(std::vector<std::string> argv) {
  Args args(std::move(argv));
  server::ServeOptions opts;
  std::string user;
  while (!args.done()) {
    std::string a = args.next();
    if (a == "-h" || a == "--help") {
      std::cout << kServeHelp;
      return 0;
    }
    if (a != "--store" && a != "--listen" && a != "--token-file" && a != "--web-dir" && a != "--silent-after" &&
        a != "--user" && a != "--diagnose-every")
      return fail("serve: unknown option '" + a + "' (see strata serve --help)", 1);
    auto v = args.value(a);
    if (!v) return fail(v.error().message, 1);
    if (a == "--store") {
      opts.store = *v;
    } else if (a == "--listen") {
      opts.listen = *v;
    } else if (a == "--web-dir") {
      opts.web_dir = *v;
    } else if (a == "--user") {
      user = *v;
    } else if (a == "--silent-after") {
      auto s = parse_seconds(a, *v);
      if (!s) return fail(s.error().message, 1);
      opts.silent_after_s = *s;
    } else if (a == "--diagnose-every") {
      auto s = *v == "0" ? Result<double>(0.0) : parse_seconds(a, *v);
      if (!s) return fail(s.error().message, 1);
      opts.diagnose_every_s = *s;
    } else {
      auto t = read_token_file(*v);
      if (!t) return fail(t.error().message, 1);
      opts.token = *t;
    }
  }
  if (opts.web_dir.empty()) opts.web_dir = default_web_dir();
  struct sigaction sa{};
  sa.sa_handler = on_stop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Nothing the collector does needs privilege (the token file is read already): give it all up
  // before the first byte from the network arrives.
  auto dropped = caps::drop_all_privileges(user);
  if (!dropped) return fail("serve: " + dropped.error().message, 2);
  if (!dropped->empty()) std::cerr << "strata: serve: " << *dropped << "\n";
  if (geteuid() == 0) std::cerr << "strata: serve: warning: running as root (uid 0, no capabilities); --user NAME is safer\n";
  auto st = server::serve(opts, g_stop, std::cerr);
  if (!st) return fail(st.error().message, st.error().exit_code);
  return 0;
}

}  // namespace strata::cli
