#include "server/drilldown.h"

#include <httplib.h>

#include "server/json.h"

namespace strata::server {
namespace {

void reply_error(httplib::Response& res, int status, const std::string& why) {
  res.status = status;
  res.set_content("{\"error\":" + json_str(why) + "}\n", "application/json");
}

}  // namespace

std::string drilldown_url_of(const std::string& health_json) {
  const std::string key = "\"drilldown_url\":";
  auto at = health_json.find(key);
  if (at == std::string::npos) return "";
  at = health_json.find('"', at + key.size());
  if (at == std::string::npos) return "";
  auto end = health_json.find('"', at + 1);
  if (end == std::string::npos) return "";
  std::string url = health_json.substr(at + 1, end - at - 1);
  // Only what an agent writes: http://HOST:PORT, no escapes, no path.
  if (url.rfind("http://", 0) != 0 || url.find_first_of("\\ /?#", 7) != std::string::npos) return "";
  return url;
}

void add_drilldown_api(httplib::Server& svr, DrilldownContext ctx) {
  svr.Get(R"(/api/v1/nodes/([^/]+)/drilldown)", [ctx](const httplib::Request& req, httplib::Response& res) {
    ctx.count_request("drilldown");
    const std::string node = req.matches[1];
    std::vector<store::AgentStatus> agents;
    {
      std::lock_guard lock(ctx.store_mu);
      auto a = ctx.store.agents();
      if (!a) return reply_error(res, 503, a.error().message);
      agents = std::move(*a);
    }
    // The node's newest agent: an older one of the same node is a previous run.
    const store::AgentStatus* newest = nullptr;
    for (const auto& a : agents)
      if (a.node == node && (!newest || a.last_seen_ns > newest->last_seen_ns)) newest = &a;
    if (!newest) return reply_error(res, 404, "no agent has reported from node " + node);
    std::string url = drilldown_url_of(newest->health_json);
    if (url.empty())
      return reply_error(res, 404, "node " + node + "'s agent announces no drill-down address (--listen-metrics off?)");

    // Only the parameters the agent knows go on; it checks their values.
    std::string query;
    for (const char* key : {"pid", "rank", "last", "from_ns", "to_ns", "limit", "kinds"}) {
      if (!req.has_param(key)) continue;
      query += (query.empty() ? "?" : "&") + std::string(key) + "=" +
               httplib::detail::encode_query_param(req.get_param_value(key));
    }
    httplib::Client cli(url);
    cli.set_connection_timeout(3, 0);
    cli.set_read_timeout(15, 0);
    httplib::Headers headers;
    if (!ctx.token.empty()) headers.emplace("Authorization", "Bearer " + ctx.token);
    auto r = cli.Get(("/drilldown" + query).c_str(), headers);
    if (!r)
      return reply_error(res, 502, "node " + node + "'s agent at " + url + " did not answer (" +
                                       httplib::to_string(r.error()) + ")");
    res.status = r->status;
    res.set_content(r->body, r->get_header_value("Content-Type").empty() ? "application/json"
                                                                         : r->get_header_value("Content-Type"));
  });
}

}  // namespace strata::server
