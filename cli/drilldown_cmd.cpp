// `strata drilldown`: the raw records of one node's flight recorder (each collective call, each
// device activity), asked through the collector (GET /api/v1/nodes/{node}/drilldown).
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <cstdio>
#include <iostream>
#include <tuple>

#include "agent/flight_recorder.h"
#include "cli/cli_app.h"
#include "cli/commands.h"
#include "cli/values.h"
#include "store/store.h"

namespace strata::cli {
namespace {

const char* kDrilldownUsage = R"(usage: strata drilldown --server URL --node NODE [--rank R | --pid P]
                        [--last DURATION | --from-ns A --to-ns B] [--kinds collectives,device]
                        [--limit N] [--token-file F] [--json]
)";
const char* kDrilldownAbout = R"(Asks the agent on NODE, through the collector at URL, for the raw records its flight recorder
keeps: every collective call (op, communicator, sequence number, bytes, enter/exit and device
times) and every device activity (kernels, copies) of the last minutes, per process.
)";
const char* kDrilldownFooter = R"(Exit codes: 0 ok, 1 bad input or a refusal (unknown node, bad parameter), 2 collector or agent
unreachable.
)";

double num(const google::protobuf::Struct& s, const char* key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? 0 : it->second.number_value();
}

std::string str(const google::protobuf::Struct& s, const char* key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? "" : it->second.string_value();
}

const google::protobuf::ListValue* list(const google::protobuf::Struct& s, const char* key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() || !it->second.has_list_value() ? nullptr : &it->second.list_value();
}

void print_text(const google::protobuf::Struct& root) {
  double from = num(root, "from_ns"), to = num(root, "to_ns"), now = num(root, "now_ns");
  const auto* procs = list(root, "processes");
  int n = procs ? procs->values_size() : 0;
  std::printf("node %s: %d process(es); records that started from %.1f s ago%s\n", str(root, "node").c_str(), n,
              (now - from) / 1e9, to >= now ? "" : " to a set end");
  if (!procs) return;
  for (const auto& pv : procs->values()) {
    const auto& p = pv.struct_value();
    std::printf("\npid %.0f  rank %.0f  job %s  %s  %s\n", num(p, "pid"), num(p, "rank"), str(p, "job").c_str(),
                str(p, "comm").c_str(), p.fields().at("alive").bool_value() ? "(alive)" : "(exited)");
    if (const auto* cs = list(p, "collectives")) {
      std::printf("  %.0f collective(s) in the window (%d shown, %.0f evicted from the ring before)\n",
                  num(p, "collectives_in_window"), cs->values_size(), num(p, "collectives_evicted"));
      if (cs->values_size() > 0)
        std::printf("  %8s  %-14s %10s  %-16s %10s %9s %9s  %s\n", "seq", "op", "bytes", "comm", "start_s", "host_ms",
                    "device_ms", "completion");
      for (const auto& cv : cs->values()) {
        const auto& c = cv.struct_value();
        double enter = num(c, "enter_ns"), exit = num(c, "exit_ns");
        double dev = num(c, "device_end_ns") > 0 ? (num(c, "device_end_ns") - num(c, "device_start_ns")) / 1e6 : 0;
        std::string comm = str(c, "comm_id").substr(0, 16);
        std::printf("  %8.0f  %-14s %10.0f  %-16s %10.3f %9.3f %9.3f  %s\n", num(c, "seq"),
                    (str(c, "library") + ":" + str(c, "op")).c_str(), num(c, "bytes"), comm.c_str(),
                    (enter - now) / 1e9, (exit - enter) / 1e6, dev, str(c, "completion").c_str());
      }
    }
    if (const auto* ds = list(p, "device")) {
      std::printf("  %.0f device record(s) in the window (%d shown, %.0f evicted)\n", num(p, "device_in_window"),
                  ds->values_size(), num(p, "device_evicted"));
      for (const auto& dv : ds->values()) {
        const auto& d = dv.struct_value();
        std::printf("  %-10s %-32s gpu %.0f stream %.0f %10.3f s %9.3f ms\n", str(d, "kind").c_str(),
                    str(d, "name").substr(0, 32).c_str(), num(d, "device"), num(d, "stream"),
                    (num(d, "start_ns") - now) / 1e9, (num(d, "end_ns") - num(d, "start_ns")) / 1e6);
      }
    }
  }
}

}  // namespace

