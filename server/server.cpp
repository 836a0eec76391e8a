#include "server/server.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>
#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "common/listen.h"
#include "common/self_usage.h"
#include "proto/ingest_codec.h"
#include "report/exporters.h"
#include "server/diagnoser.h"
#include "server/drilldown.h"
#include "server/guarded_server.h"
#include "server/ingest_applier.h"
#include "server/json.h"
#include "server/prometheus.h"
#include "server/web_api.h"
#include "store/catalog.h"
#include "strata_version.h"

namespace strata::server {
namespace {

const char* kPlaceholderPage = R"(<!doctype html>
<html><head><meta charset="utf-8"><title>strata</title></head>
<body><h1>strata collector</h1>
<p>The web UI is not installed here. The REST API answers under <code>/api/v1/</code>:
<a href="/api/v1/jobs">jobs</a>, <a href="/api/v1/nodes">nodes</a>, <a href="/api/v1/processes">processes</a>,
<a href="/api/v1/findings">findings</a>; the server's own health is at <a href="/metrics">/metrics</a>.</p>
</body></html>
)";

// Counters for /metrics.
struct ServerCounters {
  std::mutex mu;
  uint64_t batches_applied = 0;
  uint64_t batches_duplicate = 0;
  std::map<std::string, uint64_t> batches_rejected;  // by reason class
  std::map<std::string, uint64_t> rows;              // by kind
  uint64_t bytes_received = 0;
  uint64_t lost_refs = 0;
  double apply_seconds = 0;
  uint64_t apply_groups = 0;  // transactions that applied batches (several batches each when they queue)
  uint64_t unauthorized = 0;
  uint64_t retention_deleted = 0;  // rows past the SQLite store's retention_days, deleted
  uint64_t wal_truncations = 0;         // the SQLite write-ahead log truncated (keep_wal_short)
  uint64_t wal_truncated_bytes = 0;     // ... and what it held then
  uint64_t wal_truncation_failures = 0; // a reader stayed in it: tried again kWalCheckEveryS later
  std::map<std::string, uint64_t> requests;  // by route
  std::map<std::string, prom::Histogram> request_seconds;  // by route
};

// The request this thread handles now (httplib runs each request on one thread from routing to the
// logger): when it started and the route its handler named (count_request), for the histogram.
struct RequestTiming {
  std::chrono::steady_clock::time_point start;
  std::string route = "static";  // files of the web UI, and unknown paths
};
thread_local RequestTiming t_request;

std::string reject_class(const std::string& why) {
  if (why.find("too large") != std::string::npos) return "oversized";
  if (why.find("newer") != std::string::npos) return "version";
  if (why.find("truncated") != std::string::npos) return "truncated";
  return "malformed";
}

std::optional<uint64_t> query_uint(const httplib::Request& req, const char* key) {
  if (!req.has_param(key)) return std::nullopt;
  const std::string v = req.get_param_value(key);
  if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoull(v);
}

// The end of a page of rows: where the next page starts, or null after the last.
std::string page_end(const store::RowQuery& q, size_t rows) {
  const bool full = q.limit && rows >= q.limit;
  return ",\"offset\":" + json_num(q.offset) + ",\"next_offset\":" + (full ? json_num(q.offset + rows) : std::string("null"));
}

// This collector's name among those that share a store: its host and listening port (two on one
// host listen on different ports).
std::string collector_id(const std::string& listen) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  auto colon = listen.rfind(':');
  return std::string(host) + ":" + (colon == std::string::npos ? listen : listen.substr(colon + 1));
}

DiagnoserOptions diagnoser_options(const ServeOptions& opts) {
  DiagnoserOptions d;
  d.every_s = opts.diagnose_every_s;
  d.collector_id = collector_id(opts.listen);
  d.join_grace_ns = static_cast<uint64_t>(std::max(0.0, opts.diagnose_join_grace_s) * 1e9);
  return d;
}

class Server {
 public:
  // `http` is already bound to --listen (bind_listener): the store is opened only once the port is ours.
  Server(const ServeOptions& opts, std::unique_ptr<store::Store> store, std::unique_ptr<GuardedServer> http,
         std::ostream& log)
      : opts_(opts), store_(std::move(store)), applier_(*store_), log_(log),
        diagnoser_(*store_, store_mu_, diagnoser_options(opts), log),
        http_(std::move(http)),
        svr_(*http_) {}

  Status run(const std::atomic<bool>& stop) {
    routes();
    // One more byte than the limit so an oversized body reaches our handler's check... httplib
    // answers 413 itself past this.
    svr_.set_payload_max_length(opts_.max_compressed + 1);
    if (!svr_.widen_backlog()) log_ << "strata: serve: warning: cannot widen the listen backlog: " << std::strerror(errno) << "\n";
    for (const auto& note : opts_.startup_notes) log_ << "strata: " << note << "\n";
    log_ << "strata: serving on http://" << opts_.listen << (opts_.token.empty() ? " (no token: open to anyone who can connect)" : "")
         << "\n";
    // The rounds read through store objects of their own, never under the ingest lock: SQLite
    // connections (WAL lets them read beside the writer; the file exists now, the writer made it),
    // or ClickHouse clients (a round's queries then run beside the agents' inserts; a round on the
    // writer's object held the lock for its whole length and ingest waited). One per job diagnosed
    // at once: the jobs of a round read side by side.
    for (size_t k = 0; k < Diagnoser::kRoundThreads; ++k) {
      if (auto reader = open_store(opts_.store, store::Store::Mode::kReadOnly)) {
        diagnoser_.set_reader(std::move(*reader));
      } else {
        log_ << "strata: serve: diagnosis reads share the writer's connection: " << reader.error().message << "\n";
        break;
      }
    }
    diagnoser_.start();  // a round every --diagnose-every seconds for jobs with new data
    // SQLite retention (sqlite:FILE?retention_days=N): old rows deleted in short batches.
    std::thread retention;
    std::mutex retention_mu;
    std::condition_variable retention_cv;
    bool retention_stop = false;
    if (auto spec = parse_sqlite_spec(opts_.store); spec && spec->retention_days > 0) {
      retention = std::thread([&, days = spec->retention_days] {
        std::unique_lock lock(retention_mu);
        do {
          lock.unlock();
          apply_sqlite_retention(days);
          lock.lock();
        } while (!retention_cv.wait_for(lock, std::chrono::seconds(kRetentionEveryS), [&] { return retention_stop; }));
      });
    }
    // The write-ahead log kept short (kDefaultWalMaxMb): truncated in a gap of the rounds' reads.
    // It checkpoints through a connection of its own, never under the store lock: a collector busy
    // with ingest queues hundreds of batches on that lock, and a gap held while waiting behind them
    // stopped every round (measured at 1,000 nodes). The writer waits for the checkpoint in
    // SQLite's busy handler instead, a copy of what SQLite's own checkpoints left.
    std::thread wal_keeper;
    std::unique_ptr<store::Store> wal_store;
    uint64_t max_bytes = 0;
    if (auto spec = parse_sqlite_spec(opts_.store)) {  // refuses clickhouse://: no log to keep
      max_bytes = uint64_t{spec->wal_max_mb ? spec->wal_max_mb : kDefaultWalMaxMb} << 20;
      if (auto w = store::Store::open_sqlite(spec->path, store::Store::Mode::kCreateOrAppend)) wal_store = std::move(*w);
      else log_ << "strata: serve: the write-ahead log will not be kept short: " << w.error().message << "\n";
    }
    if (wal_store) {
      wal_keeper = std::thread([&, max_bytes] {
        std::unique_lock lock(retention_mu);
        while (!retention_cv.wait_for(lock, std::chrono::seconds(kWalCheckEveryS), [&] { return retention_stop; })) {
          lock.unlock();
          keep_wal_short(*wal_store, max_bytes);
          lock.lock();
        }
      });
    }
    std::atomic<bool> finished{false};
    std::thread watcher([&] {
      while (!stop && !finished) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      diagnoser_.cancel();  // a diagnosis in a request's thread would hold the server's stop
      svr_.stop();
    });
    bool ok = svr_.listen_after_bind();
    finished = true;
    watcher.join();
    {
      std::lock_guard lock(retention_mu);
      retention_stop = true;
    }
    retention_cv.notify_all();
    if (retention.joinable()) retention.join();
    if (wal_keeper.joinable()) wal_keeper.join();
    diagnoser_.stop();
    if (!ok && !stop) return Error{"server stopped unexpectedly"};
    return {};
  }

