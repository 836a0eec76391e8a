#include "server/drilldown.h"

#include <httplib.h>

#include <algorithm>

#include "server/json.h"

namespace strata::server {
namespace {

void reply_error(httplib::Response& res, int status, const std::string& why) {
  res.status = status;
  res.set_content("{\"error\":" + json_str(why) + "}\n", "application/json");
}

// "http://HOST:PORT" -> (HOST, PORT); HOST may be a bracketed IPv6 address.
bool split_url(const std::string& url, std::string& host, int& port) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) return false;
  std::string hp = url.substr(scheme.size());
  auto colon = hp.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  host = hp.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string p = hp.substr(colon + 1);
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return false;
  port = std::stoi(p);
  return port > 0 && port <= 65535 && !host.empty();
}

std::string url_of(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

void AgentPeers::saw(const std::string& agent_id, const std::string& address, const std::string& url,
                     const std::string& credential) {
  std::lock_guard lock(mu_);
  auto it = peers_.find(agent_id);
  if (it != peers_.end()) {
    by_seen_.erase(it->second.seen);
  } else if (peers_.size() >= kMaxAgents && !by_seen_.empty()) {
    peers_.erase(by_seen_.begin()->second);
    by_seen_.erase(by_seen_.begin());
  }
  Peer& p = peers_[agent_id];
  p.address = address;
  p.url = url;
  p.credential = credential;
  p.seen = ++clock_;
  by_seen_[p.seen] = agent_id;
}

std::optional<AgentPeers::Peer> AgentPeers::find(const std::string& agent_id) const {
  std::lock_guard lock(mu_);
  auto it = peers_.find(agent_id);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

size_t AgentPeers::size() const {
  std::lock_guard lock(mu_);
  return peers_.size();
}

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

Result<std::string> drilldown_target(const std::string& url, const std::string& peer,
                                     const std::vector<std::string>& allow) {
  std::string host;
  int port = 0;
  if (!split_url(url, host, port)) return Error{"its drill-down address '" + url + "' is not http://HOST:PORT"};
  if (host == peer) return url_of(host, port);
  if (std::find(allow.begin(), allow.end(), host) != allow.end()) return url_of(host, port);
  if (peer.empty()) return Error{"the address its batches come from is unknown"};
  // The announced host is not where the agent's batches come from: reach the agent where they do.
  return url_of(peer, port);
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
    auto peer = ctx.peers.find(newest->agent_id);
    if (!peer)
      return reply_error(res, 503, "node " + node + "'s agent has sent no batch since this collector started: its "
                                   "address is learnt from its connection (it sends every few seconds)");
    if (peer->url.empty())
      return reply_error(res, 404, "node " + node + "'s agent announces no drill-down address (--listen-metrics off?)");
    if (peer->credential.empty())
      return reply_error(res, 502, "node " + node + "'s agent registered no drill-down credential (an older agent: "
                                   "upgrade it); the collector does not forward its users' token");
    auto target = drilldown_target(peer->url, peer->address, ctx.allow);
    if (!target) return reply_error(res, 502, "node " + node + "'s agent: " + target.error().message);

    // Only the parameters the agent knows go on; it checks their values.
    std::string query;
    for (const char* key : {"pid", "rank", "last", "from_ns", "to_ns", "limit", "kinds"}) {
      if (!req.has_param(key)) continue;
      query += (query.empty() ? "?" : "&") + std::string(key) + "=" +
               httplib::detail::encode_query_param(req.get_param_value(key));
    }
    httplib::Client cli(*target);
    cli.set_connection_timeout(3, 0);
    cli.set_read_timeout(15, 0);
    httplib::Headers headers{{"Authorization", "Bearer " + peer->credential}};
    std::string body;
    bool too_large = false;
    auto r = cli.Get(("/drilldown" + query).c_str(), headers,
                     [&](const char* data, size_t n) {
                       if (body.size() + n > ctx.max_response_bytes) {
                         too_large = true;
                         return false;
                       }
                       body.append(data, n);
                       return true;
                     });
    if (too_large)
      return reply_error(res, 502, "node " + node + "'s agent answered more than " +
                                       std::to_string(ctx.max_response_bytes) + " bytes: ask for less (limit=, last=)");
    if (!r)
      return reply_error(res, 502, "node " + node + "'s agent at " + *target + " did not answer (" +
                                       httplib::to_string(r.error()) + ")");
    res.status = r->status;
    res.set_content(body, r->get_header_value("Content-Type").empty() ? "application/json"
                                                                      : r->get_header_value("Content-Type"));
  });
}

}  // namespace strata::server
