#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <iostream>

#include "cli/cli_app.h"
#include "cli/commands.h"
#include "cli/values.h"
#include "common/capabilities.h"
#include "server/server.h"

namespace strata::cli {

namespace {
const char* kServeUsage = R"(usage: strata serve [--store sqlite:FILE.db | --store clickhouse://HOST:PORT/DB]
                    [--listen 127.0.0.1:7878] [--token-file F] [--web-dir DIR]
)";
const char* kServeAbout = R"(The collector: takes batches from `strata agent` (POST /api/v1/ingest), answers the query API
under /api/v1/ (jobs, nodes, processes, profile, metrics, steps, collectives, findings), its own
health at /metrics, and the web UI at /.
)";
const char* kServeFooter =
    "Exit codes: 0 ok, 1 bad input, 2 environment (address in use, store unreachable).\n";

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
  CLI::App app{kServeAbout, "serve"};
  configure(app, kServeUsage, kServeFooter);
  server::ServeOptions opts;
  std::string user, token_file, silent_after, diagnose_every;
  app.add_option("--store", opts.store,
                 "sqlite:FILE.db (default sqlite:strata-server.db) or clickhouse://HOST:PORT/DB (ClickHouse's HTTP "
                 "port, usually 8123). Retention: sqlite:FILE.db?retention_days=N deletes rows older than N days "
                 "(at start, then every 10 minutes, 10,000 rows per table at a time so ingest waits little; "
                 "processes, stacks and recordings stay); &wal_max_mb=M truncates the SQLite write-ahead log "
                 "FILE.db-wal when it passes M MB (default 256; checked every 5 s, in a gap of the diagnosis reads); "
                 "clickhouse://...?retention_days=N drops daily partitions; "
                 "clickhouse://...?cluster=NAME shards the tables over ClickHouse cluster NAME, which several "
                 "collectors may share")
      ->type_name("S");
  app.add_option("--listen", opts.listen, "address to listen on (default 127.0.0.1:7878: loopback only)")
      ->type_name("A");
  app.add_option("--token-file", token_file,
                 "require \"Authorization: Bearer TOKEN\" (first line of F) on every /api/ call")
      ->type_name("F");
  app.add_option("--web-dir", opts.web_dir,
                 "static files for / (default: the web UI built beside this program, BIN/../web, or installed, "
                 "BIN/../share/strata/web; else a placeholder page)")
      ->type_name("DIR");
  app.add_option("--silent-after", silent_after,
                 "call a node silent after S seconds without a batch (default: 3 of its intervals)")
      ->type_name("S");
  app.add_option("--diagnose-every", diagnose_every,
                 "diagnose the jobs that got new data every S seconds and keep the findings (default 2; 0: only "
                 "when the findings are asked for). GET /api/v1/findings and `strata diagnose --server` read the "
                 "kept findings and their history.")
      ->type_name("S");
  app.add_option("--user", user,
                 "run as this user (started as root; the store must be writable by it). The server needs no "
                 "privilege: it drops every capability in any case.")
      ->type_name("NAME");
  if (auto done = parse(app, std::move(argv))) return *done;
  if (!silent_after.empty()) {
    auto s = parse_seconds("--silent-after", silent_after);
    if (!s) return fail(s.error().message, 1);
    opts.silent_after_s = *s;
  }
  if (!diagnose_every.empty()) {
    auto s = diagnose_every == "0" ? Result<double>(0.0) : parse_seconds("--diagnose-every", diagnose_every);
    if (!s) return fail(s.error().message, 1);
    opts.diagnose_every_s = *s;
  }
  if (!token_file.empty()) {
    auto t = read_token_file(token_file);
    if (!t) return fail(t.error().message, 1);
    opts.token = *t;
  }
  // Before anything is printed or dropped: a store we cannot speak is bad input, said in one line.
  if (auto ok = server::check_store_spec(opts.store); !ok) return fail(ok.error().message, ok.error().exit_code);
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
  // Said once the collector listens, so that a collector that cannot start says only why.
  if (!dropped->empty()) opts.startup_notes.push_back("serve: " + *dropped);
  if (geteuid() == 0)
    opts.startup_notes.push_back("serve: warning: running as root (uid 0, no capabilities); --user NAME is safer");
  auto st = server::serve(opts, g_stop, std::cerr);
  if (!st) return fail(st.error().message, st.error().exit_code);
  return 0;
}

}  // namespace strata::cli