 private:
  // Truncates the SQLite store's write-ahead log once it holds more than max_bytes, in a gap of the
  // rounds' reads (Diagnoser::reader_gap), through `keeper`, a connection of its own (no store lock:
  // log_bytes is a stat of the file; the writer waits for the checkpoint in SQLite's busy handler).
  void keep_wal_short(store::Store& keeper, uint64_t max_bytes) {
    const uint64_t before = keeper.log_bytes();
    if (before <= max_bytes) return;
    Status st;
    diagnoser_.reader_gap([&] { st = keeper.truncate_log(); });
    std::lock_guard lock(counters_.mu);
    if (st) {
      ++counters_.wal_truncations;
      counters_.wal_truncated_bytes += before;
    } else {
      ++counters_.wal_truncation_failures;
      log_ << "strata: serve: " << st.error().message << "\n";
    }
  }

  // Deletes the rows older than `days` days, kRetentionBatchRows per table at a time, taking the
  // store's lock for one batch only: ingest waits for one batch at most.
  void apply_sqlite_retention(unsigned days) {
    const uint64_t cutoff = wall_clock_ns() - std::min<uint64_t>(wall_clock_ns(), uint64_t{days} * 86400ull * 1'000'000'000ull);
    uint64_t total = 0;
    while (true) {
      Result<uint64_t> n = uint64_t{0};
      {
        std::lock_guard lock(store_mu_);
        n = store_->delete_before(cutoff, kRetentionBatchRows);
      }
      if (!n) {
        log_ << "strata: serve: retention: " << n.error().message << "\n";
        break;
      }
      total += *n;
      if (*n == 0) break;
    }
    if (total > 0) log_ << "strata: serve: retention: deleted " << total << " rows older than " << days << " days\n";
    std::lock_guard lock(counters_.mu);
    counters_.retention_deleted += total;
  }

  bool authorized(const httplib::Request& req) {
    return bearer_authorized(req.get_header_value("Authorization"), opts_.token);
  }

  void count_request(const std::string& route) {
    t_request.route = route;
    std::lock_guard lock(counters_.mu);
    counters_.requests[route]++;
  }

  void observe_request() {
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_request.start).count();
    std::lock_guard lock(counters_.mu);
    counters_.request_seconds.try_emplace(t_request.route, prom::request_buckets()).first->second.observe(dt);
  }

  static void reply_error(httplib::Response& res, int status, const std::string& why) {
    res.status = status;
    res.set_content("{\"error\":" + json_str(why) + "}\n", "application/json");
  }

  // Debian's cpp-httplib (0.11) compresses with brotli at its slowest quality (11) whenever a client
  // accepts br, as every browser does: 0.7 s for the 1,000-rank heatmap (550 KB), 0.2 s for the web
  // UI's script, on every request. gzip does the same in ~30 ms at 25% more bytes (bench/web_render.sh).
  // httplib picks the encoding from the request's Accept-Encoding alone, so drop br from it here,
  // before routing; the request object is httplib's own mutable one, handed to handlers as const.
  static void offer_gzip_only(const httplib::Request& req) {
    auto& headers = const_cast<httplib::Request&>(req).headers;
    auto it = headers.find("Accept-Encoding");
    if (it == headers.end() || it->second.find("br") == std::string::npos) return;
    std::string kept;
    std::stringstream in(it->second);
    for (std::string coding; std::getline(in, coding, ',');) {
      const size_t b = coding.find_first_not_of(' ');
      if (b == std::string::npos || coding.compare(b, 2, "br") == 0) continue;
      kept += (kept.empty() ? "" : ", ") + coding.substr(b);
    }
    it->second = kept;
  }

