#include "server/web_api.h"

#include <httplib.h>
#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>

#include "report/chrome_trace.h"
#include "report/exporters.h"
#include "server/json.h"
#ifdef STRATA_HAVE_DIAGNOSE
#include "diagnose/loader.h"
#include "diagnose/peer_groups.h"
#endif


namespace strata::server {

Result<std::vector<store::ProcessInfo>> job_processes(store::Reader& store) {
#ifdef STRATA_HAVE_DIAGNOSE
  return diagnose::processes_with_ranks(store);
#else
  return store.processes();
#endif
}

Result<std::vector<store::ProcessInfo>> JobProcesses::get() {
  std::lock_guard lock(mu_);
  auto version = store_.data_version();
  if (!version) return version.error();
  if (*version && version_ == *version) return procs_;
  ++reads_;
  auto procs = job_processes(store_);
  if (!procs) return procs.error();
  // Kept only where the store can tell a change; else the next call reads again.
  version_ = *version;
  procs_ = *version ? *procs : std::vector<store::ProcessInfo>{};
  return procs;
}

namespace {

void reply_error(httplib::Response& res, int status, const std::string& why) {
  res.status = status;
  res.set_content("{\"error\":" + json_str(why) + "}\n", "application/json");
}

// Milliseconds with three decimals: the matrices are the bulk of a page, 17 digits would triple them.
// to_chars, not printf: 60k of them per 1,000-rank heatmap.
std::string ms3(double ms) {
  if (!std::isfinite(ms)) return "null";
  char buf[48];
  auto r = std::to_chars(buf, buf + sizeof buf, ms, std::chars_format::fixed, 3);
  return r.ec == std::errc() ? std::string(buf, r.ptr) : "null";
}

// A large JSON answer, gzipped here at level 1 when the client takes gzip: httplib's own gzip runs
// at level 6, a third of a 1,000-rank heatmap's time in the server for ~10% fewer bytes. The
// content type then carries a charset, which httplib does not compress again.
void reply_json(const httplib::Request& req, httplib::Response& res, const std::string& body) {
  const std::string type = "application/json; charset=utf-8";
  res.set_header("Vary", "Accept-Encoding");
  if (body.size() < 16384 || req.get_header_value("Accept-Encoding").find("gzip") == std::string::npos) {
    res.set_content(body, type);
    return;
  }
  z_stream z{};
  if (deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    res.set_content(body, type);
    return;
  }
  std::string out(deflateBound(&z, body.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(body.data()));
  z.avail_in = static_cast<uInt>(body.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) {
    res.set_content(body, type);
    return;
  }
  res.set_header("Content-Encoding", "gzip");
  res.set_header("Content-Type", type);
  res.body = std::move(out);
}

// Runs of reduced fidelity one answer lists at most: an agent that stays stepped down for months
// has one per stretch, and the page needs where and when, not every stretch.
constexpr size_t kMaxFidelityRuns = 200;

// A job's latest step is where its default span ends. A running job's is the store's latest step;
// a job that ended before it is found by its kept diagnosis (Ledger::latest_diagnosis, one row per
// job): the steps table has no index by job, and a scan back from the store's end for the job's
// processes would read every later job's steps. A round's window ends at the latest step it read,
// which trails the job's last step by up to a round and a batch; the span ends this long after it,
// so it keeps the job's last steps. While the rounds keep up (every window, 10 s by default) a
// running job's kept window ends within this of the store's latest step, which then stays the end;
// a quarter of the default span keeps three quarters of it on a job that ended.
constexpr uint64_t kKeptWindowTrailNs = kDefaultSpanNs / 4;

struct RankProc {
  int rank = -1;
  uint32_t pid = 0;
  std::string node;
  std::string comm;
};

// A process is (node, pid): pids repeat across nodes, so rows join ranks by both.
using ProcKey = std::pair<std::string, uint32_t>;

// The ranks of a job, by the processes the store knows. An empty `job` picks the job with the most
// ranks (a recording holds one). Returns the job chosen.
std::string job_ranks(const std::vector<store::ProcessInfo>& procs, const std::string& wanted, bool job_given,
                      std::vector<RankProc>& out) {
  std::string job = wanted;
  if (!job_given) {
    std::map<std::string, std::set<int>> ranks;
    for (const auto& p : procs) {
      if (p.rank >= 0) ranks[p.job].insert(p.rank);
    }
    size_t best = 0;
    for (const auto& [j, r] : ranks) {
      if (r.size() > best) {
        best = r.size();
        job = j;
      }
    }
  }
  for (const auto& p : procs) {
    if (p.rank >= 0 && p.job == job) out.push_back({p.rank, p.pid, p.node, p.comm});
  }
  std::sort(out.begin(), out.end(), [](const RankProc& a, const RankProc& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.node != b.node ? a.node < b.node : a.pid < b.pid;
  });
  return job;
}

std::optional<int> query_rank(const httplib::Request& req) {
  if (!req.has_param("rank")) return std::nullopt;
  const std::string v = req.get_param_value("rank");
  if (v.empty() || v.size() > 7 || v.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoi(v);
}

class WebApi {
 public:
  explicit WebApi(WebApiContext ctx) : ctx_(std::move(ctx)) {}

  // The store's processes as the pages show them: kept between requests when the server keeps them.
  Result<std::vector<store::ProcessInfo>> processes() {
    return ctx_.processes ? ctx_.processes->get() : job_processes(ctx_.store);
  }

  // The span a page reads (read_span): the job's, when the request names no span.
  Status span_of(const httplib::Request& req, store::ProfileFilter& range, const std::string& job) {
    return read_span(req, ctx_.store, ctx_.ledger, &job, range);
  }

  // A span that cannot be read: 400 for a bad request, 503 where the store failed.
  static void reply_span_error(httplib::Response& res, const Error& e) { reply_error(res, e.exit_code == 2 ? 503 : 400, e.message); }

  // The diagnosis strata serve keeps (server/diagnoser.h): the latest round's report and the
  // findings' history; &format=text for `strata diagnose --server`.
  void findings(const httplib::Request& req, httplib::Response& res) {
    ctx_.count_request("findings");
    const std::string job = req.has_param("job") ? req.get_param_value("job") : "";
    if (!ctx_.diagnoser) {
      res.set_content("{\"job\":" + json_str(job) + ",\"findings\":[],\"error\":\"this server keeps no diagnoses\"}\n",
                      "application/json");
      return;
    }
    const bool text = req.has_param("format") && req.get_param_value("format") == "text";
    auto r = ctx_.diagnoser->findings(job, req.has_param("job"), text);
    res.status = r.status;
    res.set_content(r.body, r.content_type);
  }

  // Each heatmap row's peer group (ranks of one parallel role, diagnose/peer_groups.h), from the
  // communicators and the calls of the job's last kPeerGroupSteps columns: roles do not change
  // within a job, and a bounded span keeps the read independent of the job's age. Empty when every
  // rank does the same work (or roles are unknown): the UI then offers no peer-group view.
  static constexpr size_t kPeerGroupSteps = 8;  // a pipeline schedule's sends and all-reduces recur every step
  std::vector<int> peer_groups_of(size_t n, const std::map<ProcKey, size_t>& proc_row,
                                  const std::vector<std::vector<const store::StepRecord*>>& per_row, size_t columns) {
#ifdef STRATA_HAVE_DIAGNOSE
    if (n < 2 || columns == 0) return {};
    store::RowQuery span;
    span.from_ns = UINT64_MAX;
    span.to_ns = 0;
    for (const auto& v : per_row) {
      for (size_t c = v.size() > kPeerGroupSteps ? v.size() - kPeerGroupSteps : 0; c < v.size(); ++c) {
        if (!v[c]) continue;
        span.from_ns = std::min(*span.from_ns, v[c]->start_ns);
        span.to_ns = std::max(*span.to_ns, v[c]->end_ns);
      }
    }
    if (*span.to_ns <= *span.from_ns) return {};
    std::lock_guard lock(ctx_.store_mu);
    auto calls = ctx_.store.query_collectives(span);
    auto comms = ctx_.store.communicators();
    if (!calls || !comms) return {};  // the heatmap stands without groups
    auto group = diagnose::peer_groups(n, proc_row, *comms, *calls);
    if (std::all_of(group.begin(), group.end(), [&](int g) { return g == group.front(); })) return {};
    return group;
#else
    (void)n, (void)proc_row, (void)per_row, (void)columns;
    return {};
#endif
  }

  // Rows are aligned on time, not on their first step in the span: the span's start cuts one rank's
  // step and not its peer's (their boundaries differ by the collective's spread), and the n-th step
  // of each would then be a step apart. Each row starts at the column of the earliest-starting
  // row's step that began nearest its own first step; the columns before it hold none (null).
  static void align_rows(std::vector<std::vector<const store::StepRecord*>>& per_row) {
    const std::vector<const store::StepRecord*>* ref = nullptr;
    for (const auto& v : per_row) {
      if (!v.empty() && (!ref || v.front()->start_ns < ref->front()->start_ns)) ref = &v;
    }
    if (!ref) return;
    const std::vector<const store::StepRecord*> grid = *ref;
    for (auto& v : per_row) {
      if (v.empty() || &v == ref) continue;
      const uint64_t t = v.front()->start_ns;
      auto it = std::lower_bound(grid.begin(), grid.end(), t, [](const store::StepRecord* s, uint64_t x) { return s->start_ns < x; });
      size_t c = static_cast<size_t>(it - grid.begin());
      auto gap = [&](size_t i) { return i < grid.size() ? (grid[i]->start_ns > t ? grid[i]->start_ns - t : t - grid[i]->start_ns) : UINT64_MAX; };
      if (c > 0 && gap(c - 1) <= gap(c)) --c;
      v.insert(v.begin(), c, nullptr);
    }
  }

  // One row per rank, one column per step (the n-th step of every rank in the span: ranks of a
  // data-parallel job step together), so the UI draws a rank x time heatmap without a request per
  // rank. The steps of a span (span_of: by default the latest 10 minutes), the job's alone.
  void heatmap(const httplib::Request& req, httplib::Response& res) {
    ctx_.count_request("heatmap");
    std::vector<store::ProcessInfo> procs;
    std::vector<store::StepRecord> steps;
    std::vector<store::Reader::MetricRow> os_rows;
    std::vector<RankProc> ranks;
    std::string job;
    store::ProfileFilter range;
    // `os=NAME,NAME`: those OS metrics (os.*) summed per rank over the span, for the per-rank
    // breakdown: what the page read before was the first page of every os.* row of the store.
    std::set<std::string> os_names;
    if (req.has_param("os")) {
      std::stringstream list(req.get_param_value("os"));
      for (std::string item; std::getline(list, item, ',');) {
        if (item.size() < 4 || item.size() > 64 || item.rfind("os.", 0) != 0 || os_names.size() == 32)
          return reply_error(res, 400, "os: expected up to 32 metric names that start with os., separated by commas");
        os_names.insert(item);
      }
    }
    {
      std::lock_guard lock(ctx_.store_mu);
      auto p = processes();
      if (!p) return reply_error(res, 503, p.error().message);
      procs = std::move(*p);
      job = job_ranks(procs, req.get_param_value("job"), req.has_param("job"), ranks);
      if (auto st = span_of(req, range, job); !st) return reply_span_error(res, st.error());
      std::set<ProcKey> mine;
      for (const auto& r : ranks) mine.insert({r.node, r.pid});
      store::RowQuery q;
      q.from_ns = range.from_ns;
      q.to_ns = range.to_ns;
      q.any_order = true;  // sorted per rank below
      q.keep_process = [&mine](std::string_view node, uint32_t pid) { return mine.count({std::string(node), pid}) > 0; };
      if (auto read = ctx_.store.append_steps(q, steps); !read) return reply_error(res, 503, read.error().message);
      if (!os_names.empty()) {
        q.prefix = "os.";
        if (auto read = ctx_.store.append_metrics(q, os_rows); !read) return reply_error(res, 503, read.error().message);
      }
    }
    // A rank restarted under a new pid keeps its row: its processes' steps follow each other.
    std::map<int, size_t> row_of;
    std::vector<RankProc> rows;
    std::map<ProcKey, size_t> proc_row;
    for (const auto& r : ranks) {
      auto [it, fresh] = row_of.emplace(r.rank, rows.size());
      if (fresh) rows.push_back(r);
      proc_row[{r.node, r.pid}] = it->second;
    }
    std::vector<std::vector<const store::StepRecord*>> per_row(rows.size());
    for (const auto& s : steps) {
      auto it = proc_row.find({s.node, s.pid});
      if (it != proc_row.end() && s.end_ns > s.start_ns) per_row[it->second].push_back(&s);
    }
    for (auto& v : per_row) std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->start_ns < b->start_ns; });
    align_rows(per_row);
    size_t columns = 0;
    for (const auto& v : per_row) columns = std::max(columns, v.size());
    const bool only_trend = req.get_param_value("only") == "trend";
    span_headers(range, res);
    std::string o = "{\"job\":" + json_str(job);
    if (range.from_ns && range.to_ns) o += ",\"from_ns\":" + json_num(*range.from_ns) + ",\"to_ns\":" + json_num(*range.to_ns);
    o += ",\"steps\":" + json_num(static_cast<uint64_t>(columns));
    // Column start: the earliest start among ranks (ns, as JSON numbers; exact to ~µs, enough here).
    o += ",\"step_start_ns\":[";
    for (size_t c = 0; c < columns; ++c) {
      uint64_t t = 0;
      for (const auto& v : per_row) {
        if (c < v.size() && v[c] && (t == 0 || v[c]->start_ns < t)) t = v[c]->start_ns;
      }
      o += (c ? "," : "") + json_num(t);
    }
    // Column end: the latest end among ranks, so [start, end) of a column holds every rank's step.
    o += "],\"step_end_ns\":[";
    for (size_t c = 0; c < columns; ++c) {
      uint64_t t = 0;
      for (const auto& v : per_row) {
        if (c < v.size() && v[c]) t = std::max(t, v[c]->end_ns);
      }
      o += (c ? "," : "") + json_num(t);
    }
    const std::vector<int> group = peer_groups_of(rows.size(), proc_row, per_row, columns);
    o += "],\"ranks\":[";
    for (size_t r = 0; r < rows.size(); ++r) {
      o += (r ? "," : "") + std::string("{\"rank\":") + json_num(rows[r].rank) + ",\"pid\":" + json_num(rows[r].pid) +
           ",\"node\":" + json_str(rows[r].node);
      if (!group.empty()) o += ",\"group\":" + json_str("group " + std::to_string(group[r]));
      o += "}";
    }
    o += "],\"summary\":{";
    struct Series {
      const char* name;
      double (*value)(const store::StepRecord&);
    };
    static const Series kAll[] = {
        {"step_ms", [](const store::StepRecord& s) { return static_cast<double>(s.end_ns - s.start_ns) / 1e6; }},
        // Waiting for peers, as the diagnosis counts it: the device's collective kernels when a GPU
        // timing source saw them (host calls only enqueue), else the host's time in collective calls.
        {"collective_ms",
         [](const store::StepRecord& s) {
           return static_cast<double>(s.device_known && s.device_collective_ns ? s.device_collective_ns : s.collective_ns) / 1e6;
         }},
        {"gpu_compute_ms",
         [](const store::StepRecord& s) {
           return s.device_known ? static_cast<double>(s.device_compute_ns) / 1e6 : std::nan("");
         }},
        {"gpu_idle_ms",
         [](const store::StepRecord& s) {
           return s.device_known ? static_cast<double>(s.gpu_idle_ns) / 1e6 : std::nan("");
         }},
    };
    // Per-rank means of every series (the breakdown table), so a page asks only for the matrix it draws
    // (`series=step_ms,...`; default all).
    o += "\"means\":{";
    for (size_t k = 0; k < std::size(kAll); ++k) {
      o += (k ? ",\"" : "\"") + std::string(kAll[k].name) + "\":[";
      for (size_t r = 0; r < per_row.size(); ++r) {
        double sum = 0;
        size_t n = 0;
        for (const auto* step : per_row[r]) {
          if (!step) continue;
          double v = kAll[k].value(*step);
          if (std::isfinite(v)) {
            sum += v;
            ++n;
          }
        }
        o += (r ? "," : "") + ms3(n ? sum / static_cast<double>(n) : std::nan(""));
      }
      o += "]";
    }
    o += "}";
    if (!os_names.empty()) {
      // Each window's value prorated by how much of it lies in the span (windows are 10 s; a span's
      // edges cut them).
      std::map<std::string, std::vector<double>> sums;
      for (const auto& name : os_names) sums[name].assign(rows.size(), 0.0);
      for (const auto& m : os_rows) {
        auto sum = sums.find(m.metric.name);
        auto row = proc_row.find({m.node, m.metric.pid});
        if (sum == sums.end() || row == proc_row.end() || m.end_ns <= m.start_ns || !std::isfinite(m.metric.value)) continue;
        const uint64_t lo = std::max(m.start_ns, range.from_ns.value_or(0)), hi = std::min(m.end_ns, range.to_ns.value_or(UINT64_MAX));
        if (hi <= lo) continue;
        sum->second[row->second] += m.metric.value * static_cast<double>(hi - lo) / static_cast<double>(m.end_ns - m.start_ns);
      }
      o += ",\"os\":{";
      bool first_name = true;
      for (const auto& [name, v] : sums) {
        o += (first_name ? "" : ",") + json_str(name) + ":[";
        first_name = false;
        for (size_t r = 0; r < v.size(); ++r) o += (r ? "," : "") + ms3(v[r]);
        o += "]";
      }
      o += "}";
    }
    const std::string wanted = only_trend ? "step_ms" : req.get_param_value("series");
    auto is_wanted = [&](const std::string& name) {
      if (wanted.empty()) return true;
      size_t pos = 0;
      while (pos <= wanted.size()) {
        size_t comma = wanted.find(',', pos);
        if (wanted.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos) == name) return true;
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
      return false;
    };
    o += "},\"series\":{";
    bool first_series = true;
    for (const auto& series : kAll) {
      if (!is_wanted(series.name)) continue;
      o += (first_series ? "\"" : ",\"") + std::string(series.name) + "\":[";
      first_series = false;
      for (size_t r = 0; r < per_row.size(); ++r) {
        o += r ? ",[" : "[";
        for (size_t c = 0; c < per_row[r].size(); ++c)
          o += (c ? "," : "") + ms3(per_row[r][c] ? series.value(*per_row[r][c]) : std::nan(""));
        o += "]";
      }
      o += "]";
    }
    reply_json(req, res, o + "}}\n");
  }

  // The differential profile: rank R's stacks beside the sum of the same stacks on its peers (the
  // job's other ranks); the UI divides by `peers` to compare one rank with the average peer.
  void diff(const httplib::Request& req, httplib::Response& res) {
    ctx_.count_request("diff");
    auto rank = query_rank(req);
    if (!rank) return reply_error(res, 400, "rank: expected a number");
    const std::string kind = req.has_param("kind") ? req.get_param_value("kind") : "oncpu";
    store::ProfileFilter f;
    if (kind == "offcpu") f.kind = store::CountKind::kOffCpu;
    else if (kind != "oncpu") return reply_error(res, 400, "kind: expected oncpu or offcpu");
    std::vector<store::ProcessInfo> procs;
    Result<Profile> profile = Error{""};
    std::vector<RankProc> ranks;
    std::string job;
    {
      std::lock_guard lock(ctx_.store_mu);
      auto p = processes();
      if (!p) return reply_error(res, 503, p.error().message);
      procs = std::move(*p);
      job = job_ranks(procs, req.get_param_value("job"), req.has_param("job"), ranks);
      // A span (span_of: by default the job's latest 10 minutes), never the job's whole history.
      if (auto st = span_of(req, f, job); !st) return reply_span_error(res, st.error());
      profile = ctx_.store.load_profile(f);
    }
    if (!profile) return reply_error(res, 503, profile.error().message);
    std::map<ProcKey, int> rank_of;
    std::set<int> peers;
    bool found = false;
    for (const auto& r : ranks) {
      rank_of[{r.node, r.pid}] = r.rank;
      if (r.rank != *rank) peers.insert(r.rank);
      found = found || r.rank == *rank;
    }
    if (!found) return reply_error(res, 404, "no rank " + std::to_string(*rank) + " in job '" + job + "'");
    std::vector<std::string> names(profile->stacks.size());
    std::vector<bool> named(profile->stacks.size(), false);
    // folded stack -> (rank, peers), in samples at the profile's period (Profile::weighted: windows
    // at a lowered rate weigh by their own period)
    std::map<std::string, std::pair<double, double>> counts;
    for (const auto& s : profile->samples) {
      auto it = rank_of.find({s.node, s.pid});
      if (it == rank_of.end() || s.count == 0) continue;
      std::string key = "[no stack]";
      if (s.stack_index < profile->stacks.size()) {
        if (!named[s.stack_index]) {
          const auto& st = profile->stacks[s.stack_index];
          std::string n;
          for (auto fr = st.rbegin(); fr != st.rend(); ++fr) n += (n.empty() ? "" : ";") + report::folded_frame_name(*fr);
          names[s.stack_index] = n.empty() ? "[no stack]" : n;
          named[s.stack_index] = true;
        }
        key = names[s.stack_index];
      }
      auto& c = counts[key];
      (it->second == *rank ? c.first : c.second) += profile->weighted(s);
    }
    std::string o = "{\"job\":" + json_str(job) + ",\"rank\":" + json_num(*rank) + ",\"kind\":" + json_str(kind) +
                    ",\"unit\":" + json_str(profile->value_unit) +
                    ",\"peers\":" + json_num(static_cast<uint64_t>(peers.size()));
    // The span asked and the span the counts cover (whole windows), so the UI can say what it shows.
    span_headers(f, res);
    {
      o += ",\"window\":{\"from_ns\":" + json_num(f.from_ns.value_or(0)) + ",\"to_ns\":" +
           (f.to_ns ? json_num(*f.to_ns) : std::string("null")) + ",\"start_ns\":" + json_num(profile->start_ns) +
           ",\"end_ns\":" + json_num(profile->start_ns + profile->duration_ns) + "}";
    }
    o += ",\"stacks\":[";
    bool first = true;
    for (const auto& [stack, c] : counts) {
      o += (first ? "[" : ",[") + json_str(stack) + "," + json_num(c.first) + "," + json_num(c.second) + "]";
      first = false;
    }
    reply_json(req, res, o + "]}\n");
  }

  // The same trace `strata report --format chrome-trace --rank R` writes (report/chrome_trace.h).
  void timeline(const httplib::Request& req, httplib::Response& res) {
    ctx_.count_request("timeline");
    // `ranks=A,B,C` (the UI's cross-rank timeline): those ranks in one trace, on one time axis.
    std::set<int> wanted_ranks;
    if (req.has_param("ranks")) {
      std::stringstream list(req.get_param_value("ranks"));
      for (std::string item; std::getline(list, item, ',');) {
        if (item.empty() || item.size() > 7 || item.find_first_not_of("0123456789") != std::string::npos)
          return reply_error(res, 400, "ranks: expected numbers separated by commas");
        wanted_ranks.insert(std::stoi(item));
      }
    }
    auto rank = query_rank(req);
    if (wanted_ranks.empty()) {
      if (!rank) return reply_error(res, 400, "rank: expected a number");
      wanted_ranks.insert(*rank);
    } else if (!rank) {
      rank = *wanted_ranks.begin();
    }
    store::ProfileFilter range;
    report::TimelineData d;
    std::vector<RankProc> ranks;
    std::string job;
    {
      std::lock_guard lock(ctx_.store_mu);
      auto procs = processes();
      if (!procs) return reply_error(res, 503, procs.error().message);
      job = job_ranks(*procs, req.get_param_value("job"), req.has_param("job"), ranks);
      if (auto st = span_of(req, range, job); !st) return reply_span_error(res, st.error());
      std::set<ProcKey> keep;
      for (const auto& r : ranks) {
        if (wanted_ranks.count(r.rank)) keep.insert({r.node, r.pid});
      }
      if (keep.empty()) return reply_error(res, 404, "no rank " + std::to_string(*rank) + " in job '" + job + "'");
      auto wanted = [&](const std::string& node, uint32_t pid) { return keep.count({node, pid}) > 0; };
      for (const auto& p : *procs) {
        if (wanted(p.node, p.pid)) d.processes.push_back(p);
      }
      auto comms = ctx_.store.communicators();
      auto hz = ctx_.store.sample_hz();
      if (!comms) return reply_error(res, 503, comms.error().message);
      if (!hz) return reply_error(res, 503, hz.error().message);
      // The rank's own rows, read per process (node, pid): never the whole tables.
      for (const auto& [node, pid] : keep) {
        if (auto read = report::append_process(ctx_.store, node, pid, d, range.from_ns, range.to_ns); !read)
          return reply_error(res, 503, read.error().message);
      }
      for (auto& c : *comms) if (wanted(c.node, c.pid)) d.communicators.push_back(std::move(c));
      d.sample_hz = *hz ? *hz : 99;
    }
    std::ostringstream out;
    report::write_chrome_trace(d, out);
    if (req.get_param_value("download") == "1") {
      std::string file = "strata-" + (job.empty() ? std::string("job") : job) + "-rank" + std::to_string(*rank) + ".json";
      for (char& c : file) {
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
      }
      res.set_header("Content-Disposition", "attachment; filename=\"" + file + "\"");
    }
    span_headers(range, res);
    reply_json(req, res, out.str());
  }

  // What recording cost (strata record's stats: agent CPU, BPF run time, target CPU, samples...).
  // Where the agents' cost budget reduced fidelity (store::ReducedFidelity) on the nodes of a job
  // (`job`; default: the job with the most ranks), with each node's ranks: the pages say it beside
  // the profiles and the heatmap.
  void fidelity(const httplib::Request& req, httplib::Response& res) {
    ctx_.count_request("fidelity");
    std::vector<store::ProcessInfo> procs;
    std::vector<store::ReducedFidelity> runs;
    store::ProfileFilter range;
    std::vector<RankProc> ranks;
    std::string job;
    {
      std::lock_guard lock(ctx_.store_mu);
      auto p = processes();
      if (!p) return reply_error(res, 503, p.error().message);
      procs = std::move(*p);
      job = job_ranks(procs, req.get_param_value("job"), req.has_param("job"), ranks);
      // The runs of a span (span_of: by default the job's latest 10 minutes): a page says what it shows.
      if (auto st = span_of(req, range, job); !st) return reply_span_error(res, st.error());
      auto r = ctx_.store.reduced_fidelity(std::nullopt, range.from_ns, range.to_ns);
      if (!r) return reply_error(res, 503, r.error().message);
      runs = std::move(*r);
    }
    std::map<std::string, std::set<int>> ranks_of;  // node -> the job's ranks on it
    for (const auto& r : ranks) ranks_of[r.node].insert(r.rank);
    std::string o = "{\"job\":" + json_str(job) + ",\"reduced\":[";
    bool first = true;
    size_t shown = 0;
    for (const auto& r : runs) {
      auto it = ranks_of.find(r.node);
      if (it == ranks_of.end()) continue;
      if (shown++ == kMaxFidelityRuns) break;
      std::string rs;
      for (int k : it->second) rs += (rs.empty() ? "" : ",") + std::to_string(k);
      o += std::string(first ? "" : ",") + "{\"node\":" + json_str(r.node) + ",\"ranks\":[" + rs +
           "],\"start_ns\":" + json_num(r.start_ns) + ",\"end_ns\":" + json_num(r.end_ns) +
           ",\"windows\":" + json_num(r.windows) + ",\"configured_hz\":" + json_num(r.configured_hz) +
           ",\"sample_hz\":" + json_num(r.sample_hz) + ",\"unwinding\":" + json_str(r.unwinding) + "}";
      first = false;
    }
    o += "],\"truncated\":" + std::string(shown > kMaxFidelityRuns ? "true" : "false") + "}\n";
    span_headers(range, res);
    reply_json(req, res, o);
  }

  void overhead(httplib::Response& res) {
    ctx_.count_request("overhead");
    std::string o = "{\"stats\":{";
    {
      std::lock_guard lock(ctx_.store_mu);
      auto latest = ctx_.store.latest_recording();
      if (!latest) return reply_error(res, 503, latest.error().message);
      if (*latest) {
        auto stats = ctx_.store.stats(**latest);
        if (!stats) return reply_error(res, 503, stats.error().message);
        bool first = true;
        for (const auto& [k, v] : *stats) {
          o += (first ? "" : ",") + json_str(k) + ":" + json_num(v);
          first = false;
        }
      }
    }
    res.set_content(o + "}}\n", "application/json");
  }

 private:
  WebApiContext ctx_;
};

}  // namespace

Status time_range_of(const httplib::Request& req, store::ProfileFilter& f) {
  auto ns = [&](const char* key) -> Result<std::optional<uint64_t>> {
    if (!req.has_param(key)) return std::optional<uint64_t>{};
    const std::string v = req.get_param_value(key);
    if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos)
      return Error{std::string(key) + ": expected unix nanoseconds"};
    return std::optional<uint64_t>{std::stoull(v)};
  };
  auto from = ns("from");
  if (!from) return from.error();
  auto to = ns("to");
  if (!to) return to.error();
  if (*from && *to && **from >= **to) return Error{"from, to: expected from < to"};
  f.from_ns = *from;
  f.to_ns = *to;
  return {};
}

