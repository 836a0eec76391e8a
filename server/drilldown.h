// GET /api/v1/nodes/{node}/drilldown: the collector asks a node's agent for the raw records of its
// flight recorder (each collective, each device activity; DESIGN §2 "detail on demand") and passes
// the answer on. The agent announces where it answers in every batch's health (drilldown_url).
// Query parameters, all optional, are the agent's: pid, rank, last (30s, 5m, ...), from_ns, to_ns,
// limit, kinds (collectives,device).
#pragma once

#include <functional>
#include <mutex>
#include <string>

#include "store/store.h"

namespace httplib {
class Server;
}

namespace strata::server {

struct DrilldownContext {
  store::Store& store;
  std::mutex& store_mu;
  std::string token;  // sent on to the agent (agents and collector share it)
  std::function<void(const std::string&)> count_request;
};

void add_drilldown_api(httplib::Server& svr, DrilldownContext ctx);

// The drilldown_url field of an agent's health JSON; "" when absent.
std::string drilldown_url_of(const std::string& health_json);

}  // namespace strata::server
