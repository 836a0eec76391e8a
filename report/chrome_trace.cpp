#include "report/chrome_trace.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <cstdlib>
#include <limits>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "common/json.h"

namespace strata::report {
namespace {

// Pseudo thread ids for tracks that are not OS threads; far above any real tid.
constexpr uint64_t kStepTrack = 4'000'000'000ull;
constexpr uint64_t kStreamTrackBase = 4'100'000'000ull;
constexpr uint64_t kCommTrackBase = 4'200'000'000ull;


class Writer {
 public:
  Writer(std::ostream& out, uint64_t t0) : out_(out), t0_(t0) {}
  void begin() { out_ << "{\"traceEvents\":[\n"; }
  void end() { out_ << "\n],\"displayTimeUnit\":\"ms\"}\n"; }

  void meta(const char* what, uint64_t pid, uint64_t tid, const std::string& name) {
    sep();
    out_ << "{\"ph\":\"M\",\"name\":\"" << what << "\",\"pid\":" << pid << ",\"tid\":" << tid
         << ",\"args\":{\"name\":\"" << json_escape(name) << "\"}}";
  }
  void sort_index(const char* what, uint64_t pid, uint64_t tid, int64_t index) {
    sep();
    out_ << "{\"ph\":\"M\",\"name\":\"" << what << "\",\"pid\":" << pid << ",\"tid\":" << tid
         << ",\"args\":{\"sort_index\":" << index << "}}";
  }
  // A complete event; `args` is a JSON object body without braces (may be empty).
  void slice(uint64_t pid, uint64_t tid, const std::string& name, const char* cat, uint64_t start_ns,
             uint64_t end_ns, const std::string& args) {
    if (!start_ns || end_ns < start_ns) return;
    sep();
    out_ << "{\"ph\":\"X\",\"pid\":" << pid << ",\"tid\":" << tid << ",\"name\":\"" << json_escape(name)
         << "\",\"cat\":\"" << cat << "\",\"ts\":" << us(start_ns) << ",\"dur\":" << dur_us(end_ns - start_ns)
         << ",\"args\":{" << args << "}}";
  }
  void counter(uint64_t pid, const std::string& name, uint64_t ts_ns, const std::string& series, double v) {
    counter(pid, name, ts_ns, {{series, v}});
  }
  // One counter event with several series (a stacked track in Perfetto / chrome://tracing).
  void counter(uint64_t pid, const std::string& name, uint64_t ts_ns,
               const std::vector<std::pair<std::string, double>>& series) {
    if (!ts_ns || series.empty()) return;
    sep();
    out_ << "{\"ph\":\"C\",\"pid\":" << pid << ",\"tid\":0,\"name\":\"" << json_escape(name) << "\",\"ts\":" << us(ts_ns)
         << ",\"args\":{";
    bool first = true;
    for (const auto& [key, v] : series) {
      char num[64];
      std::snprintf(num, sizeof num, "%.6g", v);
      out_ << (first ? "" : ",") << "\"" << json_escape(key) << "\":" << num;
      first = false;
    }
    out_ << "}}";
  }

 private:
  void sep() {
    if (!first_) out_ << ",\n";
    first_ = false;
  }
  std::string us(uint64_t ns) const {
    uint64_t rel = ns > t0_ ? ns - t0_ : 0;
    char b[40];
    std::snprintf(b, sizeof b, "%llu.%03llu", static_cast<unsigned long long>(rel / 1000),
                  static_cast<unsigned long long>(rel % 1000));
    return b;
  }
  static std::string dur_us(uint64_t ns) {
    char b[40];
    std::snprintf(b, sizeof b, "%llu.%03llu", static_cast<unsigned long long>(ns / 1000),
                  static_cast<unsigned long long>(ns % 1000));
    return b;
  }