void span_headers(const store::ProfileFilter& range, httplib::Response& res) {
  if (!range.from_ns || !range.to_ns) return;
  res.set_header("X-Strata-Span-From-Ns", std::to_string(*range.from_ns));
  res.set_header("X-Strata-Span-To-Ns", std::to_string(*range.to_ns));
}

Status read_span(const httplib::Request& req, store::Reader& store, store::Ledger* ledger, const std::string* job,
                 store::ProfileFilter& range) {
  if (auto st = time_range_of(req, range); !st) return st;
  if (range.from_ns && range.to_ns && *range.to_ns - *range.from_ns > kMaxSpanNs)
    return Error{"from, to: a span of at most 1h; ask for a shorter one, or several"};
  if (range.from_ns && !range.to_ns) range.to_ns = *range.from_ns + std::min(kDefaultSpanNs, UINT64_MAX - *range.from_ns);
  if (range.to_ns && !range.from_ns) range.from_ns = *range.to_ns - std::min(kDefaultSpanNs, *range.to_ns);
  if (range.to_ns) return {};
  auto latest = store.latest_step_ns();
  if (!latest) return latest.error().environment();
  if (!*latest) return {};
  uint64_t end = **latest + 1;
  if (job && ledger) {
    auto kept = ledger->latest_diagnosis(*job);
    if (!kept) return kept.error().environment();
    if (*kept && (*kept)->window_end_ns < end - std::min(end, kKeptWindowTrailNs)) end = (*kept)->window_end_ns + kKeptWindowTrailNs;
  }
  range.to_ns = end;
  range.from_ns = end - std::min(kDefaultSpanNs, end);
  return {};
}