  void routes() {
    svr_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      t_request = RequestTiming{std::chrono::steady_clock::now()};
      offer_gzip_only(req);
      if (req.path.rfind("/api/", 0) == 0 && !authorized(req)) {
        t_request.route = "unauthorized";
        {
          std::lock_guard lock(counters_.mu);
          counters_.unauthorized++;
        }
        res.set_header("WWW-Authenticate", "Bearer");
        reply_error(res, 401, "missing or wrong bearer token (Authorization: Bearer TOKEN)");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    svr_.Post("/api/v1/ingest", [this](const httplib::Request& req, httplib::Response& res) { ingest(req, res); });
    svr_.Get("/api/v1/jobs", [this](const httplib::Request&, httplib::Response& res) { jobs(res); });
    svr_.Get("/api/v1/nodes", [this](const httplib::Request&, httplib::Response& res) { nodes(res); });
    svr_.Get("/api/v1/processes", [this](const httplib::Request& req, httplib::Response& res) { processes(req, res); });
    svr_.Get("/api/v1/profile", [this](const httplib::Request& req, httplib::Response& res) { profile(req, res); });
    svr_.Get("/api/v1/export", [this](const httplib::Request& req, httplib::Response& res) { export_(req, res); });
    svr_.Get("/api/v1/metrics", [this](const httplib::Request& req, httplib::Response& res) { metrics(req, res); });
    svr_.Get("/api/v1/steps", [this](const httplib::Request& req, httplib::Response& res) { steps(req, res); });
    svr_.Get("/api/v1/collectives", [this](const httplib::Request& req, httplib::Response& res) { collectives(req, res); });
    svr_.Get("/api/v1/launch_samples", [this](const httplib::Request& req, httplib::Response& res) { launch_samples(req, res); });
    // The web UI's views: findings (the diagnosis), heatmap, diff, timeline, overhead (web_api.h).
    add_web_api(svr_, WebApiContext{*store_, store_mu_, [this](const std::string& r) { count_request(r); },
                                    &diagnoser_, &job_processes_, store_.get()});
    // A node agent's flight recorder, asked through the collector (drilldown.h).
    add_drilldown_api(svr_, DrilldownContext{*store_, store_mu_, peers_, opts_.drilldown_allow, opts_.max_drilldown_bytes,
                                             [this](const std::string& r) { count_request(r); }});
    svr_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      count_request("prometheus");
      prometheus(res);
    });
    // Called after each response is written, on the thread that handled it.
    svr_.set_logger([this](const httplib::Request&, const httplib::Response&) { observe_request(); });
    bool static_files = !opts_.web_dir.empty() && svr_.set_mount_point("/", opts_.web_dir);
    if (!static_files) {
      svr_.Get("/", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(kPlaceholderPage, "text/html; charset=utf-8");
      });
    }
    svr_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 413) {
        // httplib's own refusals: a body over the payload limit, or a form-encoded body over 8 KB
        // (send batches as application/x-strata-batch+zstd).
        res.set_content("{\"error\":\"request body too large (or sent as a form: use Content-Type application/x-strata-batch+zstd)\"}\n", "application/json");
      } else if (res.status == 404) {
        res.set_content("{\"error\":" + json_str("no such endpoint: " + req.path) + "}\n", "application/json");
      }
    });
  }

  void ingest(const httplib::Request& req, httplib::Response& res) {
    count_request("ingest");
    ingest::DecodeLimits limits{opts_.max_compressed, opts_.max_decompressed, opts_.max_batch_rows};
    auto batch = ingest::decode_batch(req.body, limits);
    Status valid = batch ? validate_batch(*batch) : Status{batch.error()};
    if (!valid) {
      const std::string& why = valid.error().message;
      {
        std::lock_guard lock(counters_.mu);
        counters_.batches_rejected[reject_class(why)]++;
      }
      reply_error(res, why.find("too large") != std::string::npos ? 413 : 400, why);
      return;
    }
    std::string health;
    google::protobuf::util::JsonPrintOptions jo;
    jo.preserve_proto_field_names = true;
    jo.always_print_primitive_fields = true;
    {
      // The agent's drill-down credential stays in memory (peers_), never in the store or the API.
      ingest::AgentHealth shown = batch->health();
      shown.clear_drilldown_credential();
      (void)google::protobuf::util::MessageToJsonString(shown, &health, jo);
    }
    auto t0 = std::chrono::steady_clock::now();
    IngestApplier::GroupItem item{&*batch, &health, wall_clock_ns()};
    {
      std::lock_guard queue(apply_queue_mu_);
      apply_queue_.push_back({&item, batch_rows(*batch)});
    }
    {
      // Whoever holds the store applies what waits, in groups, until its own batch is in: one
      // commit for the batches that queued while the last group was written (kMaxGroupRows).
      // (Holding a ClickHouse transaction open 0.2 s for more to join was measured: the agents'
      // data reached the store 120 s late at 8,000 ranks, against 16 s without.)
      std::lock_guard lock(store_mu_);
      while (!item.done) {
        std::vector<IngestApplier::GroupItem*> group;
        {
          std::lock_guard queue(apply_queue_mu_);
          uint64_t rows = 0;
          while (!apply_queue_.empty() && (group.empty() || rows + apply_queue_.front().rows <= kMaxGroupRows)) {
            rows += apply_queue_.front().rows;
            group.push_back(apply_queue_.front().item);
            apply_queue_.pop_front();
          }
        }
        if (group.empty()) {  // taken by a request that failed before applying it (cannot happen)
          item.out = Error{"the batch was lost from the apply queue"};
          break;
        }
        applier_.apply_group(group);
        std::lock_guard count(counters_.mu);
        counters_.apply_groups++;
      }
    }
    Result<ApplyOutcome>& out = item.out;
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!out) {
      // The store failed (disk full, ClickHouse down): the agent keeps the batch and retries.
      log_ << "strata: serve: cannot apply batch " << batch->batch_id() << " of " << batch->agent_id() << ": "
           << out.error().message << "\n";
      reply_error(res, 503, "store unavailable: " + out.error().message);
      return;
    }
    if (!out->duplicate) diagnoser_.note(*batch);  // its jobs get a diagnosis round
    // Where this agent is reached for drill-down: the address its connection comes from.
    peers_.saw(batch->agent_id(), req.remote_addr, batch->health().drilldown_url(),
               batch->health().drilldown_credential());
    uint64_t rows = 0;
    {
      std::lock_guard lock(counters_.mu);
      counters_.bytes_received += req.body.size();
      counters_.apply_seconds += dt;
      counters_.lost_refs += out->lost_refs;
      if (out->duplicate) {
        counters_.batches_duplicate++;
      } else {
        counters_.batches_applied++;
      }
      for (const auto& [k, v] : out->rows) {
        counters_.rows[k] += v;
        rows += v;
      }
    }
    res.set_content(std::string("{\"status\":\"") + (out->duplicate ? "duplicate" : "applied") +
                        "\",\"batch_id\":" + json_num(batch->batch_id()) + ",\"rows\":" + json_num(rows) + "}\n",
                    "application/json");
  }

  // An agent is silent when it has not sent for three of its own intervals.
  bool silent(const store::AgentStatus& a, uint64_t now) const {
    double after = opts_.silent_after_s > 0 ? opts_.silent_after_s : std::max(5.0, 3 * a.interval_s);
    return now > a.last_seen_ns && static_cast<double>(now - a.last_seen_ns) / 1e9 > after;
  }

  void nodes(httplib::Response& res) {
    count_request("nodes");
    std::vector<store::AgentStatus> agents;
    {
      std::lock_guard lock(store_mu_);
      auto a = store_->agents();
      if (!a) return reply_error(res, 503, a.error().message);
      agents = std::move(*a);
    }
    uint64_t now = wall_clock_ns();
    std::string o = "{\"nodes\":[";
    bool first = true;
    for (const auto& a : agents) {
      o += first ? "" : ",";
      first = false;
      o += "{\"node\":" + json_str(a.node) + ",\"agent_id\":" + json_str(a.agent_id) +
           ",\"last_seen_ns\":" + json_num(a.last_seen_ns) +
           ",\"seconds_since_seen\":" + json_num(static_cast<double>(now - std::min(now, a.last_seen_ns)) / 1e9) +
           ",\"last_batch\":" + json_num(a.last_batch) + ",\"status\":" + json_str(silent(a, now) ? "silent" : "healthy") +
           ",\"health\":" + (a.health_json.empty() ? std::string("null") : a.health_json) + "}";
    }
    res.set_content(o + "]}\n", "application/json");
  }

  void jobs(httplib::Response& res) {
    count_request("jobs");
    std::vector<store::ProcessInfo> procs;
    std::vector<store::AgentStatus> agents;
    {
      std::lock_guard lock(store_mu_);
      auto p = job_processes_.get();
      if (!p) return reply_error(res, 503, p.error().message);
      auto a = store_->agents();
      if (!a) return reply_error(res, 503, a.error().message);
      procs = std::move(*p);
      agents = std::move(*a);
    }
    uint64_t now = wall_clock_ns();
    // A node is silent when its newest agent is.
    std::map<std::string, const store::AgentStatus*> newest;
    for (const auto& a : agents) {
      auto& n = newest[a.node];
      if (!n || a.last_seen_ns > n->last_seen_ns) n = &a;
    }
    struct Job {
      std::set<int> ranks;
      std::set<std::string> nodes;
      int world_size = -1;
      uint64_t processes = 0;
    };
    std::map<std::string, Job> jobs;
    for (const auto& p : procs) {
      if (p.job.empty() && p.rank < 0) continue;  // not a training process
      auto& j = jobs[p.job];
      if (p.rank >= 0) j.ranks.insert(p.rank);
      j.nodes.insert(p.node);
      j.world_size = std::max(j.world_size, p.world_size);
      j.processes++;
    }
    std::string o = "{\"jobs\":[";
    bool first = true;
    for (const auto& [name, j] : jobs) {
      // A node no agent ever sent from was recorded (`strata record` writes no agent): it cannot
      // fall silent. A job with no agent at all is a finished recording, not a degraded job.
      std::vector<std::string> silent_nodes;
      bool watched = false;
      for (const auto& n : j.nodes) {
        auto it = newest.find(n);
        if (it == newest.end()) continue;
        watched = true;
        if (silent(*it->second, now)) silent_nodes.push_back(n);
      }
      o += first ? "" : ",";
      first = false;
      o += "{\"job\":" + json_str(name) + ",\"world_size\":" + json_num(j.world_size) +
           ",\"ranks\":" + json_num(static_cast<uint64_t>(j.ranks.size())) +
           ",\"processes\":" + json_num(j.processes) + ",\"nodes\":[";
      bool f2 = true;
      for (const auto& n : j.nodes) {
        o += (f2 ? "" : ",") + json_str(n);
        f2 = false;
      }
      o += "],\"silent_nodes\":[";
      f2 = true;
      for (const auto& n : silent_nodes) {
        o += (f2 ? "" : ",") + json_str(n);
        f2 = false;
      }
      o += "],\"status\":" + json_str(!silent_nodes.empty() ? "degraded" : watched ? "healthy" : "recorded") + "}";
    }
    res.set_content(o + "]}\n", "application/json");
  }

  void processes(const httplib::Request& req, httplib::Response& res) {
    count_request("processes");
    std::vector<store::ProcessInfo> procs;
    {
      std::lock_guard lock(store_mu_);
      auto p = job_processes_.get();
      if (!p) return reply_error(res, 503, p.error().message);
      procs = std::move(*p);
    }
    std::string job = req.has_param("job") ? req.get_param_value("job") : "";
    std::string o = "{\"processes\":[";
    bool first = true;
    for (const auto& p : procs) {
      if (req.has_param("job") && p.job != job) continue;
      o += first ? "" : ",";
      first = false;
      o += "{\"node\":" + json_str(p.node) + ",\"pid\":" + json_num(p.pid) + ",\"ppid\":" + json_num(p.ppid) +
           ",\"start_ns\":" + json_num(p.start_ns) + ",\"comm\":" + json_str(p.comm) +
           ",\"command\":" + json_str(p.command) + ",\"job\":" + json_str(p.job) + ",\"rank\":" + json_num(p.rank) +
           ",\"local_rank\":" + json_num(p.local_rank) + ",\"world_size\":" + json_num(p.world_size) +
           ",\"pod_uid\":" + json_str(p.pod_uid) + ",\"container_id\":" + json_str(p.container_id) +
           ",\"pod_name\":" + json_str(p.pod_name) + ",\"pod_namespace\":" + json_str(p.pod_namespace) + "}";
    }
    res.set_content(o + "]}\n", "application/json");
  }

  Result<store::ProfileFilter> filter_of(const httplib::Request& req) {
    store::ProfileFilter f;
    if (req.has_param("rank")) {
      auto v = query_uint(req, "rank");
      if (!v || *v > 1u << 22) return Error{"rank: expected a number"};
      f.rank = static_cast<int>(*v);
    }
    if (req.has_param("pid")) {
      auto v = query_uint(req, "pid");
      if (!v || *v > 1u << 22) return Error{"pid: expected a number"};
      f.pid = static_cast<uint32_t>(*v);
    }
    // `job=J`: only that job's processes (and its span, profile_span).
    if (req.has_param("job")) {
      std::string job = req.get_param_value("job");
      if (job.size() > kMaxJobName) return Error{"job: expected a job name of at most " + std::to_string(kMaxJobName) + " characters"};
      f.job = std::move(job);
    }
    // A pid names a process only on its node: node=N with pid=P is that one process.
    auto node = node_of(req);
    if (!node) return node.error();
    f.node = *node;
    if (req.has_param("tid")) {
      auto v = query_uint(req, "tid");
      if (!v || *v > 1u << 22) return Error{"tid: expected a number"};
      f.tid = static_cast<uint32_t>(*v);
    }
    std::string kind = req.has_param("kind") ? req.get_param_value("kind") : "oncpu";
    if (kind == "oncpu") f.kind = store::CountKind::kOnCpu;
    else if (kind == "offcpu") f.kind = store::CountKind::kOffCpu;
    else return Error{"kind: expected oncpu or offcpu"};
    return f;
  }

  // The span of a profile read (read_span: by default the store's latest 10 minutes, never its whole
  // history); called with store_mu_ held. Replies the reason when there is none to read.
  // `job=J` (the flame page's download) ends it at that job's latest step, as its pages' spans.
  bool profile_span(const httplib::Request& req, store::ProfileFilter& f, httplib::Response& res) {
    const std::string job = req.has_param("job") ? req.get_param_value("job") : "";
    auto st = read_span(req, *store_, store_.get(), req.has_param("job") ? &job : nullptr, f);
    if (!st) reply_error(res, st.error().exit_code == 2 ? 503 : 400, st.error().message);
    return static_cast<bool>(st);
  }

  void profile(const httplib::Request& req, httplib::Response& res) {
    count_request("profile");
    auto f = filter_of(req);
    if (!f) return reply_error(res, 400, f.error().message);
    Result<Profile> p = Error{""};
    {
      std::lock_guard lock(store_mu_);
      if (!profile_span(req, *f, res)) return;
      p = store_->load_profile(*f);
    }
    if (!p) return reply_error(res, 503, p.error().message);
    span_headers(*f, res);
    // &format=pprof: the gzipped profile.proto `strata report --format pprof` writes (the web UI's
    // download). The exporter writes a file: a private temporary one, read back and removed.
    const std::string format = req.has_param("format") ? req.get_param_value("format") : "folded";
    if (format == "pprof") {
      char path[] = "/tmp/strata-serve-pprof.XXXXXX";
      int fd = ::mkstemp(path);
      if (fd < 0) return reply_error(res, 503, "pprof: cannot create a temporary file");
      ::close(fd);
      auto st = report::write_pprof(*p, path);
      std::ifstream in(path, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      ::unlink(path);
      if (!st) return reply_error(res, 503, st.error().message);
      res.set_content(bytes, "application/octet-stream");
      return;
    }
    if (format != "folded") return reply_error(res, 400, "format: expected folded or pprof");
    std::ostringstream out;
    report::write_folded(*p, out);
    res.set_content(out.str(), "text/plain; charset=utf-8");
  }

  static void to_proto(const store::ProcessInfo& p, ingest::Process* r) {
    r->set_pid(p.pid);
    r->set_ppid(p.ppid);
    r->set_start_ns(p.start_ns);
    r->set_node(p.node);
    r->set_comm(p.comm);
    r->set_command(p.command);
    r->set_job(p.job);
    r->set_rank(p.rank);
    r->set_local_rank(p.local_rank);
    r->set_world_size(p.world_size);
    r->set_pod_uid(p.pod_uid);
    r->set_container_id(p.container_id);
    r->set_pod_name(p.pod_name);
    r->set_pod_namespace(p.pod_namespace);
  }

  // A stack (leaf first) as the export and the launch samples' page carry it: `local_id` is its
  // index in the answer's list.
  static void to_proto(const Stack& stack, int64_t local_id, ingest::StackDef* s) {
    s->set_local_id(local_id);
    for (const auto& fr : stack) {
      auto* x = s->add_frames();
      x->set_kind(static_cast<uint32_t>(fr.kind));
      x->set_build_id(fr.build_id);
      x->set_module(fr.module);
      x->set_offset(fr.offset);
      x->set_function(fr.function);
      x->set_file(fr.file);
      x->set_line(fr.line);
    }
  }

  // The remote reader's view (store/remote_store.cpp): a profile and its context, as protobuf.
  void export_(const httplib::Request& req, httplib::Response& res) {
    count_request("export");
    auto f = filter_of(req);
    if (!f) return reply_error(res, 400, f.error().message);
    ingest::Export e;
    e.set_schema_version(ingest::kIngestVersion);
    {
      std::lock_guard lock(store_mu_);
      if (!profile_span(req, *f, res)) return;
      auto latest_step = store_->latest_step_ns();
      if (!latest_step) return reply_error(res, 503, latest_step.error().message);
      e.set_latest_step_ns(latest_step->value_or(0));
      e.set_span_from_ns(f->from_ns.value_or(0));
      e.set_span_to_ns(f->to_ns.value_or(0));
      auto p = store_->load_profile(*f);
      if (!p) return reply_error(res, 503, p.error().message);
      auto procs = store_->processes();
      if (!procs) return reply_error(res, 503, procs.error().message);
      // The OS metrics of what the profile covers (its node, pid, time range), one page at most.
      store::RowQuery mq;
      mq.prefix = "os.";
      mq.node = f->node;
      mq.pid = f->pid;
      mq.from_ns = f->from_ns;
      mq.to_ns = f->to_ns;
      mq.limit = kMaxPageRows;
      auto metrics = store_->query_metrics(mq);
      if (!metrics) return reply_error(res, 503, metrics.error().message);
      auto latest = store_->latest_recording();
      if (!latest) return reply_error(res, 503, latest.error().message);
      auto hz = store_->sample_hz();
      for (const auto& pr : *procs) to_proto(pr, e.add_processes());
      e.set_profile_kind(p->kind);
      e.set_value_unit(p->value_unit);
      e.set_period_ns(p->period_ns);
      e.set_start_ns(p->start_ns);
      e.set_duration_ns(p->duration_ns);
      for (size_t i = 0; i < p->stacks.size(); ++i) to_proto(p->stacks[i], static_cast<int64_t>(i), e.add_stacks());
      for (const auto& smp : p->samples) {
        auto* c = e.add_samples();
        c->set_pid(smp.pid);
        c->set_tid(smp.tid);
        c->set_thread_comm(smp.comm);
        c->set_stack(smp.stack_index);
        c->set_value(smp.count);
        c->set_period_ns(smp.period_ns);
      }
      auto reduced = store_->reduced_fidelity(std::nullopt, f->from_ns, f->to_ns);
      if (!reduced) return reply_error(res, 503, reduced.error().message);
      for (const auto& r : *reduced) {
        auto* x = e.add_reduced_fidelity();
        x->set_recording(r.recording);
        x->set_node(r.node);
        x->set_start_ns(r.start_ns);
        x->set_end_ns(r.end_ns);
        x->set_windows(r.windows);
        x->set_configured_hz(r.configured_hz);
        x->set_sample_hz(r.sample_hz);
        x->set_unwinding(r.unwinding);
      }
      for (const auto& m : *metrics) {
        auto* x = e.add_metrics();
        x->set_start_ns(m.start_ns);
        x->set_end_ns(m.end_ns);
        store::catalog::to_message(store::catalog::kMetrics, m.metric, *x->add_metrics());
      }
      if (*latest) {
        e.set_latest_recording(**latest);
        auto stats = store_->stats(**latest);
        if (stats) {
          for (const auto& [k, v] : *stats) {
            auto* s = e.add_stats();
            s->set_key(k);
            s->set_value(v);
          }
        }
      }
      if (hz) e.set_sample_hz(*hz);
    }
    std::string body;
    e.SerializeToString(&body);
    res.set_content(body, "application/x-protobuf");
  }

  void metrics(const httplib::Request& req, httplib::Response& res) {
    count_request("metrics");
    auto q = row_query_of(req);
    if (!q) return reply_error(res, 400, q.error().message);
    q->prefix = req.has_param("prefix") ? req.get_param_value("prefix") : "";
    Result<std::vector<store::Store::MetricRow>> rows = Error{""};
    {
      std::lock_guard lock(store_mu_);
      rows = store_->query_metrics(*q);
    }
    if (!rows) return reply_error(res, 503, rows.error().message);
    std::string o = "{\"metrics\":[";
    bool first = true;
    for (const auto& r : *rows) {
      o += first ? "" : ",";
      first = false;
      o += "{\"start_ns\":" + json_num(r.start_ns) + ",\"end_ns\":" + json_num(r.end_ns) + ",\"node\":" +
           json_str(r.node) + store::catalog::json_members(store::catalog::kMetrics, r.metric) + "}";
    }
    res.set_content(o + "]" + page_end(*q, rows->size()) + "}\n", "application/json");
  }

  void steps(const httplib::Request& req, httplib::Response& res) {
    count_request("steps");
    auto q = row_query_of(req);
    if (!q) return reply_error(res, 400, q.error().message);
    Result<std::vector<store::StepRecord>> rows = Error{""};
    {
      std::lock_guard lock(store_mu_);
      rows = store_->query_steps(*q);
    }
    if (!rows) return reply_error(res, 503, rows.error().message);
    std::string o = "{\"steps\":[";
    bool first = true;
    for (const auto& s : *rows) {
      o += first ? "" : ",";
      first = false;
      o += "{\"node\":" + json_str(s.node) + store::catalog::json_members(store::catalog::kSteps, s) + "}";
    }
    res.set_content(o + "]" + page_end(*q, rows->size()) + "}\n", "application/json");
  }

  // Sampled kernel launches and memory calls (Reader::query_launch_samples): a row query
  // (row_query_of) and `prefix=` (names that start with it; "[" for the memory calls). JSON, or
  // with format=proto an ingest.LaunchSamplePage (the remote reader's).
  void launch_samples(const httplib::Request& req, httplib::Response& res) {
    count_request("launch_samples");
    auto q = row_query_of(req);
    if (!q) return reply_error(res, 400, q.error().message);
    q->prefix = req.has_param("prefix") ? req.get_param_value("prefix") : "";
    const std::string format = req.has_param("format") ? req.get_param_value("format") : "json";
    if (format != "json" && format != "proto") return reply_error(res, 400, "format: expected json or proto");
    Result<store::LaunchSamples> got = Error{""};
    {
      std::lock_guard lock(store_mu_);
      got = store_->query_launch_samples(*q);
    }
    if (!got) return reply_error(res, 503, got.error().message);
    if (format == "proto") {
      ingest::LaunchSamplePage page;
      for (const auto& r : got->rows) {
        auto* x = page.add_rows();
        x->set_node(r.node);
        x->set_start_ns(r.start_ns);
        x->set_end_ns(r.end_ns);
        store::catalog::to_message(store::catalog::kLaunchSamples, r.sample, *x->mutable_sample());
        x->set_stack_index(r.stack_index);
      }
      for (size_t i = 0; i < got->stacks.size(); ++i)
        to_proto(got->stacks[i], static_cast<int64_t>(i), page.add_stacks());
      std::string body;
      page.SerializeToString(&body);
      res.set_content(body, "application/x-protobuf");
      return;
    }
    std::string o = "{\"launch_samples\":[";
    uint64_t n = 0;
    for (const auto& r : got->rows) {
      o += n++ ? "," : "";
      o += "{\"node\":" + json_str(r.node) + ",\"start_ns\":" + json_num(r.start_ns) + ",\"end_ns\":" +
           json_num(r.end_ns) + store::catalog::json_members(store::catalog::kLaunchSamples, r.sample) +
           ",\"stack_index\":" + json_num(r.stack_index) + "}";
    }
    o += "],\"stacks\":[";
    for (size_t i = 0; i < got->stacks.size(); ++i) {
      o += i ? ",[" : "[";
      for (size_t j = 0; j < got->stacks[i].size(); ++j) {
        const Frame& f = got->stacks[i][j];
        o += std::string(j ? "," : "") + "{\"function\":" + json_str(f.function) + ",\"module\":" + json_str(f.module) +
             ",\"offset\":" + json_num(f.offset) + ",\"file\":" + json_str(f.file) + ",\"line\":" + json_num(f.line) + "}";
      }
      o += "]";
    }
    res.set_content(o + "]" + page_end(*q, got->rows.size()) + "}\n", "application/json");
  }

  void collectives(const httplib::Request& req, httplib::Response& res) {
    count_request("collectives");
    auto q = row_query_of(req);
    if (!q) return reply_error(res, 400, q.error().message);
    Result<std::vector<store::CollectiveRecord>> rows = Error{""};
    {
      std::lock_guard lock(store_mu_);
      rows = store_->query_collectives(*q);
    }
    if (!rows) return reply_error(res, 503, rows.error().message);
    std::string o = "{\"collectives\":[";
    uint64_t n = 0;
    for (const auto& c : *rows) {
      o += n++ ? "," : "";
      o += "{\"node\":" + json_str(c.node) + store::catalog::json_members(store::catalog::kCollectives, c) + "}";
    }
    res.set_content(o + "]" + page_end(*q, rows->size()) + "}\n", "application/json");
  }

  void prometheus(httplib::Response& res) {
    std::ostringstream o;
    std::vector<store::AgentStatus> agents;
    const uint64_t wal_bytes = store_->log_bytes();  // a stat of the file: no lock
    {
      std::lock_guard lock(store_mu_);
      if (auto a = store_->agents()) agents = std::move(*a);
    }
    uint64_t now = wall_clock_ns();
    uint64_t silent_n = 0;
    for (const auto& a : agents) silent_n += silent(a, now) ? 1 : 0;
    auto dc = diagnoser_.counters();
    std::lock_guard lock(counters_.mu);
    prom::family(o, "strata_build_info", "gauge", "The collector's version (always 1).");
    o << "strata_build_info{version=\"" << STRATA_VERSION << "\",role=\"serve\"} 1\n";
    prom::family(o, "strata_serve_batches_total", "counter", "Ingest batches by outcome.");
    o << "strata_serve_batches_total{outcome=\"applied\"} " << counters_.batches_applied << "\n";
    o << "strata_serve_batches_total{outcome=\"duplicate\"} " << counters_.batches_duplicate << "\n";
    for (const auto& [k, v] : counters_.batches_rejected)
      o << "strata_serve_batches_total{outcome=\"rejected\",reason=\"" << k << "\"} " << v << "\n";
    prom::family(o, "strata_serve_rows_total", "counter", "Rows written to the store, by kind.");
    for (const auto& [k, v] : counters_.rows) o << "strata_serve_rows_total{kind=\"" << k << "\"} " << v << "\n";
    prom::family(o, "strata_serve_ingest_bytes_total", "counter", "Compressed ingest bytes received.");
    o << "strata_serve_ingest_bytes_total " << counters_.bytes_received << "\n";
    prom::family(o, "strata_serve_lost_references_total", "counter",
                 "Rows naming a stack or recording the agent never delivered.");
    o << "strata_serve_lost_references_total " << counters_.lost_refs << "\n";
    prom::family(o, "strata_serve_apply_seconds_total", "counter", "Time spent writing ingest batches to the store.");
    o << "strata_serve_apply_seconds_total " << counters_.apply_seconds << "\n";
    prom::family(o, "strata_serve_apply_groups_total", "counter",
                 "Store transactions that applied ingest batches (batches that queued meanwhile go in one).");
    o << "strata_serve_apply_groups_total " << counters_.apply_groups << "\n";
    prom::family(o, "strata_serve_unauthorized_total", "counter", "/api/ requests refused for a missing or wrong token.");
    o << "strata_serve_unauthorized_total " << counters_.unauthorized << "\n";
    prom::family(o, "strata_serve_requests_total", "counter", "HTTP requests by route.");
    for (const auto& [k, v] : counters_.requests) o << "strata_serve_requests_total{route=\"" << k << "\"} " << v << "\n";
    prom::family(o, "strata_serve_request_duration_seconds", "histogram",
                 "HTTP request handling time by route, from routing to the last byte written.");
    for (const auto& [k, h] : counters_.request_seconds)
      h.write(o, "strata_serve_request_duration_seconds", "route=\"" + k + "\"");
    prom::family(o, "strata_serve_agents", "gauge", "Agents known to the store, by status (silent: no recent batch).");
    o << "strata_serve_agents{status=\"healthy\"} " << agents.size() - silent_n
      << "\nstrata_serve_agents{status=\"silent\"} " << silent_n << "\n";
    prom::family(o, "strata_serve_diagnoses_total", "counter",
                 "Job diagnoses made and kept, by outcome (skipped: no new data; waiting: ranks still joining).");
    o << "strata_serve_diagnoses_total{outcome=\"kept\"} " << dc.diagnosed << "\n";
    o << "strata_serve_diagnoses_total{outcome=\"failed\"} " << dc.failed << "\n";
    o << "strata_serve_diagnoses_total{outcome=\"skipped\"} " << dc.skipped << "\n";
    o << "strata_serve_diagnoses_total{outcome=\"waiting\"} " << dc.waiting << "\n";
    prom::family(o, "strata_serve_jobs_handed_over_total", "counter",
                 "Jobs with new data here that another collector sharing the store diagnoses.");
    o << "strata_serve_jobs_handed_over_total " << dc.handed_over << "\n";
    prom::family(o, "strata_serve_diagnosis_seconds_total", "counter", "Time spent diagnosing jobs, loads and writes included.");
    o << "strata_serve_diagnosis_seconds_total " << dc.seconds << "\n";
    prom::family(o, "strata_serve_diagnosis_cpu_seconds_total", "counter",
                 "CPU the background diagnosis rounds used (their pauses keep them to half a core on average).");
    o << "strata_serve_diagnosis_cpu_seconds_total " << dc.cpu_seconds << "\n";
    prom::family(o, "strata_serve_diagnosis_rows_read_total", "counter",
                 "Rows the diagnosis rounds read (steps, collectives, device activity, metrics, stack samples).");
    o << "strata_serve_diagnosis_rows_read_total " << dc.rows_read << "\n";
    prom::family(o, "strata_serve_diagnosis_rows_passed_over_total", "counter",
                 "Rows of other jobs' processes the diagnosis rounds read in a job's span and threw away.");
    o << "strata_serve_diagnosis_rows_passed_over_total " << dc.rows_passed_over << "\n";
    prom::family(o, "strata_serve_diagnosis_states_dropped_total", "counter",
                 "Per-job diagnosis states dropped (the job sent nothing for an hour, or too many jobs).");
    o << "strata_serve_diagnosis_states_dropped_total " << dc.states_dropped << "\n";
    prom::family(o, "strata_serve_diagnosis_held_rows", "gauge",
                 "Rows the diagnosis rounds hold between them for every job (each job's analysis span).");
    o << "strata_serve_diagnosis_held_rows " << dc.held_rows << "\n";
    prom::family(o, "strata_serve_diagnosis_rows_released_total", "counter",
                 "Times a job's held rows were let go (over the bound, least recently active job first, or the job went quiet): its next round reads its whole span.");
    o << "strata_serve_diagnosis_rows_released_total " << dc.rows_released << "\n";
    prom::family(o, "strata_serve_retention_deleted_rows_total", "counter",
                 "Rows older than the SQLite store's retention_days deleted.");
    o << "strata_serve_retention_deleted_rows_total " << counters_.retention_deleted << "\n";
    prom::family(o, "strata_serve_wal_truncations_total", "counter",
                 "Times the SQLite store's write-ahead log was truncated after it passed wal_max_mb.");
    o << "strata_serve_wal_truncations_total " << counters_.wal_truncations << "\n";
    prom::family(o, "strata_serve_wal_truncated_bytes_total", "counter",
                 "Bytes the SQLite write-ahead log held when it was truncated.");
    o << "strata_serve_wal_truncated_bytes_total " << counters_.wal_truncated_bytes << "\n";
    prom::family(o, "strata_serve_wal_truncation_failures_total", "counter",
                 "Truncations of the SQLite write-ahead log that a reader prevented (tried again).");
    o << "strata_serve_wal_truncation_failures_total " << counters_.wal_truncation_failures << "\n";
    prom::family(o, "strata_serve_wal_bytes", "gauge", "Size of the SQLite store's write-ahead log (0 for ClickHouse).");
    o << "strata_serve_wal_bytes " << wal_bytes << "\n";
    prom::family(o, "strata_serve_diagnosis_duration_seconds", "histogram",
                 "One job's diagnosis (load, diagnose, keep the findings), each round.");
    dc.job_seconds.write(o, "strata_serve_diagnosis_duration_seconds", "");
    prom::family(o, "strata_serve_round_duration_seconds", "histogram",
                 "One background round, every job it looked at (wall time; the pause after it follows its CPU).");
    dc.round_seconds.write(o, "strata_serve_round_duration_seconds", "");
    auto cc = svr_.counters();
    prom::family(o, "strata_serve_connections", "gauge", "Open HTTP connections.");
    o << "strata_serve_connections " << cc.open << "\n";
    prom::family(o, "strata_serve_connections_refused_total", "counter", "Connections over the cap (503 and closed).");
    o << "strata_serve_connections_refused_total " << cc.refused << "\n";
    prom::family(o, "strata_serve_request_deadline_closed_total", "counter",
                 "Connections closed because a request did not arrive whole in time.");
    o << "strata_serve_request_deadline_closed_total " << cc.deadline_closed << "\n";
    prom::family(o, "process_cpu_seconds_total", "counter", "User and system CPU time of the collector.");
    o << "process_cpu_seconds_total " << self_cpu_seconds() << "\n";
    prom::family(o, "process_resident_memory_bytes", "gauge", "Resident memory of the collector.");
    o << "process_resident_memory_bytes " << self_rss_bytes() << "\n";
    res.set_content(o.str(), "text/plain; version=0.0.4");
  }

  ServeOptions opts_;
  std::unique_ptr<store::Store> store_;
  std::mutex store_mu_;
  IngestApplier applier_;
  // Batches decoded and waiting for the store (ingest): taken, in arrival order, by whichever
  // request holds store_mu_. Items live on their requests' stacks until done.
  struct QueuedBatch {
    IngestApplier::GroupItem* item;
    uint64_t rows;  // batch_rows
  };
  std::mutex apply_queue_mu_;
  std::deque<QueuedBatch> apply_queue_;
  ServerCounters counters_;
  AgentPeers peers_;
  std::ostream& log_;
  Diagnoser diagnoser_;  // before svr_: handlers use it until the server stops
  JobProcesses job_processes_{*store_};  // the pages' processes, read again after a write
  std::unique_ptr<GuardedServer> http_;
  GuardedServer& svr_;
};

