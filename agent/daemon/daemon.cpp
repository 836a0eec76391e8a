#include "agent/daemon/daemon.h"

#include <dirent.h>
#include <sys/socket.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <condition_variable>
#include <mutex>
#include <ostream>
#include <random>
#include <sstream>
#include <thread>

#include "agent/daemon/source_metrics.h"
#include "agent/gpu/cupti_env.h"
#include "agent/pipeline.h"
#include "agent/process_info.h"
#include "agent/shipper/batching_writer.h"
#include "common/listen.h"
#include "common/self_usage.h"
#include "server/prometheus.h"
#include "store/store.h"
#include "strata_version.h"
#include "symbolize/symbolizer.h"

namespace strata::agent::daemon {
namespace {

// /proc/PID/environ as a map; empty when unreadable (gone, or a kernel thread). Bounded: a
// process's environment is at most a few MB.
std::map<std::string, std::string> read_environ(uint32_t pid) {
  std::map<std::string, std::string> env;
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string entry;
  size_t total = 0;
  while (std::getline(f, entry, '\0') && total < (4u << 20)) {
    total += entry.size();
    auto eq = entry.find('=');
    if (eq != std::string::npos) env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

std::string exe_of(uint32_t pid) {
  char buf[4096];
  ssize_t n = readlink(("/proc/" + std::to_string(pid) + "/exe").c_str(), buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string random_hex(size_t n) {
  std::random_device rd;
  std::string s;
  const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) s += hex[rd() % 16];
  return s;
}


// What /metrics shows: built by the main loop (the pipeline is its alone) when a scrape asks for it,
// and handed to the HTTP thread. A scraper comes every 15-60 s; rebuilding the page every second
// whether or not anyone reads it was a few percent of the agent's own CPU.
class MetricsPage {
 public:
  // The HTTP thread: asks for a fresh page and waits up to `wait` for the main loop (which steps at
  // least five times a second) to build it; the last page when the loop is busy.
  std::string get_fresh(std::chrono::milliseconds wait) {
    std::unique_lock lock(mu_);
    wanted_ = true;
    const uint64_t seen = version_;
    cv_.wait_for(lock, wait, [&] { return version_ != seen; });
    return text_;
  }
  bool wanted() const {
    std::lock_guard lock(mu_);
    return wanted_;
  }
  void set(std::string text) {
    {
      std::lock_guard lock(mu_);
      text_ = std::move(text);
      ++version_;
      wanted_ = false;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string text_;
  uint64_t version_ = 0;
  bool wanted_ = false;
};

// `strata agent` is the node pipeline with the shipper (or a local SQLite store) as its sink,
// watching the training processes it finds in /proc, with its health on /metrics and its flight
// recorder on /drilldown.
class Daemon {
 public:
  Daemon(const AgentOptions& opts, std::ostream& log)
      : opts_(opts), log_(log), node_(opts.node.empty() ? node_name() : opts.node),
        pipeline_(pipeline_options(opts, node_), log) {}

  ~Daemon() {
    if (http_) http_->stop();
    if (http_thread_.joinable()) http_thread_.join();
  }

  Result<AgentSummary> run(const std::atomic<bool>& stop) {
    if (auto st = check_bpf_permissions(); !st) return st.error().environment();
    // The port before the store: an agent that cannot listen leaves no store file behind.
    if (auto st = bind_metrics_server(); !st) return st.error();
    if (!opts_.output.empty()) {
      auto st = store::Store::open_sqlite(opts_.output, store::Store::Mode::kCreateOrAppend);
      if (!st) return st.error();
      store_ = std::move(*st);
    }
    if (auto st = pipeline_.start(); !st) return st.error();
    // Start-up is over (BPF loaded, perf events open, the store open, /metrics bound) and no thread
    // has started: keep only what watching processes needs, for good (bounding set too: the agent
    // runs nothing). The shipper's, the HTTP server's and the sources' threads start after this,
    // with the reduced sets.
    pipeline_.drop_privileges_and_start_threads();
    if (!store_) {
      if (auto st = open_shipper(); !st) return st.error();
    }
    if (auto st = pipeline_.begin(*store_, "strata agent"); !st) return st.error();
    log_ << "strata: agent on node " << node_ << " -> " << (opts_.server.empty() ? opts_.output : opts_.server)
         << (opts_.server.empty() ? "" : " (spool " + opts_.spool_dir + ")") << "\n";
    if (http_) http_thread_ = std::thread([this] { http_->listen_after_bind(); });
    return loop(stop);
  }

 private:
  static PipelineOptions pipeline_options(const AgentOptions& o, const std::string& node) {
    PipelineOptions p;
    p.node = node;
    p.frequency_hz = o.frequency_hz;
    p.budget_share = o.budget_share;
    p.window_s = o.window_s;
    p.layers = o.layers;
    p.unwind_table_bytes = o.unwind_table_bytes;
    // Shipping: summaries always, raw device records on demand from the flight recorder (DESIGN
    // §2). A local store keeps them as `strata record` does: it is the node's only copy.
    p.raw_device_records = o.server.empty();
    p.flight_recorder = true;
    p.symbolize_each_window = true;  // a local store is read while the agent runs
    p.log_prefix = "strata: agent: ";
    return p;
  }

  Status open_shipper() {
    shipper::ShipperOptions so;
    so.server = opts_.server;
    so.token = opts_.token;
    so.node = node_;
    // A new id per run: batch ids restart at 1, and batches a previous run left in the spool
    // keep their own agent id, so they are still applied exactly once.
    so.agent_id = node_ + "-" + random_hex(12);
    so.spool_dir = opts_.spool_dir;
    so.spool_max_bytes = opts_.spool_max_bytes;
    so.interval_s = opts_.window_s;
    auto w = shipper::BatchingWriter::open(so, symbolize::make_caching_symbolizer(),
                                           [this](ingest::AgentHealth& h) { fill_health(h); });
    if (!w) return w.error();
    writer_ = w->get();
    store_ = std::move(*w);
    return {};
  }

  void fill_health(ingest::AgentHealth& h) {
    h.set_sent_ns(unix_now_ns());
    auto c = pipeline_.counters();
    h.set_samples(c.samples);
    h.set_drops(c.ringbuf_drops);
    h.set_probe_hits(pipeline_.probe_hits());
    h.set_cpu_s(self_cpu_seconds());
    h.set_rss_bytes(self_rss_bytes());
    h.set_watched_processes(static_cast<uint32_t>(pipeline_.live_processes()));
    h.set_version(STRATA_VERSION);
    h.set_drilldown_url(drilldown_url_);
    h.set_drilldown_credential(drilldown_credential_);
    const auto& b = pipeline_.budget();
    h.set_budget_level(static_cast<uint32_t>(b.level()));
    h.set_cost_share(b.last_share());
    h.set_budget_share(b.budget());
    auto [gpu, no_timeline] = gpu_processes();
    h.set_gpu_processes(gpu);
    h.set_gpu_processes_without_timeline(no_timeline);
  }

  // From the GPU layer's stats: processes that use CUDA, and those without a device timeline.
  std::pair<uint32_t, uint32_t> gpu_processes() const {
    std::vector<std::pair<std::string, double>> stats;
    pipeline_.source_stats(stats);
    uint32_t gpu = 0, no_timeline = 0;
    for (const auto& [k, v] : stats) {
      if (k == "gpu_comm.gpu_processes") gpu = static_cast<uint32_t>(v);
      if (k == "gpu_comm.gpu_processes_without_timeline") no_timeline = static_cast<uint32_t>(v);
    }
    return {gpu, no_timeline};
  }

  // Says it when GPU processes are watched without a device timeline (once per rise), so the GPU
  // layer's reduced view is never silent.
  void report_missing_timelines() {
    auto [gpu, no_timeline] = gpu_processes();
    if (no_timeline > said_without_timeline_)
      log_ << "strata: agent: " << no_timeline << " of " << gpu
           << " GPU process(es) have no device timeline: their GPU times are NVML and launch->sync only "
              "(give the training containers the environment of `strata agent --pod-env`)\n";
    said_without_timeline_ = no_timeline;
  }

  // Binds the /metrics and /drilldown listener (a port below 1024 needs privileges); it serves
  // from a thread started after the privileges are dropped.
  Status bind_metrics_server() {
    if (opts_.listen_metrics.empty() || opts_.listen_metrics == "off") return {};
    auto colon = opts_.listen_metrics.rfind(':');
    if (colon == std::string::npos) return Error{"--listen-metrics " + opts_.listen_metrics + ": expected HOST:PORT"};
    std::string host = opts_.listen_metrics.substr(0, colon);
    int port = std::atoi(opts_.listen_metrics.c_str() + colon + 1);
    http_ = std::make_unique<httplib::Server>();
    http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(page_.get_fresh(kFreshPageWait), "text/plain; version=0.0.4");
    });
    http_->Get("/drilldown", [this](const httplib::Request& req, httplib::Response& res) { drilldown(req, res); });
    // Without SO_REUSEPORT (httplib's default sets it), as strata serve binds (issue 19 item 1): with
    // it a second agent on the node bound the same port, and scrapes and /drilldown requests went to
    // either agent by turns. SO_REUSEADDR alone lets a restart take the port from TIME_WAIT.
    http_->set_socket_options([](socket_t fd) {
      int yes = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    });
    if (!http_->bind_to_port(host, port))
      return Error{"cannot listen on " + opts_.listen_metrics + ": " +
                   bind_failure(host, port, "strata agent")}
          .environment();
    // Where the collector reaches /drilldown: --advertise, else the listen address (a wildcard
    // address is no destination: the node's name stands for it).
    std::string adv = opts_.advertise;
    if (adv.empty()) {
      std::string h = host;
      if (h.empty() || h == "0.0.0.0" || h == "::" || h == "[::]") h = node_name();
      adv = h + ":" + std::to_string(port);
    }
    drilldown_url_ = adv.rfind("http://", 0) == 0 || adv.rfind("https://", 0) == 0 ? adv : "http://" + adv;
    // The collector asks /drilldown with this secret of our own, registered in every batch: it never
    // forwards its users' token to an address a batch names.
    std::ifstream urandom("/dev/urandom", std::ios::binary);
    unsigned char raw[16] = {};
    urandom.read(reinterpret_cast<char*>(raw), sizeof raw);
    if (!urandom) return Error{"cannot read /dev/urandom for the drill-down credential"}.environment();
    static const char kHex[] = "0123456789abcdef";
    for (unsigned char c : raw) drilldown_credential_ += {kHex[c >> 4], kHex[c & 15]};
    return {};
  }

  // GET /drilldown?[pid=P][&rank=R][&last=30s | &from_ns=A&to_ns=B][&limit=N][&kinds=collectives,device]:
  // the flight recorder's raw records (DESIGN §2).
  void drilldown(const httplib::Request& req, httplib::Response& res) {
    auto bad = [&](int status, const std::string& why) {
      res.status = status;
      std::string e;
      for (char c : why) e += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
      res.set_content("{\"error\":\"" + e + "\"}\n", "application/json");
    };
    {
      // The collector presents our drill-down credential; an operator may use the shared token.
      // Always behind one of them: the records name the job's processes and timing.
      const std::string h = req.get_header_value("Authorization");
      const bool bearer = h.rfind("Bearer ", 0) == 0;
      const bool ok = bearer && (token_matches(h.substr(7), drilldown_credential_) ||
                                 (!opts_.token.empty() && token_matches(h.substr(7), opts_.token)));
      if (!ok) {
        res.set_header("WWW-Authenticate", "Bearer");
        return bad(401, "missing or wrong bearer token (Authorization: Bearer TOKEN)");
      }
    }
    auto uint_param = [&](const char* key, uint64_t max) -> std::optional<uint64_t> {
      const std::string v = req.get_param_value(key);
      if (v.empty() || v.size() > 20 || v.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
      uint64_t n = std::strtoull(v.c_str(), nullptr, 10);
      if (n > max) return std::nullopt;
      return n;
    };
    DrilldownQuery q;
    uint64_t now = unix_now_ns();
    if (req.has_param("pid")) {
      auto v = uint_param("pid", 1u << 22);
      if (!v) return bad(400, "pid: expected a process id");
      q.pid = static_cast<uint32_t>(*v);
    }
    if (req.has_param("rank")) {
      auto v = uint_param("rank", 1u << 22);
      if (!v) return bad(400, "rank: expected a number");
      q.rank = static_cast<int>(*v);
    }
    if (req.has_param("last")) {
      auto d = parse_duration_ns(req.get_param_value("last"));
      if (!d) return bad(400, "last: expected a duration such as 30s, 5m, 500ms");
      q.from_ns = now > *d ? now - *d : 0;
    }
    if (req.has_param("from_ns")) {
      auto v = uint_param("from_ns", UINT64_MAX);
      if (!v) return bad(400, "from_ns: expected unix nanoseconds");
      q.from_ns = *v;
    }
    if (req.has_param("to_ns")) {
      auto v = uint_param("to_ns", UINT64_MAX);
      if (!v) return bad(400, "to_ns: expected unix nanoseconds");
      q.to_ns = *v;
    }
    if (q.to_ns < q.from_ns) return bad(400, "to_ns is before from_ns");
    if (req.has_param("limit")) {
      auto v = uint_param("limit", 1000000);
      if (!v || *v == 0) return bad(400, "limit: expected 1..1000000");
      q.limit = *v;
    }
    if (req.has_param("kinds")) {
      q.collectives = q.device = false;
      std::stringstream ss(req.get_param_value("kinds"));
      std::string k;
      while (std::getline(ss, k, ',')) {
        if (k == "collectives") q.collectives = true;
        else if (k == "device") q.device = true;
        else return bad(400, "kinds: expected collectives and/or device");
      }
    }
    res.set_content(pipeline_.flight_recorder().query_json(q, node_, now), "application/json");
  }

  void update_metrics_page() {
    std::ostringstream o;
    // Prometheus conventions, as serve's page (server/prometheus.h): HELP and TYPE on every family,
    // `_total` on counters, the unit (seconds, bytes) in the name.
    auto gauge = [&](const char* name, const char* help, double v, const char* type = "gauge") {
      server::prom::family(o, name, type, help);
      o << name << " " << v << "\n";
    };
    server::prom::family(o, "strata_build_info", "gauge", "The agent's version (always 1).");
    o << "strata_build_info{version=\"" << STRATA_VERSION << "\",role=\"agent\"} 1\n";
    auto c = pipeline_.counters();
    gauge("strata_agent_samples_total", "On-CPU samples taken of watched threads.", static_cast<double>(c.samples), "counter");
    gauge("strata_agent_sample_drops_total", "Samples lost in the kernel (ring buffer full).",
          static_cast<double>(c.ringbuf_drops), "counter");
    gauge("strata_agent_proc_event_drops_total", "Process events lost in the kernel.", static_cast<double>(c.proc_drops),
          "counter");
    gauge("strata_agent_probe_hits_total", "uprobe hits (CUDA/NCCL/gloo calls) in watched processes.",
          static_cast<double>(pipeline_.probe_hits()), "counter");
    gauge("strata_agent_bpf_run_seconds_total", "Run time of the sampler's BPF programs.",
          static_cast<double>(c.bpf_run_ns) / 1e9, "counter");
    gauge("strata_agent_layers_kernel_seconds_total",
          "The other layers' kernel cost: their BPF programs' run time and their uprobes' modeled traps.",
          static_cast<double>(pipeline_.sources_kernel_cost_ns()) / 1e9, "counter");
    gauge("strata_agent_watched_processes", "Processes watched now.", static_cast<double>(pipeline_.live_processes()));
    gauge("strata_agent_windows_total", "Windows written.", static_cast<double>(pipeline_.windows()), "counter");
    const auto& b = pipeline_.budget();
    gauge("strata_agent_budget_level",
          "Cost budget level: 0 full, 1 half and 2 a quarter of the sampling rate, 3 also frame-pointer stacks only; off-CPU stack captures halve at each level.",
          static_cast<double>(b.level()));
    gauge("strata_agent_budget_share", "The budget: the agent's cost allowed, as a share of the watched processes' CPU.",
          b.budget());
    gauge("strata_agent_cost_share", "The agent's cost in the last window, as a share of the watched processes' CPU.",
          b.last_share());
    gauge("strata_agent_budget_steps_down_total", "Times the budget stepped down.", static_cast<double>(b.steps_down()),
          "counter");
    gauge("strata_agent_budget_useless_steps_total",
          "Steps down undone because they cut less than a fifth of the cost (the rest is what no level controls).",
          static_cast<double>(b.useless_steps()), "counter");
    gauge("strata_agent_budget_held",
          "1 while over budget but held at this level: the level below was measured to buy nothing.",
          b.held() ? 1.0 : 0.0);
    auto [gpu, no_timeline] = gpu_processes();
    gauge("strata_agent_gpu_processes", "Watched processes that use CUDA.", gpu);
    gauge("strata_agent_gpu_processes_without_timeline",
          "Of those, processes with no GPU device timeline (no CUPTI injection): NVML and launch->sync times only.",
          no_timeline);
    gauge("strata_agent_wall_clock_steps_total", "Steps of the wall clock seen (the run's timeline does not follow them).",
          static_cast<double>(pipeline_.clock_watch().steps), "counter");
    gauge("strata_agent_wall_clock_offset_seconds", "The wall clock minus the run's timeline, at the last window.",
          static_cast<double>(pipeline_.clock_watch().offset_ns) / 1e9);
    const auto u = pipeline_.unwind_counters();
    gauge("strata_agent_unwind_table_bytes", "Unwind tables (CFI rows) held now, within --unwind-tables-mb.",
          static_cast<double>(u.table_bytes));
    gauge("strata_agent_unwind_table_peak_bytes", "The most the unwind tables have held.",
          static_cast<double>(u.table_peak_bytes));
    gauge("strata_agent_unwind_table_builds_total", "Modules' unwind tables built (again after an eviction).",
          static_cast<double>(u.table_builds), "counter");
    gauge("strata_agent_unwind_table_evictions_total", "Unwind tables dropped to stay inside the budget.",
          static_cast<double>(u.table_evictions), "counter");
    if (c.kcfi_walks > 0 || c.kcfi_rows > 0) {  // STRATA_USER_STACK_MODE=3: the kernel's CFI walk
      gauge("strata_agent_kcfi_walks_total", "User stacks unwound in the kernel with CFI.",
            static_cast<double>(c.kcfi_walks), "counter");
      gauge("strata_agent_kcfi_complete_total", "... that reached the outermost frame.",
            static_cast<double>(c.kcfi_stops[0]), "counter");
      gauge("strata_agent_kcfi_table_bytes", "CFI rows and page index loaded into the kernel.",
            static_cast<double>(c.kcfi_rows * sizeof(strata_unwind_row) + c.kcfi_pages * sizeof(uint32_t)));
      gauge("strata_agent_kcfi_modules_refused_total", "Modules the kernel's row budget had no room for.",
            static_cast<double>(c.kcfi_full), "counter");
    }
    gauge("process_cpu_seconds_total", "The agent's own CPU time.", self_cpu_seconds(), "counter");
    gauge("process_resident_memory_bytes", "The agent's resident memory.", static_cast<double>(self_rss_bytes()));
    if (writer_) {
      auto s = writer_->counters();
      gauge("strata_agent_spool_bytes", "Batches waiting on disk for the collector.", static_cast<double>(s.spool_bytes));
      gauge("strata_agent_spool_batches", "Batches waiting on disk.", static_cast<double>(s.spool_batches));
      gauge("strata_agent_batches_sent_total", "Batches acknowledged by the collector.",
            static_cast<double>(s.batches_sent), "counter");
      gauge("strata_agent_batch_send_failures_total", "Send attempts that failed and will be retried.",
            static_cast<double>(s.send_failures), "counter");
      gauge("strata_agent_batches_dropped_total", "Batches dropped because the spool was full or its disk would not take them.",
            static_cast<double>(s.batches_dropped), "counter");
      gauge("strata_agent_batches_rejected_total", "Batches the collector refused as bad.",
            static_cast<double>(s.batches_rejected), "counter");
      gauge("strata_agent_bytes_sent_total", "Compressed bytes acknowledged by the collector.",
            static_cast<double>(s.bytes_sent), "counter");
      server::prom::family(o, "strata_agent_records_acked_total", "counter", "Rows acknowledged by the collector, by kind.");
      for (const auto& [k, v] : s.records_acked) o << "strata_agent_records_acked_total{kind=\"" << k << "\"} " << v << "\n";
      server::prom::family(o, "strata_agent_records_dropped_total", "counter",
                           "Rows in batches dropped because the spool was full, by kind.");
      for (const auto& [k, v] : s.records_dropped)
        o << "strata_agent_records_dropped_total{kind=\"" << k << "\"} " << v << "\n";
      writer_->write_metrics(o);  // kept answers by status, held/set-aside/quarantined batches
    }
    std::vector<std::pair<std::string, double>> stats;
    pipeline_.source_stats(stats);
    write_source_metrics(o, stats);  // each layer's counters and gauges, one family each
    page_.set(o.str());
  }

  // New training processes: /proc entries whose environment the selector accepts.
  void scan_proc() {
    const double now = pipeline_.elapsed_s();
    DIR* d = opendir("/proc");
    if (!d) return;
    std::set<uint32_t> present;
    uint32_t self = static_cast<uint32_t>(getpid());
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      unsigned long pid = std::strtoul(e->d_name, &end, 10);
      if (!end || *end != '\0' || pid == 0) continue;
      uint32_t p = static_cast<uint32_t>(pid);
      present.insert(p);
      // A pid's environment is read again only when it runs another program: it is fixed at
      // exec, and children of a watched process are followed by the kernel side anyway.
      if (p == self || pipeline_.known(p)) continue;
      auto ck = checked_.find(p);
      // A process that ran another program since its environment was read is read again. Young
      // processes are looked at every scan (launchers exec the training program right after the
      // fork); older ones only every kRecheckOldS, which keeps a node's hundreds of daemons from
      // costing a readlink each per scan.
      if (ck != checked_.end() && now - ck->second.first_seen > kYoungS && now - ck->second.last_checked < kRecheckOldS)
        continue;
      std::string exe = exe_of(p);
      if (ck != checked_.end()) {
        ck->second.last_checked = now;
        if (ck->second.exe == exe) continue;
        ck->second.exe = exe;
      } else {
        checked_[p] = Checked{exe, now, now};
      }
      auto env = read_environ(p);
      if (env.empty() || !opts_.selector.matches(env)) continue;
      if (auto st = pipeline_.watch(p, /*preexisting=*/true); !st)
        log_ << "strata: agent: cannot watch pid " << p << ": " << st.error().message << "\n";
    }
    closedir(d);
    for (auto it = checked_.begin(); it != checked_.end();) it = present.count(it->first) ? std::next(it) : checked_.erase(it);
  }

  Result<AgentSummary> loop(const std::atomic<bool>& stop) {
    using clock = std::chrono::steady_clock;
    auto last_scan = clock::now() - std::chrono::hours(1);
    auto last_page = clock::now();
    update_metrics_page();
    while (!stop) {
      auto now = clock::now();
      if (std::chrono::duration<double>(now - last_scan).count() >= opts_.scan_s) {
        scan_proc();
        last_scan = now;
        if (pipeline_.known_count() > kMaxKnownPids) pipeline_.forget_gone_pids();
      }
      if (auto st = pipeline_.step(200); !st) return st.error();
      if (opts_.duration_s > 0 && pipeline_.elapsed_s() >= opts_.duration_s) break;
      if (page_.wanted()) update_metrics_page();
      if (clock::now() - last_page >= std::chrono::seconds(1)) {
        report_missing_timelines();
        last_page = clock::now();
      }
    }
    auto t = pipeline_.finish();
    if (!t) return t.error();
    AgentSummary s;
    s.windows = t->windows;
    s.processes = t->processes;
    s.samples = t->samples_seen;
    if (writer_) {
      // Give the collector a moment to take the last batches; the rest stays in the spool.
      writer_->drain(5);
      auto c = writer_->counters();
      s.records_sealed = c.records_sealed;
      s.records_acked = c.records_acked;
      s.records_dropped = c.records_dropped;
      s.batches_sent = c.batches_sent;
      s.batches_pending = c.spool_batches;
      s.batches_dropped = c.batches_dropped;
      s.batches_rejected = c.batches_rejected;
      s.bytes_sent = c.bytes_sent;
    }
    update_metrics_page();
    return s;
  }

  // Pids announced once stay known (a late sample must not announce them again) until this many,
  // then those no longer watched are forgotten: bounded memory on a months-long run.
  static constexpr size_t kMaxKnownPids = 65536;

  AgentOptions opts_;
  std::ostream& log_;
  std::string node_;
  std::unique_ptr<store::Writer> store_;  // the sink (declared before the pipeline: it outlives it)
  shipper::BatchingWriter* writer_ = nullptr;  // store_, when shipping
  NodePipeline pipeline_;

  // Pids whose environment was read: their program then, when first seen and last looked at
  // (seconds on the pipeline's clock).
  struct Checked {
    std::string exe;
    double first_seen = 0, last_checked = 0;
  };
  // A process is young for 30 s: a launcher's fork and exec of the training program happen within
  // it however loaded the node is; an older one that runs another program is noticed within 60 s.
  static constexpr double kYoungS = 30, kRecheckOldS = 60;
  std::map<uint32_t, Checked> checked_;
  uint32_t said_without_timeline_ = 0;  // GPU processes without a timeline, as last logged

  std::string drilldown_url_;  // announced to the collector in every batch's health
  std::string drilldown_credential_;  // ... with the secret it asks /drilldown with
  // How long a scrape waits for the main loop's fresh page: a few of its steps (200 ms each).
  static constexpr std::chrono::milliseconds kFreshPageWait{1000};
  MetricsPage page_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
};

}  // namespace

bool Selector::matches(const std::map<std::string, std::string>& env) const {
  if (terms.empty()) {
    for (const char* k : {"RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "STRATA_JOB"})
      if (env.count(k)) return true;
    // torch.distributed's env:// rendezvous: a job started with torch.multiprocessing.spawn gives
    // its ranks MASTER_ADDR and MASTER_PORT in their environment and their rank as an argument
    // (the diagnosis numbers such ranks itself: diagnose/loader.cpp, infer_ranks).
    return env.count("MASTER_ADDR") && env.count("MASTER_PORT");
  }
  for (const auto& [key, values] : terms) {
    auto it = env.find(key);
    if (it == env.end()) return false;
    if (!values.empty() && !values.count(it->second)) return false;
  }
  return true;
}

Result<std::pair<std::string, std::set<std::string>>> parse_selector_term(const std::string& text) {
  auto eq = text.find('=');
  std::string key = text.substr(0, eq);
  if (key.empty() || key.find_first_of(" \t,") != std::string::npos)
    return Error{"--select " + text + ": expected KEY or KEY=VALUE[,VALUE...]"};
  std::set<std::string> values;
  if (eq != std::string::npos) {
    std::stringstream ss(text.substr(eq + 1));
    std::string v;
    while (std::getline(ss, v, ',')) values.insert(v);
    if (values.empty()) return Error{"--select " + text + ": no value after '='"};
  }
  return std::make_pair(key, values);
}

Result<std::string> pod_environment() {
  std::vector<std::string> env = cupti_injection_env();
  if (env.empty()) {
    return Error{"no CUPTI injection to give the containers: " + cupti_injection_library_path() +
                 " is missing, or this environment sets CUDA_INJECTION64_PATH or STRATA_CUPTI=0"}
        .environment();
  }
  std::ostringstream o;
  o << "# strata agent --pod-env: the environment of every training container, so that the CUDA driver\n"
       "# loads strata's CUPTI injection at cuInit and each rank writes its GPU device timeline, which\n"
       "# the agent reads (without it the GPU layer has NVML and launch->sync times only).\n";
  std::vector<std::pair<std::string, std::string>> mounts;
  for (const auto& kv : env) {
    o << kv << "\n";
    auto eq = kv.find('=');
    std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "CUDA_INJECTION64_PATH") mounts.emplace_back(value, "read-only: the injection library");
    if (key == "STRATA_TIMELINE_DIR")
      mounts.emplace_back(value, "read-write: the ranks' timelines, which the agent reads");
  }
  o << "# host paths to mount into each training container at the same path:\n";
  for (const auto& [path, what] : mounts) o << "#   " << path << "  " << what << "\n";
  return o.str();
}

Result<AgentSummary> run_agent(const AgentOptions& opts, const std::atomic<bool>& stop, std::ostream& log) {
  Daemon d(opts, log);
  return d.run(stop);
}

}  // namespace strata::agent::daemon