Result<std::optional<std::string>> node_of(const httplib::Request& req) {
  if (!req.has_param("node")) return std::optional<std::string>{};
  std::string v = req.get_param_value("node");
  if (v.empty() || v.size() > kMaxNodeName) return Error{"node: expected a node name of 1 to 256 characters"};
  return std::optional<std::string>{std::move(v)};
}

Result<store::RowQuery> row_query_of(const httplib::Request& req) {
  store::RowQuery q;
  auto num = [&](const char* key, uint64_t max) -> Result<std::optional<uint64_t>> {
    if (!req.has_param(key)) return std::optional<uint64_t>{};
    const std::string v = req.get_param_value(key);
    if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos || std::stoull(v) > max)
      return Error{std::string(key) + ": expected a number up to " + std::to_string(max)};
    return std::optional<uint64_t>{std::stoull(v)};
  };
  auto node = node_of(req);
  if (!node) return node.error();
  q.node = *node;
  auto pid = num("pid", 1u << 22);
  if (!pid) return pid.error();
  if (*pid) q.pid = static_cast<uint32_t>(**pid);
  auto recording = num("recording", INT64_MAX);
  if (!recording) return recording.error();
  if (*recording) q.recording = static_cast<int64_t>(**recording);
  store::ProfileFilter range;
  if (auto st = time_range_of(req, range); !st) return st.error();
  q.from_ns = range.from_ns;
  q.to_ns = range.to_ns;
  auto offset = num("offset", INT64_MAX);
  if (!offset) return offset.error();
  q.offset = offset->value_or(0);
  auto limit = num("limit", kMaxPageRows);
  if (!limit) return limit.error();
  q.limit = limit->value_or(kDefaultPageRows);
  if (q.limit == 0) q.limit = kDefaultPageRows;
  return q;
}

void add_web_api(httplib::Server& svr, WebApiContext ctx) {
  // Lives as long as the process: the routes below hold it.
  auto api = std::make_shared<WebApi>(std::move(ctx));
  svr.Get("/api/v1/findings", [api](const httplib::Request& q, httplib::Response& r) { api->findings(q, r); });
  svr.Get("/api/v1/heatmap", [api](const httplib::Request& q, httplib::Response& r) { api->heatmap(q, r); });
  svr.Get("/api/v1/diff", [api](const httplib::Request& q, httplib::Response& r) { api->diff(q, r); });
  svr.Get("/api/v1/timeline", [api](const httplib::Request& q, httplib::Response& r) { api->timeline(q, r); });
  svr.Get("/api/v1/fidelity", [api](const httplib::Request& q, httplib::Response& r) { api->fidelity(q, r); });
  svr.Get("/api/v1/overhead", [api](const httplib::Request&, httplib::Response& r) { api->overhead(r); });
}

}  // namespace strata::server