  std::ostream& out_;
  uint64_t t0_;
  bool first_ = true;
};

// A histogram's bucket label "le=N" in numeric order (N, then the label's text for anything else).
bool bucket_before(const std::string& a, const std::string& b) {
  auto bound = [](const std::string& l) {
    if (l.rfind("le=", 0) != 0) return std::numeric_limits<double>::infinity();
    char* end = nullptr;
    double v = std::strtod(l.c_str() + 3, &end);
    return end && *end == '\0' ? v : std::numeric_limits<double>::infinity();
  };
  double x = bound(a), y = bound(b);
  return x != y ? x < y : a < b;
}

bool is_histogram(const std::string& name) {
  constexpr std::string_view kSuffix = ".hist";
  return name.size() > kSuffix.size() && name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

}  // namespace

namespace {

// Pids repeat across nodes: in a trace of several nodes (a collector's store) each (node, pid) is a
// trace process of its own: its pid where no other node has that pid, else a number above any pid
// (pid_max is at most 2^22). `real` gets each trace pid's own pid and node for its name.
constexpr uint32_t kFirstSharedPid = 1u << 22;

struct RealPid {
  uint32_t pid = 0;
  std::string node;
};

std::optional<TimelineData> with_unique_pids(const TimelineData& d, std::map<uint32_t, RealPid>& real) {
  std::map<uint32_t, std::set<std::string>> nodes_of;
  auto see = [&](const std::string& node, uint32_t pid) { nodes_of[pid].insert(node); };
  for (const auto& p : d.processes) see(p.node, p.pid);
  for (const auto& c : d.collectives) see(c.node, c.pid);
  for (const auto& a : d.device) see(a.node, a.pid);
  for (const auto& s : d.steps) see(s.node, s.pid);
  for (const auto& t : d.threads) see(t.node, t.pid);
  for (const auto& m : d.counters) see(m.node, m.metric.pid);
  std::map<std::pair<std::string, uint32_t>, uint32_t> trace_pid;
  uint32_t next = kFirstSharedPid;
  bool shared = false;
  for (const auto& [pid, nodes] : nodes_of) {
    for (const auto& node : nodes) {
      const uint32_t t = nodes.size() == 1 ? pid : next++;
      shared |= nodes.size() > 1;
      trace_pid[{node, pid}] = t;
      real[t] = {pid, nodes.size() > 1 ? node : std::string()};
    }
  }
  if (!shared) return std::nullopt;  // every pid on one node: the trace as it is
  TimelineData u = d;
  auto map = [&](const std::string& node, uint32_t& pid) { pid = trace_pid[{node, pid}]; };
  for (auto& p : u.processes) map(p.node, p.pid);
  for (auto& c : u.communicators) map(c.node, c.pid);
  for (auto& c : u.collectives) map(c.node, c.pid);
  for (auto& a : u.device) map(a.node, a.pid);
  for (auto& s : u.steps) map(s.node, s.pid);
  for (auto& t : u.threads) map(t.node, t.pid);
  for (auto& m : u.counters) {
    if (m.metric.pid != 0) map(m.node, m.metric.pid);
  }
  return u;
}

}  // namespace

void add_threads(const std::vector<store::Reader::ThreadWindow>& windows, TimelineData& d) {
  for (const auto& t : windows) d.threads.push_back({t.start_ns, t.end_ns, t.pid, t.tid, t.comm, t.samples, t.node, t.sample_hz});
}

Status append_rows(store::Reader& store, store::RowQuery q, TimelineData& d) {
  if (auto read = store.append_collectives(q, d.collectives); !read) return read.error();
  if (auto read = store.append_device_activity(q, d.device); !read) return read.error();
  if (auto read = store.append_steps(q, d.steps); !read) return read.error();
  auto threads = store.thread_windows(q);
  if (!threads) return threads.error();
  add_threads(*threads, d);
  q.prefix = "os.";
  return store.append_metrics(q, d.counters);
}

Status append_process(store::Reader& store, const std::string& node, uint32_t pid, TimelineData& d,
                      std::optional<uint64_t> from_ns, std::optional<uint64_t> to_ns) {
  store::RowQuery q;
  q.node = node;
  q.pid = pid;
  q.from_ns = from_ns;
  q.to_ns = to_ns;
  return append_rows(store, std::move(q), d);
}

void write_chrome_trace(const TimelineData& data, std::ostream& out) {
  std::map<uint32_t, RealPid> real;
  const std::optional<TimelineData> remapped = with_unique_pids(data, real);
  const TimelineData& d = remapped ? *remapped : data;
  uint64_t t0 = UINT64_MAX;
  auto see = [&](uint64_t t) {
    if (t && t < t0) t0 = t;
  };
  for (const auto& c : d.collectives) see(c.enter_ns);
  for (const auto& a : d.device) see(a.start_ns);
  for (const auto& s : d.steps) see(s.start_ns);
  for (const auto& t : d.threads) see(t.start_ns);
  for (const auto& m : d.counters) see(m.start_ns);
  if (t0 == UINT64_MAX) t0 = 0;

  Writer w(out, t0);
  w.begin();
  // Processes: named by rank, sorted by rank (processes that are no rank come after).
  std::set<uint32_t> pids;
  for (const auto& c : d.collectives) pids.insert(c.pid);
  for (const auto& a : d.device) pids.insert(a.pid);
  for (const auto& t : d.threads) pids.insert(t.pid);
  for (const auto& s : d.steps) pids.insert(s.pid);
  std::map<uint32_t, const store::ProcessInfo*> info;
  for (const auto& p : d.processes) info[p.pid] = &p;
  for (uint32_t pid : pids) {
    auto it = info.find(pid);
    // The process's own pid, and its node where another node has the same pid.
    const RealPid& r = real[pid];
    const std::string where = (r.node.empty() ? "" : r.node + ", ") + "pid " + std::to_string(r.pid ? r.pid : pid);
    std::string name = where;
    int64_t order = 1'000'000 + pid;
    if (it != info.end()) {
      const auto& p = *it->second;
      if (p.rank >= 0) {
        name = "rank " + std::to_string(p.rank) + " (" + where + ", " + p.comm + ")";
        order = p.rank;
      } else {
        name = p.comm + " (" + where + ")";
      }
    }
    w.meta("process_name", pid, 0, name);
    w.sort_index("process_sort_index", pid, 0, order);
  }

  // CPU threads: on-CPU share per window as a counter, named by thread. A window's samples are at
  // its own rate (the cost budget lowers it), so the share divides by that rate.
  std::map<std::pair<uint32_t, uint32_t>, std::string> comm_of;
  for (const auto& t : d.threads) {
    if (!t.comm.empty()) comm_of[{t.pid, t.tid}] = t.comm;
    const unsigned hz = t.sample_hz ? t.sample_hz : d.sample_hz;
    double secs = static_cast<double>(t.end_ns - t.start_ns) / 1e9;
    double share = secs > 0 && hz ? static_cast<double>(t.samples) / (secs * hz) : 0;
    w.counter(t.pid, "on-CPU " + t.comm + " (" + std::to_string(t.tid) + ")", t.start_ns, "cpu", share);
  }
  // Host API calls of collectives on the calling thread, named as the samples know it.
  std::set<std::pair<uint32_t, uint32_t>> named;
  for (const auto& c : d.collectives) {
    if (named.insert({c.pid, c.tid}).second) {
      auto it = comm_of.find({c.pid, c.tid});
      w.meta("thread_name", c.pid, c.tid,
             it != comm_of.end() ? it->second + " (" + std::to_string(c.tid) + ")" : "thread " + std::to_string(c.tid));
    }
    w.slice(c.pid, c.tid, c.library + " " + c.op, "api", c.enter_ns, c.exit_ns,
            "\"seq\":" + std::to_string(c.seq) + ",\"bytes\":" + std::to_string(c.bytes));
  }
  // GPU streams.
  std::map<std::pair<uint32_t, std::pair<int, uint64_t>>, uint64_t> stream_track;
  for (const auto& a : d.device) {
    auto key = std::make_pair(a.pid, std::make_pair(a.device, a.stream));
    auto it = stream_track.find(key);
    if (it == stream_track.end()) {
      uint64_t tid = kStreamTrackBase + stream_track.size();
      it = stream_track.emplace(key, tid).first;
      char b[64];
      std::snprintf(b, sizeof b, "GPU %d stream 0x%llx", a.device, static_cast<unsigned long long>(a.stream));
      w.meta("thread_name", a.pid, tid, b);
      w.sort_index("thread_sort_index", a.pid, tid, static_cast<int64_t>(tid - kStreamTrackBase + 10));
    }
    w.slice(a.pid, it->second, a.name, a.kind.c_str(), a.start_ns, a.end_ns,
            "\"correlation\":" + std::to_string(a.correlation) + ",\"bytes\":" + std::to_string(a.bytes));
  }
  // Communicators: each collective's time on the device (or until completion was known).
  std::map<std::pair<uint32_t, std::string>, uint64_t> comm_track;
  std::map<std::pair<uint32_t, uint64_t>, const store::CommunicatorRecord*> comm_info;
  for (const auto& c : d.communicators) comm_info[{c.pid, c.handle}] = &c;
  for (const auto& c : d.collectives) {
    std::string key = c.comm_id.empty() ? std::to_string(c.comm_handle) : c.comm_id;
    auto it = comm_track.find({c.pid, key});
    if (it == comm_track.end()) {
      uint64_t tid = kCommTrackBase + comm_track.size();
      it = comm_track.emplace(std::make_pair(c.pid, key), tid).first;
      std::string name = c.library + " comm " + key;
      auto ci = comm_info.find({c.pid, c.comm_handle});
      if (ci != comm_info.end())
        name += " (rank " + std::to_string(ci->second->rank) + "/" + std::to_string(ci->second->nranks) + ")";
      w.meta("thread_name", c.pid, tid, name);
      w.sort_index("thread_sort_index", c.pid, tid, static_cast<int64_t>(tid - kCommTrackBase + 5));
    }
    uint64_t s = c.device_start_ns ? c.device_start_ns : c.enter_ns;
    uint64_t e = c.device_end_ns ? c.device_end_ns : c.exit_ns;
    w.slice(c.pid, it->second, c.op, "collective", s, e,
            "\"seq\":" + std::to_string(c.seq) + ",\"bytes\":" + std::to_string(c.bytes) + ",\"comm\":\"" +
                json_escape(key) + "\",\"completion\":\"" + c.completion + "\"");
  }
  // Steps.
  std::set<uint32_t> step_named;
  for (const auto& s : d.steps) {
    if (step_named.insert(s.pid).second) {
      w.meta("thread_name", s.pid, kStepTrack, "steps");
      w.sort_index("thread_sort_index", s.pid, kStepTrack, 0);
    }
    std::string args = "\"step\":" + std::to_string(s.step) + ",\"collective_ms\":" +
                       std::to_string(static_cast<double>(s.collective_ns) / 1e6);
    if (s.device_known) args += ",\"gpu_idle_ms\":" + std::to_string(static_cast<double>(s.gpu_idle_ns) / 1e6);
    w.slice(s.pid, kStepTrack, "step " + std::to_string(s.step), "step", s.start_ns, s.end_ns, args);
  }
  // Per-window metrics of a process as counter tracks (OS layer, GPU); a histogram is one track
  // with a series per bucket (below).
  struct Histogram {
    std::set<std::string, decltype(&bucket_before)> buckets{&bucket_before};
    std::map<uint64_t, std::map<std::string, double>> windows;  // start_ns -> bucket -> value
  };
  std::map<std::pair<uint32_t, std::string>, Histogram> histograms;
  for (const auto& m : d.counters) {
    if (m.metric.pid == 0) continue;
    if (is_histogram(m.metric.name) && !m.metric.label.empty()) {
      Histogram& h = histograms[{m.metric.pid, m.metric.name}];
      h.buckets.insert(m.metric.label);
      h.windows[m.start_ns][m.metric.label] += m.metric.value;
      continue;
    }
    std::string name = m.metric.name + (m.metric.label.empty() ? "" : " " + m.metric.label);
    w.counter(m.metric.pid, name, m.start_ns, "value", m.metric.value);
  }
  // Every bucket in every window: a counter series holds its last value until the next event, so a
  // bucket the window left empty is written as 0, not left at the previous window's count.
  for (const auto& [key, h] : histograms) {
    for (const auto& [start_ns, values] : h.windows) {
      std::vector<std::pair<std::string, double>> series;
      series.reserve(h.buckets.size());
      for (const auto& b : h.buckets) {
        auto it = values.find(b);
        series.emplace_back(b, it == values.end() ? 0.0 : it->second);
      }
      w.counter(key.first, key.second, start_ns, series);
    }
  }
  w.end();
}

}  // namespace strata::report
