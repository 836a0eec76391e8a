// The Store base's bounded reads (RowQuery), for stores that do not answer them in their own query
// language: read the unbounded rows, keep what the query asks for, in time order, one page.
#include <algorithm>

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

Result<std::vector<StepRecord>> Store::query_steps(const RowQuery& q) {
  auto rows = steps(q.recording, q.pid);
  if (!rows) return rows.error();
  return keep(std::move(*rows), q, [](const StepRecord& r) { return std::pair{r.start_ns, r.end_ns}; });
}

Result<std::vector<CollectiveRecord>> Store::query_collectives(const RowQuery& q) {
  auto rows = collectives(q.recording, q.pid);
  if (!rows) return rows.error();
  return keep(std::move(*rows), q, [](const CollectiveRecord& r) { return std::pair{r.enter_ns, std::max(r.exit_ns, r.enter_ns + 1)}; });
}

Result<std::vector<DeviceActivity>> Store::query_device_activity(const RowQuery& q) {
  auto rows = device_activity(q.recording, q.pid);
  if (!rows) return rows.error();
  return keep(std::move(*rows), q, [](const DeviceActivity& r) { return std::pair{r.start_ns, r.end_ns}; });
}

Result<std::vector<Store::MetricRow>> Store::query_metrics(const RowQuery& q) {
  auto rows = metrics(q.prefix, q.recording);
  if (!rows) return rows.error();
  if (q.pid) {
    std::erase_if(*rows, [&](const MetricRow& r) { return r.metric.pid != *q.pid; });
  }
  return keep(std::move(*rows), q, [](const MetricRow& r) { return std::pair{r.start_ns, r.end_ns}; });
}

Result<std::optional<uint64_t>> Store::latest_step_ns(std::optional<int64_t> recording) {
  auto rows = steps(recording, std::nullopt);
  if (!rows) return rows.error();
  std::optional<uint64_t> latest;
  for (const auto& r : *rows) latest = std::max(latest.value_or(0), r.end_ns);
  return latest;
}

Result<std::optional<int64_t>> Store::agent_id(const std::string& agent, AgentIdKind kind, int64_t local_id) {
  auto all = agent_ids(agent, kind);
  if (!all) return all.error();
  for (const auto& [l, s] : *all) {
    if (l == local_id) return std::optional<int64_t>{s};
  }
  return std::optional<int64_t>{};
}

Result<std::vector<std::pair<int64_t, int64_t>>> Store::recent_agent_ids(const std::string& agent, AgentIdKind kind,
                                                                        size_t limit) {
  auto all = agent_ids(agent, kind);
  if (!all) return all.error();
  std::sort(all->begin(), all->end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (all->size() > limit) all->resize(limit);
  return std::move(*all);
}

}  // namespace strata::store
