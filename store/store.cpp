// The Store base's bounded reads (RowQuery), for stores that do not answer them in their own query
// language: read the unbounded rows, keep what the query asks for, in time order, one page.
#include <algorithm>
#include <ctime>
#include <set>
#include <string>

#include "store/store.h"

namespace strata::store {
namespace {

template <typename Row, typename Span>
std::vector<Row> keep(std::vector<Row> rows, const RowQuery& q, Span span) {
  std::vector<Row> out;
  for (auto& r : rows) {
    auto [start, end] = span(r);
    if (q.node && r.node != *q.node) continue;
    if (q.from_ns && end <= *q.from_ns) continue;
    if (q.to_ns && start >= *q.to_ns) continue;
    out.push_back(std::move(r));
  }
  std::stable_sort(out.begin(), out.end(), [&](const Row& a, const Row& b) { return span(a).first < span(b).first; });
  const size_t first = static_cast<size_t>(std::min<uint64_t>(q.offset, out.size()));
  out.erase(out.begin(), out.begin() + static_cast<long>(first));
  if (q.limit && out.size() > q.limit) out.resize(static_cast<size_t>(q.limit));
  return out;
}

}  // namespace

std::vector<ReducedFidelity> reduced_runs(const std::vector<FidelityWindow>& windows) {
  std::vector<ReducedFidelity> out;
  bool open = false;  // whether out.back() is the run the previous window belongs to
  for (const auto& w : windows) {
    const unsigned hz = w.sample_hz ? w.sample_hz : w.configured_hz;
    const bool reduced = hz < w.configured_hz || unwinding_reduced(w.unwinding);
    if (!reduced) {
      open = false;
      continue;
    }
    if (open) {
      ReducedFidelity& r = out.back();
      // Windows follow each other without a gap (each starts where the one before ended): a gap
      // is a window of full fidelity (or none) between, and starts another run.
      if (r.recording == w.recording && r.sample_hz == hz && r.unwinding == w.unwinding && w.start_ns <= r.end_ns) {
        r.end_ns = std::max(r.end_ns, w.end_ns);
        ++r.windows;
        continue;
      }
    }
    out.push_back({w.recording, w.node, w.start_ns, w.end_ns, 1, w.configured_hz, hz, w.unwinding});
    open = true;
  }
  std::stable_sort(out.begin(), out.end(), [](const ReducedFidelity& a, const ReducedFidelity& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.node < b.node;
  });
  return out;
}

namespace {

std::string utc(uint64_t ns, const char* format) {
  const std::time_t t = static_cast<std::time_t>(ns / 1'000'000'000ull);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[64];
  std::strftime(b, sizeof b, format, &tm);
  return b;
}

// "rank 3", "ranks 0-3", "ranks 0,2,5": a node's ranks, consecutive ones as a range.
std::string ranks_text(const std::set<int>& ranks) {
  if (ranks.empty()) return "";
  std::string out;
  for (auto it = ranks.begin(); it != ranks.end();) {
    int first = *it, last = *it;
    for (++it; it != ranks.end() && *it == last + 1; ++it) last = *it;
    out += (out.empty() ? "" : ",") + std::to_string(first) + (last > first ? "-" + std::to_string(last) : "");
  }
  return (ranks.size() == 1 ? "rank " : "ranks ") + out;
}

}  // namespace

std::string describe_reduced_fidelity(const ReducedFidelity& r, const std::vector<ProcessInfo>& procs) {
  std::set<int> ranks;
  for (const auto& p : procs)
    if (p.node == r.node && p.rank >= 0) ranks.insert(p.rank);
  std::string out = r.node.empty() ? std::string("(no node)") : r.node;
  if (!ranks.empty()) out += " (" + ranks_text(ranks) + ")";
  out += ", " + utc(r.start_ns, "%Y-%m-%d %H:%M:%S") + " - " +
         utc(r.end_ns, r.end_ns / 86'400'000'000'000ull == r.start_ns / 86'400'000'000'000ull ? "%H:%M:%S" : "%Y-%m-%d %H:%M:%S") +
         " UTC, " + std::to_string(r.windows) + (r.windows == 1 ? " window: " : " windows: ");
  std::string what;
  if (r.sample_hz < r.configured_hz)
    what = std::to_string(r.sample_hz) + " Hz instead of " + std::to_string(r.configured_hz) + " Hz";
  if (unwinding_reduced(r.unwinding)) what += (what.empty() ? "" : "; ") + std::string("frame pointers only (CFI unwinding off)");
  return out + what;
}

Result<std::vector<StepRecord>> Reader::query_steps(const RowQuery& q) {
  auto rows = steps(q.recording, q.pid);
  if (!rows) return rows.error();
  return keep(std::move(*rows), q, [](const StepRecord& r) { return std::pair{r.start_ns, r.end_ns}; });
}

Result<std::vector<CollectiveRecord>> Reader::query_collectives(const RowQuery& q) {
  auto rows = collectives(q.recording, q.pid);
  if (!rows) return rows.error();
  return keep(std::move(*rows), q, [](const CollectiveRecord& r) { return std::pair{r.enter_ns, std::max(r.exit_ns, r.enter_ns + 1)}; });
}

Result<std::vector<DeviceActivity>> Reader::query_device_activity(const RowQuery& q) {
  auto rows = device_activity(q.recording, q.pid);
  if (!rows) return rows.error();
  return keep(std::move(*rows), q, [](const DeviceActivity& r) { return std::pair{r.start_ns, r.end_ns}; });
}

Result<std::vector<Reader::MetricRow>> Reader::query_metrics(const RowQuery& q) {
  auto rows = metrics(q.prefix, q.recording);
  if (!rows) return rows.error();
  if (q.pid) {
    std::erase_if(*rows, [&](const MetricRow& r) { return r.metric.pid != *q.pid; });
  }
  return keep(std::move(*rows), q, [](const MetricRow& r) { return std::pair{r.start_ns, r.end_ns}; });
}

namespace {

template <typename Row, typename PidOf>
Status append_to(Result<std::vector<Row>> rows, const RowQuery& q, PidOf pid_of, std::vector<Row>& out) {
  if (!rows) return rows.error();
  for (auto& r : *rows) {
    if (!q.keep_process || q.keep_process(r.node, pid_of(r))) out.push_back(std::move(r));
  }
  return {};
}

uint32_t pid_of_row(const auto& r) { return r.pid; }

}  // namespace

Status Reader::append_steps(const RowQuery& q, std::vector<StepRecord>& out) {
  return append_to(query_steps(q), q, pid_of_row<StepRecord>, out);
}
Status Reader::append_collectives(const RowQuery& q, std::vector<CollectiveRecord>& out) {
  return append_to(query_collectives(q), q, pid_of_row<CollectiveRecord>, out);
}
Status Reader::append_device_activity(const RowQuery& q, std::vector<DeviceActivity>& out) {
  return append_to(query_device_activity(q), q, pid_of_row<DeviceActivity>, out);
}
Status Reader::append_metrics(const RowQuery& q, std::vector<MetricRow>& out) {
  return append_to(query_metrics(q), q, [](const MetricRow& r) { return r.metric.pid; }, out);
}

Result<std::optional<uint64_t>> Reader::latest_step_ns(std::optional<int64_t> recording) {
  auto rows = steps(recording, std::nullopt);
  if (!rows) return rows.error();
  std::optional<uint64_t> latest;
  for (const auto& r : *rows) latest = std::max(latest.value_or(0), r.end_ns);
  return latest;
}

Result<std::optional<int64_t>> Ledger::agent_id(const std::string& agent, AgentIdKind kind, int64_t local_id) {
  auto all = agent_ids(agent, kind);
  if (!all) return all.error();
  for (const auto& [l, s] : *all) {
    if (l == local_id) return std::optional<int64_t>{s};
  }
  return std::optional<int64_t>{};
}

Result<std::vector<std::pair<int64_t, int64_t>>> Ledger::recent_agent_ids(const std::string& agent, AgentIdKind kind,
                                                                        size_t limit) {
  auto all = agent_ids(agent, kind);
  if (!all) return all.error();
  std::sort(all->begin(), all->end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (all->size() > limit) all->resize(limit);
  return std::move(*all);
}

std::string in_flight_label(const InFlightCall& c) {
  return c.library + "|" + c.op + "|" + c.comm_id + "|" + std::to_string(c.seq);
}

std::optional<InFlightCall> parse_in_flight_label(const std::string& label) {
  std::vector<std::string> parts;
  size_t from = 0;
  for (size_t bar; (bar = label.find('|', from)) != std::string::npos; from = bar + 1) parts.push_back(label.substr(from, bar - from));
  parts.push_back(label.substr(from));
  if (parts.size() != 4 || parts[0].empty() || parts[1].empty() || parts[3].empty()) return std::nullopt;
  InFlightCall c{parts[0], parts[1], parts[2], 0};
  for (char ch : parts[3]) {
    if (ch < '0' || ch > '9' || c.seq > (UINT64_MAX - 9) / 10) return std::nullopt;
    c.seq = c.seq * 10 + static_cast<uint64_t>(ch - '0');
  }
  return c;
}

}  // namespace strata::store