int drilldown_main(std::vector<std::string> argv) {
  CLI::App app{kDrilldownAbout, "drilldown"};
  configure(app, kDrilldownUsage, kDrilldownFooter);
  std::string server, node, token, token_file, last, from_ns, to_ns, kinds, limit, rank, pid;
  bool json = false;
  app.add_option("--server", server, "the collector (`strata serve`), http://HOST:PORT")->type_name("URL");
  app.add_option("--node", node, "the node whose agent answers (as in /api/v1/nodes)")->type_name("NODE");
  app.add_option("--rank", rank, "one rank (default: every watched process of the node)")->type_name("R");
  app.add_option("--pid", pid, "one process")->type_name("P");
  app.add_option("--last", last, "records that started in the last DURATION: 30s, 5m, 500ms (default 30s)")
      ->type_name("DURATION");
  app.add_option("--from-ns", from_ns, "records that started at or after A, unix nanoseconds (instead of --last)")
      ->type_name("A");
  app.add_option("--to-ns", to_ns, "... and at or before B")->type_name("B");
  app.add_option("--kinds", kinds, "collectives and/or device (default both)")->type_name("K,...");
  app.add_option("--limit", limit, "at most N records per process and kind, the newest (default 10000)")
      ->type_name("N");
  app.add_option("--token-file", token_file, "bearer token of the collector (first line of F)")->type_name("F");
  app.add_flag("--json", json, "print the agent's JSON as it is");
  if (auto done = parse(app, std::move(argv))) return *done;

  for (auto [text, flag, max] : {std::tuple{&rank, "--rank", uint64_t{1u << 22}},
                                 std::tuple{&pid, "--pid", uint64_t{1u << 22}},
                                 std::tuple{&from_ns, "--from-ns", uint64_t{UINT64_MAX}},
                                 std::tuple{&to_ns, "--to-ns", uint64_t{UINT64_MAX}}}) {
    if (text->empty()) continue;
    auto n = parse_uint(flag, *text, 0, max);
    if (!n) return fail(n.error().message, 1);
    *text = std::to_string(*n);
  }
  if (!last.empty() && !agent::parse_duration_ns(last))
    return fail("--last " + last + ": expected a duration such as 30s, 5m, 500ms", 1);
  if (!limit.empty()) {
    auto n = parse_uint("--limit", limit, 1, 1000000);
    if (!n) return fail(n.error().message, 1);
    limit = std::to_string(*n);
  }
  if (!token_file.empty()) {
    auto t = read_token_file(token_file);
    if (!t) return fail(t.error().message, 1);
    token = *t;
  }
  if (server.empty() || node.empty()) return fail("drilldown: give --server URL and --node NODE (see --help)", 1);
  if (!last.empty() && !from_ns.empty()) return fail("drilldown: give --last or --from-ns/--to-ns, not both", 1);
  if (last.empty() && from_ns.empty() && to_ns.empty()) last = "30s";

  std::string query;
  auto add = [&](const char* key, const std::string& v) {
    if (!v.empty()) query += (query.empty() ? "?" : "&") + std::string(key) + "=" + httplib::detail::encode_query_param(v);
  };
  add("rank", rank);
  add("pid", pid);
  add("last", last);
  add("from_ns", from_ns);
  add("to_ns", to_ns);
  add("kinds", kinds);
  add("limit", limit);
  auto body = store::remote_get(server, token, "/api/v1/nodes/" + httplib::detail::encode_query_param(node) + "/drilldown" + query, 30);
  if (!body) return fail("drilldown: " + body.error().message, body.error().exit_code);
  if (json) {
    std::cout << *body;
    return 0;
  }
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(*body, &root).ok())
    return fail("drilldown: the answer is not the agent's JSON (use --json to see it)", 1);
  print_text(root);
  return 0;
}

}  // namespace strata::cli
