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
#include <optional>
#include <string>
#include <vector>

#include "server/diagnoser.h"
#include "store/store.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace strata::server {

class JobProcesses;

struct WebApiContext {
  store::Reader& store;
  std::mutex& store_mu;  // held around every store call, as the collector's own routes do
  std::function<void(const std::string&)> count_request;
  Diagnoser* diagnoser = nullptr;  // the kept findings; null: none kept
  JobProcesses* processes = nullptr;  // job_processes of `store`, kept; null: read per request
  store::Ledger* ledger = nullptr;  // `store`'s kept diagnoses (where a job's default span ends); null: none
};

void add_web_api(httplib::Server& svr, WebApiContext ctx);

// The store's processes as the collector's pages show them: a job whose ranks have no RANK in their
// environment (torch.multiprocessing.spawn) gets the ranks and name the diagnosis gives it
// (diagnose::processes_with_ranks), where the tree has the diagnosis. Called with the store lock held.
Result<std::vector<store::ProcessInfo>> job_processes(store::Reader& store);

// job_processes of one store, kept until the store's data changes (Reader::data_version): the
// pages ask for it on every request (/jobs, /processes, /heatmap, /diff, /timeline, /fidelity),
// and reading it is a read of every process and, for a job without RANKs, of a minute of steps.
// One entry (the latest), for the store it was made with. Safe from several threads; callers hold
// the store lock around get() as around every store call.
class JobProcesses {
 public:
  explicit JobProcesses(store::Reader& store) : store_(store) {}
  Result<std::vector<store::ProcessInfo>> get();
  // Times get() read the store (tests).
  uint64_t reads() const {
    std::lock_guard lock(mu_);
    return reads_;
  }

 private:
  store::Reader& store_;
  mutable std::mutex mu_;
  std::optional<uint64_t> version_;  // the store's data_version when procs_ was read; none: not kept
  std::vector<store::ProcessInfo> procs_;
  uint64_t reads_ = 0;
};

// `from=NS&to=NS` (unix ns, either may be left out) of a profile query (/api/v1/profile, /export,
// /diff): the time range of `f`. An error names the bad parameter.
Status time_range_of(const httplib::Request& req, store::ProfileFilter& f);

// Every read by time (the pages: heatmap, differential profile, timeline, fidelity notice; the
// profile and the export, so `strata report --server` too) reads a span: asked without one, the
// store's latest kDefaultSpanNs (ending at its latest step), the stretch `strata diagnose` reads by
// default. Ten minutes are hundreds of steps at the usual 0.1-2 s, as many columns as a heatmap
// shows and more than a trace viewer shows readably, and a read bounded by them costs the same in a
// job's first hour and its sixth week (a week of one rank is ~600k steps, with their collectives
// and kernels; of a 1,000-rank job, 600M step rows).
inline constexpr uint64_t kDefaultSpanNs = 10ull * 60 * 1'000'000'000;
// The longest span one request may ask: an hour of one rank at a few hundred kernels and
// collectives a step is ~10^6 events, ~100 MB of trace JSON, about what a trace viewer opens; an
// hour of a 1,000-rank job's steps is 3.6M heatmap cells. A longer stretch is read in several requests.
inline constexpr uint64_t kMaxSpanNs = 60ull * 60 * 1'000'000'000;

// The span a read covers: `from` and `to` (unix ns, at most an hour apart), one of them (the other
// ten minutes away), or neither: the latest ten minutes up to the latest step, of `job` where a job
// is named and `ledger` keeps its diagnoses (a job that ended earlier), else of the store. Never
// the whole history of a job, except in a store without steps (a recording of processes that are
// no training job: no step to count back from, and no job's weeks of history), which is read whole
// as before; the range then stays unset. An error with exit code 2 is the store's (503), else the
// request's (400). Called with the store lock held.
Status read_span(const httplib::Request& req, store::Reader& store, store::Ledger* ledger, const std::string* job,
                 store::ProfileFilter& range);
// The span read (its range once read_span set it), for the reader in the answer's headers
// X-Strata-Span-From-Ns / -To-Ns: a trace's and a heatmap's times are relative. None when unset.
void span_headers(const store::ProfileFilter& range, httplib::Response& res);

// A page of rows is at most this many (`limit=`), so one request never copies a whole table out of
// the store while ingest waits for it: 100k steps or collectives are ~15 MB of JSON.
inline constexpr uint64_t kMaxPageRows = 100'000;
inline constexpr uint64_t kDefaultPageRows = 10'000;
// Node names are at most this long, as in an ingest batch.
inline constexpr size_t kMaxNodeName = 256;
// A job name in a query (`job=`): as long as a node name at most; no job's id is longer.
inline constexpr size_t kMaxJobName = 256;

// `node=N&pid=P&recording=R&from=NS&to=NS&offset=K&limit=L` of a row query (/api/v1/steps,
// /collectives, /metrics, /launch_samples): a pid names a process only together with its node (pids
// repeat across nodes), so a pid without node matches that pid on every node. An error names the
// bad parameter.
Result<store::RowQuery> row_query_of(const httplib::Request& req);
// `node=N`: empty when absent; an error when too long.
Result<std::optional<std::string>> node_of(const httplib::Request& req);

}  // namespace strata::server
