#include <httplib.h>

#include <cctype>
#include <cstdint>
#include <optional>
#include <iostream>
#include <tuple>

#include "cli/cli_app.h"
#include "cli/commands.h"
#include "cli/values.h"
#include "diagnose/engine.h"
#include "diagnose/loader.h"
#include "diagnose/render.h"
#include "store/store.h"

namespace strata::cli {

namespace {
const char* kDiagnoseUsage =
    "usage: strata diagnose (FILE.db | --server URL [--token-file F]) [--job ID] [--json]\n"
    "                       [--last DURATION | --from NS [--to NS]]\n";
const char* kDiagnoseAbout = R"(Says why the recorded training job is slow: which rank (node, link), which layer (comm, GPU, CPU, OS),
which cause and culprit (a process, a function, a GPU, a link), how many ms per step it costs, the
evidence, and what to do. A healthy job gets no finding. The diagnosis compares the job's step time
with its own history and each rank with its peers, layer by layer.
)";
const char* kDiagnoseFooter = "Without a span, the latest 10 minutes of the file are diagnosed, against the 10 minutes before\n"
                              "them as the job's healthy past (when they diagnose healthy); nothing older is read.\n"
                              "Exit codes: 0 diagnosed (healthy or not), 1 bad input (not a strata store, no job in it),\n"
                              "2 environment (collector unreachable).\n";
// Without a span: the latest stretch the file holds, and the one before it as the job's past. Ten
// minutes is a few hundred steps at common step times (enough for the change-point finder and the
// peers' spread) and short enough that a problem that began within it dominates its profiles; the
// cost is that of twenty minutes of data, however long the file ran.
constexpr uint64_t kDefaultLatestNs = 600ull * 1'000'000'000ull;
constexpr uint64_t kDefaultBaselineNs = kDefaultLatestNs;


// The collector's kept diagnosis (GET /api/v1/findings): the server made it, this prints it.
int diagnose_remote(const std::string& server, const std::string& token, const std::string& job, bool json) {
  std::string path = std::string("/api/v1/findings?format=") + (json ? "json" : "text");
  if (!job.empty()) path += "&job=" + httplib::detail::encode_query_param(job);
  // A job nothing was kept for is diagnosed on the first request: the read may take a while.
  auto body = store::remote_get(server, token, path, 120);
  if (!body) return fail("diagnose: " + body.error().message, body.error().exit_code);
  std::cout << *body;
  // JSON: an error is in the body ("no such job"), as the web UI reads it.
  const bool refused = json && body->find("\"error\":") != std::string::npos &&
                       body->find("\"findings\":[]") != std::string::npos && body->find("\"kept\":") == std::string::npos;
  return refused ? 1 : 0;
}

}  // namespace

int diagnose_main(std::vector<std::string> argv) {
  CLI::App app{kDiagnoseAbout, "diagnose"};
  configure(app, kDiagnoseUsage, kDiagnoseFooter);
  std::string file, server, token_file;
  bool json = false;
  diagnose::LoadOptions load;
  app.add_option("store", file, "the store to read (a file that strata record or strata agent -o wrote)")
      ->type_name("FILE.db");
  app.add_option("--job", load.job, "the job to diagnose (default: the one with the most ranks in the latest recording)")
      ->type_name("ID");
  app.add_flag("--json", json,
               R"({"job":..,"findings":[{"scope":"rank|job","rank":..,"node":..,"layer":..,"cause":..,"culprit":..,"lost_ms_per_step":..,"confidence":..,"evidence":[...]}]}; no findings = healthy; job-wide findings have rank -1)");
  app.add_option("--server", server,
                 "the findings `strata serve` at URL (http://HOST:PORT) keeps: it diagnoses every job with new data "
                 "each window; adds the findings' history (first seen, still active or resolved)")
      ->type_name("URL");
  app.add_option("--token-file", token_file, "the collector's bearer token (first line of F)")->type_name("F");
  std::string from_text, to_text;
  app.add_option("--from", from_text,
                 "only what the file holds from NS on (unix nanoseconds): the cost is bounded by the span, not by the file")
      ->type_name("NS");
  app.add_option("--to", to_text, "only what the file holds before NS (unix nanoseconds)")->type_name("NS");
  std::string last_text;
  app.add_option("--last", last_text,
                 "the latest DURATION the file holds (90s, 10m, 2h, 1d), against the same length before it as the "
                 "job's healthy past (default 10m)")
      ->type_name("DURATION");
  if (auto done = parse(app, std::move(argv))) return *done;
  for (auto [text, flag, out] : {std::tuple{&from_text, "--from", &load.from_ns}, std::tuple{&to_text, "--to", &load.to_ns}}) {
    if (text->empty()) continue;
    auto n = parse_uint(std::string("diagnose: ") + flag, *text, 0, UINT64_MAX);
    if (!n) return fail(n.error().message, 1);
    *out = *n;
  }
  std::string token;
  if (!token_file.empty()) {
    auto t = read_token_file(token_file);
    if (!t) return fail(t.error().message, 1);
    token = *t;
  }
  if (file.empty() == server.empty())
    return fail("diagnose: which store? (strata diagnose FILE.db, or strata diagnose --server URL)", 1);

  std::optional<uint64_t> last_ns;
  if (!last_text.empty()) {
    auto d = parse_duration("diagnose: --last", last_text);
    if (!d) return fail(d.error().message, 1);
    last_ns = *d;
    if (load.from_ns || load.to_ns) return fail("diagnose: --last or --from/--to, not both", 1);
  }
  if (!server.empty() && last_ns)
    return fail("diagnose: --last reads a file; the collector diagnoses its latest windows itself", 1);
  if (load.from_ns && load.to_ns && *load.from_ns >= *load.to_ns)
    return fail("diagnose: --from must come before --to", 1);
  if (!server.empty() && (load.from_ns || load.to_ns))
    return fail("diagnose: --from/--to read a file; the collector diagnoses its latest windows itself", 1);
  if (!server.empty()) return diagnose_remote(server, token, load.job, json);
  auto st = store::Store::open_sqlite(file, store::Store::Mode::kReadOnly);
  if (!st) return fail(st.error().message, st.error().exit_code);
  // Every recording of the file: the span decides what is read (a collector's file holds one
  // recording per agent, and a job's ranks span them).
  load.all_recordings = true;
  auto job = load.from_ns || load.to_ns
                 ? diagnose::load_job_window(**st, load)
                 : diagnose::load_latest_with_baseline(**st, load, last_ns.value_or(kDefaultLatestNs),
                                                      last_ns.value_or(kDefaultBaselineNs));
  if (!job) return fail("diagnose: " + job.error().message, job.error().exit_code);
  auto dx = diagnose::diagnose(*job);
  if (json) {
    diagnose::write_json(dx, std::cout);
  } else {
    diagnose::write_text(dx, std::cout);
  }
  return 0;
}

}  // namespace strata::cli
