// `strata agent`: the node daemon. Finds training processes by their environment (or a selector)
// and watches them with the node pipeline `strata record` also runs (agent/pipeline.h): every
// layer's sources, per-window aggregation, the cost budget; each window goes to the shipper (to
// `strata serve`) or a local SQLite file. Serves its own health on /metrics and its flight
// recorder on /drilldown.
#pragma once

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "agent/cost_budget.h"
#include "common/result.h"

namespace strata::agent::daemon {

// Which processes to watch: every selector term must match; with no terms, a process is a
// training process when any of RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID, STRATA_JOB is set, or both
// MASTER_ADDR and MASTER_PORT (torch.multiprocessing.spawn's ranks have no RANK).
struct Selector {
  // KEY -> allowed values (empty set: KEY only has to be set).
  std::map<std::string, std::set<std::string>> terms;
  bool matches(const std::map<std::string, std::string>& env) const;
};
// "KEY=V1,V2" or "KEY".
Result<std::pair<std::string, std::set<std::string>>> parse_selector_term(const std::string& text);

struct AgentOptions {
  std::string server;       // http://HOST:PORT; or
  std::string output;       // FILE.db
  std::string node;         // default: hostname
  std::string token;
  std::string spool_dir;    // default: /var/lib/strata/spool-<node> (or $TMPDIR when not writable)
  uint64_t spool_max_bytes = 256ull << 20;
  uint64_t unwind_table_bytes = 128ull << 20;  // CFI tables of all modules together (LRU)
  double window_s = 10;
  double scan_s = 2;        // how often /proc is scanned for new training processes
  double duration_s = 0;    // 0: until SIGINT/SIGTERM
  unsigned frequency_hz = 99;
  double budget_share = CostBudget::kDefaultShare;  // --budget; 0: none
  std::string listen_metrics = "127.0.0.1:9465";  // "" or "off": no /metrics (and no /drilldown)
  std::string advertise;    // HOST:PORT the collector reaches /drilldown at (default: listen_metrics)
  std::set<std::string> layers = {"cpu", "offcpu", "os", "gpu", "comm"};
  Selector selector;
};

struct AgentSummary {
  uint64_t windows = 0;
  uint64_t processes = 0;
  uint64_t samples = 0;
  std::map<std::string, uint64_t> records_sealed;  // per kind, written into batches
  std::map<std::string, uint64_t> records_acked;   // per kind, acknowledged by the server
  std::map<std::string, uint64_t> records_dropped; // per kind, in batches the full spool dropped
  uint64_t batches_sent = 0, batches_pending = 0, batches_dropped = 0, batches_rejected = 0;
  uint64_t bytes_sent = 0;
};

// `strata agent --pod-env`: what a cluster gives every training container so that the agent, which
// never starts the job, still gets each rank's GPU device times: the environment that makes the
// CUDA driver load strata's CUPTI injection at cuInit (the same as `strata record -- CMD` sets), one
// NAME=value a line, then as comments the host paths to mount into the container at the same path
// (the injection library, read-only; the timeline directory the ranks write and the agent reads,
// read-write). An environment error, with the reason, when this install has no injection library.
Result<std::string> pod_environment();

// Runs until `stop` (or the duration); exit-code-2 errors for missing privileges.
Result<AgentSummary> run_agent(const AgentOptions& opts, const std::atomic<bool>& stop, std::ostream& log);

}  // namespace strata::agent::daemon