// An HTTP server (the guarded one: connection cap and deadlines) bound to --listen HOST:PORT, not
// yet serving. Without SO_REUSEPORT (httplib's
// default sets it): with it a second collector binds the same port and the kernel splits the
// agents' batches between two stores. SO_REUSEADDR alone still lets a restart take the port from
// connections in TIME_WAIT.
Result<std::unique_ptr<GuardedServer>> bind_listener(const std::string& listen, ConnectionLimits limits) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) return Error{"--listen " + listen + ": expected HOST:PORT"};
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_text = listen.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port_text) > 65535)
    return Error{"--listen " + listen + ": bad port"};
  const int port = std::stoi(port_text);
  auto http = std::make_unique<GuardedServer>(limits);
  http->set_socket_options([](socket_t fd) {
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  if (!http->bind_to_port(host, port))
    return Error{"cannot listen on " + listen + ": " + bind_failure(host, port, "strata serve")}.environment();
  return http;
}

}  // namespace

Result<SqliteSpec> parse_sqlite_spec(const std::string& spec) {
  if (spec.rfind("clickhouse://", 0) == 0) return Error{"--store " + spec + ": not an SQLite store"};
  SqliteSpec out;
  out.path = spec.rfind("sqlite:", 0) == 0 ? spec.substr(7) : spec;
  if (auto q = out.path.find('?'); q != std::string::npos) {
    std::string options = out.path.substr(q + 1);
    out.path.resize(q);
    std::stringstream ss(options);
    std::string option;
    while (std::getline(ss, option, '&')) {
      const size_t eq = option.find('=');
      const std::string key = option.substr(0, eq), value = eq == std::string::npos ? "" : option.substr(eq + 1);
      const bool digits = !value.empty() && value.size() <= 7 && value.find_first_not_of("0123456789") == std::string::npos;
      const unsigned long n = digits ? std::stoul(value) : 0;
      if (key == "retention_days") {
        if (n < 1 || n > kMaxRetentionDays)
          return Error{"--store " + spec + ": retention_days must be a whole number of days from 1 to " +
                           std::to_string(kMaxRetentionDays),
                       2};
        out.retention_days = static_cast<unsigned>(n);
      } else if (key == "wal_max_mb") {
        if (n < 1 || n > kMaxWalMaxMb)
          return Error{"--store " + spec + ": wal_max_mb must be a whole number of MB from 1 to " +
                           std::to_string(kMaxWalMaxMb),
                       2};
        out.wal_max_mb = static_cast<unsigned>(n);
      } else {
        return Error{"--store " + spec + ": an SQLite store's options are ?retention_days=N and &wal_max_mb=M", 2};
      }
    }
  }
  if (out.path.empty()) return Error{"--store sqlite:FILE.db: no file given"};
  return out;
}

