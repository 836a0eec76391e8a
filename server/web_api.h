// The query endpoints the web UI (web/) needs beyond the collector's raw ones, each shaped for one
// view so a page of 1,000 ranks loads in a few requests:
//   GET /api/v1/findings?job=J          the kept diagnosis (DESIGN §8 `diagnose --json`) and the
//                                       findings' history; &format=text: as `strata diagnose` prints
//   GET /api/v1/heatmap?job=J           rank x step matrices: step, collective wait, compute, GPU idle
//   GET /api/v1/diff?job=J&rank=R&kind= folded stacks of rank R beside the sum over its peers;
//                                       &from=NS&to=NS: only the windows that overlap that range
//   GET /api/v1/timeline?job=J&rank=R   the rank's chrome-trace JSON (Perfetto), &download=1 to save
//   GET /api/v1/overhead                the latest recording's own cost (strata record's stats)
#pragma once

#include <functional>
#include <mutex>
#include <string>

#include "server/diagnoser.h"
#include "store/store.h"

namespace httplib {
class Server;
struct Request;
}

namespace strata::server {

struct WebApiContext {
  store::Store& store;
  std::mutex& store_mu;  // held around every store call, as the collector's own routes do
  std::function<void(const std::string&)> count_request;
  Diagnoser* diagnoser = nullptr;  // the kept findings; null: none kept
};

void add_web_api(httplib::Server& svr, WebApiContext ctx);

// `from=NS&to=NS` (unix ns, either may be left out) of a profile query (/api/v1/profile, /export,
// /diff): the time range of `f`. An error names the bad parameter.
Status time_range_of(const httplib::Request& req, store::ProfileFilter& f);

}  // namespace strata::server
