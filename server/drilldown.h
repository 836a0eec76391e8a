// GET /api/v1/nodes/{node}/drilldown: the collector asks a node's agent for the raw records of its
// flight recorder (each collective, each device activity; DESIGN §2 "detail on demand") and passes
// the answer on. The agent announces where it answers in every batch's health (drilldown_url) and a
// credential of its own for it (drilldown_credential).
//
// A batch is not trusted to name where the collector connects: the collector connects to the
// address the agent's own connection came from, at the port its drilldown_url names (an agent that
// listens on a wildcard address announces its node's name, and is reached at the address it sends
// from); a URL naming another host is used only when the operator allows that host
// (ServeOptions::drilldown_allow). The collector presents the agent's credential, never its users'
// token, and reads at most max_response_bytes of the answer.
// Query parameters, all optional, are the agent's: pid, rank, last (30s, 5m, ...), from_ns, to_ns,
// limit, kinds (collectives,device).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "store/store.h"

namespace httplib {
class Server;
}

namespace strata::server {

// What the collector learnt of each agent from its connections: in memory only (an agent sends a
// batch every few seconds, so a restarted collector knows it again at once), bounded.
class AgentPeers {
 public:
  struct Peer {
    std::string address;        // the agent's connection's remote address
    std::string url;            // its latest drilldown_url
    std::string credential;     // its latest drilldown_credential
    uint64_t seen = 0;          // order of last sight
  };
  // Agents remembered at most; past it the one not seen longest is forgotten (it has not sent for
  // longest). 100k agents x ~150 bytes is ~15 MB.
  static constexpr size_t kMaxAgents = 100'000;

  void saw(const std::string& agent_id, const std::string& address, const std::string& url,
           const std::string& credential);
  std::optional<Peer> find(const std::string& agent_id) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, Peer> peers_;
  std::map<uint64_t, std::string> by_seen_;  // seen -> agent_id, oldest first
  uint64_t clock_ = 0;
};

struct DrilldownContext {
  store::Ledger& store;  // the agents and their drill-down addresses
  std::mutex& store_mu;
  AgentPeers& peers;
  std::vector<std::string> allow;  // hosts a drilldown_url may name besides the agent's own address
  size_t max_response_bytes = 64u << 20;
  std::function<void(const std::string&)> count_request;
};

void add_drilldown_api(httplib::Server& svr, DrilldownContext ctx);

// The drilldown_url field of an agent's health JSON; "" when absent.
std::string drilldown_url_of(const std::string& health_json);

// Where the collector connects for an agent that announced `url` from a connection at `peer`:
// "http://HOST:PORT", or an error saying why not.
Result<std::string> drilldown_target(const std::string& url, const std::string& peer,
                                     const std::vector<std::string>& allow);

}  // namespace strata::server