Status check_store_spec(const std::string& spec) {
  if (spec.rfind("clickhouse://", 0) == 0) return {};
  if (spec.rfind("sqlite:", 0) == 0) {
    if (auto s = parse_sqlite_spec(spec); !s) return s.error();
    return {};
  }
  // "mysql:foo" is a scheme we do not speak, not a file name (a file with a colon: sqlite:a:b.db).
  const size_t colon = spec.find(':');
  if (colon != std::string::npos && colon > 0 && std::isalpha(static_cast<unsigned char>(spec[0])) &&
      spec.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-", 0) == colon)
    return Error{"--store " + spec + ": unknown store '" + spec.substr(0, colon + 1) +
                 "' (sqlite:FILE.db or clickhouse://HOST:PORT/DB)"};
  if (spec.empty()) return Error{"--store: no store given (sqlite:FILE.db or clickhouse://HOST:PORT/DB)"};
  return {};
}

Result<std::unique_ptr<store::Store>> open_store(const std::string& spec, store::Store::Mode mode) {
  if (auto ok = check_store_spec(spec); !ok) return ok.error();
  if (spec.rfind("clickhouse://", 0) == 0) return store::Store::open_clickhouse(spec, mode);
  auto sqlite = parse_sqlite_spec(spec);
  if (!sqlite) return sqlite.error();
  // The collector's writer: many nodes' batches land all over the tables' indexes (the rows of a
  // time span interleave by node), so the pages a group of batches touches are worth keeping
  // between commits, and a page rewritten by many commits is worth copying into the database once.
  store::SqliteTuning tuning;
  if (mode == store::Store::Mode::kCreateOrAppend) {
    tuning.cache_kib = kCollectorCacheKib;
    tuning.wal_autocheckpoint_pages = kCollectorAutocheckpointPages;
  }
  return store::Store::open_sqlite(sqlite->path, mode, tuning);
}

Status serve(const ServeOptions& opts, const std::atomic<bool>& stop, std::ostream& log) {
  // Everything that can fail is checked before the store is opened, so a collector that cannot
  // start leaves no new store file behind.
  if (auto ok = check_store_spec(opts.store); !ok) return ok.error();
  auto http = bind_listener(opts.listen, ConnectionLimits{opts.max_connections, opts.request_deadline_s});
  if (!http) return http.error();
  auto st = open_store(opts.store, store::Store::Mode::kCreateOrAppend);
  if (!st) return st.error();
  Server s(opts, std::move(*st), std::move(*http), log);
  return s.run(stop);
}

}  // namespace strata::server
