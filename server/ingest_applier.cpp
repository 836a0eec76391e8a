#include "server/ingest_applier.h"

#include <algorithm>
#include <vector>

#include "store/catalog.h"

namespace strata::server {
namespace {

constexpr size_t kMaxFramesPerStack = 4096;

store::ProcessInfo from_proto(const ingest::Process& p) {
  store::ProcessInfo r;
  r.pid = p.pid();
  r.ppid = p.ppid();
  r.start_ns = p.start_ns();
  r.node = p.node();
  r.comm = p.comm();
  r.command = p.command();
  r.job = p.job();
  r.rank = p.rank();
  r.local_rank = p.local_rank();
  r.world_size = p.world_size();
  r.pod_uid = p.pod_uid();
  r.container_id = p.container_id();
  r.pod_name = p.pod_name();
  r.pod_namespace = p.pod_namespace();
  return r;
}

Frame from_proto(const ingest::Frame& f) {
  Frame r;
  r.kind = static_cast<FrameKind>(f.kind());
  r.build_id = f.build_id();
  r.module = f.module();
  r.offset = f.offset();
  r.function = f.function();
  r.file = f.file();
  r.line = f.line();
  return r;
}

}  // namespace

uint64_t batch_rows(const ingest::Batch& b) {
  uint64_t n = 0;
  for (const auto& r : b.records()) {
    switch (r.kind_case()) {
      case ingest::Record::kStack: n += 1 + static_cast<uint64_t>(r.stack().frames_size()); break;
      case ingest::Record::kWindow: n += static_cast<uint64_t>(r.window().counts_size()); break;
      case ingest::Record::kMetrics: n += static_cast<uint64_t>(r.metrics().metrics_size()); break;
      case ingest::Record::kCommunicators: n += static_cast<uint64_t>(r.communicators().rows_size()); break;
      case ingest::Record::kCollectives: n += static_cast<uint64_t>(r.collectives().rows_size()); break;
      case ingest::Record::kDeviceActivity: n += static_cast<uint64_t>(r.device_activity().rows_size()); break;
      case ingest::Record::kSteps: n += static_cast<uint64_t>(r.steps().rows_size()); break;
      case ingest::Record::kLaunchSamples: n += static_cast<uint64_t>(r.launch_samples().rows_size()); break;
      default: n += 1; break;
    }
  }
  return n;
}

Status validate_batch(const ingest::Batch& b) {
  for (int i = 0; i < b.records_size(); ++i) {
    const auto& r = b.records(i);
    auto bad = [&](const std::string& why) {
      return Error{"malformed batch: record " + std::to_string(i) + ": " + why};
    };
    switch (r.kind_case()) {
      case ingest::Record::KIND_NOT_SET:
        return bad("empty record (unknown kind from a newer agent?)");
      case ingest::Record::kStack:
        if (r.stack().method() > static_cast<uint32_t>(store::UnwindMethod::kKernelOnly)) return bad("unknown unwind method");
        if (static_cast<size_t>(r.stack().frames_size()) > kMaxFramesPerStack) return bad("stack too deep");
        for (const auto& f : r.stack().frames())
          if (f.kind() > static_cast<uint32_t>(FrameKind::kCuda)) return bad("unknown frame kind");
        break;
      case ingest::Record::kWindow:
        if (r.window().kind() > static_cast<uint32_t>(store::CountKind::kOffCpu)) return bad("unknown count kind");
        if (r.window().end_ns() < r.window().start_ns()) return bad("window ends before it starts");
        break;
      default:
        break;
    }
  }
  return {};
}

Result<IngestApplier::AgentMaps*> IngestApplier::maps_for(const std::string& agent) {
  ++batches_;
  auto it = agents_.find(agent);
  if (it != agents_.end()) {
    it->second.used = batches_;
    return &it->second;
  }
  AgentMaps m;
  const size_t half = std::max<size_t>(1, max_per_agent_ / 2);
  auto recs = ledger_.recent_agent_ids(agent, store::AgentIdKind::kRecording, half);
  if (!recs) return recs.error();
  auto stacks = ledger_.recent_agent_ids(agent, store::AgentIdKind::kStack, half);
  if (!stacks) return stacks.error();
  for (auto [l, s] : *recs) m.recordings[l] = s;
  for (auto [l, s] : *stacks) m.stacks[l] = s;
  m.used = batches_;
  cached_ += m.size();
  auto* out = &agents_.emplace(agent, std::move(m)).first->second;
  evict_to_budget(agent);
  return out;
}

void IngestApplier::evict_to_budget(const std::string& keep) {
  while (cached_ > max_cached_ && agents_.size() > 1) {
    auto oldest = agents_.end();
    for (auto it = agents_.begin(); it != agents_.end(); ++it) {
      if (it->first != keep && (oldest == agents_.end() || it->second.used < oldest->second.used)) oldest = it;
    }
    if (oldest == agents_.end()) break;
    cached_ -= oldest->second.size();
    agents_.erase(oldest);
  }
}

Result<std::optional<int64_t>> IngestApplier::lookup(const std::string& agent, store::AgentIdKind kind, AgentMaps& m,
                                                     AgentMaps& added, int64_t local) {
  const bool rec = kind == store::AgentIdKind::kRecording;
  auto& fresh = rec ? added.recordings : added.stacks;
  if (auto it = fresh.find(local); it != fresh.end()) return std::optional<int64_t>{it->second};
  auto& cache = rec ? m.recordings : m.stacks;
  if (auto it = cache.find(local); it != cache.end()) return std::optional<int64_t>{it->second};
  // Older than what is cached: the store has every mapping.
  auto id = ledger_.agent_id(agent, kind, local);
  if (!id) return id.error();
  if (*id) fresh[local] = **id;  // cached with the batch's own once it commits
  return *id;
}

void IngestApplier::remember(AgentMaps& m, const AgentMaps& added) {
  // An agent past its share starts over (its own dictionary did too); the store still answers.
  if (m.size() + added.size() > max_per_agent_) {
    cached_ -= m.size();
    m.recordings.clear();
    m.stacks.clear();
  }
  for (auto& [l, s] : added.recordings) cached_ += m.recordings.insert_or_assign(l, s).second ? 1 : 0;
  for (auto& [l, s] : added.stacks) cached_ += m.stacks.insert_or_assign(l, s).second ? 1 : 0;
}

Result<int64_t> IngestApplier::recording(const ingest::Batch& b, AgentMaps& m, AgentMaps& added, int64_t local,
                                         ApplyOutcome& o) {
  auto known = lookup(b.agent_id(), store::AgentIdKind::kRecording, m, added, local);
  if (!known) return known.error();
  if (*known) return **known;
  // Its begin_recording was in a batch the agent's full spool dropped: keep the rows, under a
  // recording that says so.
  ++o.lost_refs;
  store::RecordingInfo info;
  info.node = b.node();
  info.command = "[recording start lost by agent " + b.agent_id() + "]";
  auto id = rows_.begin_recording(info);
  if (!id) return id.error();
  if (auto st = ledger_.put_agent_id(b.agent_id(), store::AgentIdKind::kRecording, local, *id); !st) return st.error();
  added.recordings[local] = *id;
  return *id;
}

Result<int64_t> IngestApplier::stack(const ingest::Batch& b, AgentMaps& m, AgentMaps& added, int64_t local,
                                     ApplyOutcome& o) {
  auto known = lookup(b.agent_id(), store::AgentIdKind::kStack, m, added, local);
  if (!known) return known.error();
  if (*known) return **known;
  ++o.lost_refs;  // defined in a batch the agent dropped: the samples stay, their stack is unknown
  Frame f;
  f.module = "[unknown]";
  f.function = "[stack lost by agent]";
  auto id = rows_.intern_stack(Stack{f}, store::UnwindMethod::kFramePointer);
  if (!id) return id.error();
  if (auto st = ledger_.put_agent_id(b.agent_id(), store::AgentIdKind::kStack, local, *id); !st) return st.error();
  added.stacks[local] = *id;
  return *id;
}

Status IngestApplier::apply_records(const ingest::Batch& b, AgentMaps& m, AgentMaps& added, ApplyOutcome& o) {
  const std::string& agent = b.agent_id();
  for (const auto& r : b.records()) {
    switch (r.kind_case()) {
      case ingest::Record::kRecording: {
        const auto& p = r.recording();
        store::RecordingInfo info;
        // One agent speaks for one node, the batch's: a row's node is its recording's, and a
        // process's node must be the same for the two to join (identity is node + pid).
        info.node = b.node();
        info.command = p.command();
        info.started_ns = p.started_ns();
        info.sample_hz = p.sample_hz();
        info.window_s = p.window_s();
        auto id = rows_.begin_recording(info);
        if (!id) return id.error();
        if (auto st = ledger_.put_agent_id(agent, store::AgentIdKind::kRecording, p.local_id(), *id); !st) return st;
        added.recordings[p.local_id()] = *id;
        o.rows["recordings"]++;
        break;
      }
      case ingest::Record::kRecordingEnd: {
        auto rec = recording(b, m, added, r.recording_end().recording(), o);
        if (!rec) return rec.error();
        if (auto st = rows_.end_recording(*rec, r.recording_end().ended_ns()); !st) return st;
        o.rows["recording_ends"]++;
        break;
      }
      case ingest::Record::kProcess: {
        auto rec = recording(b, m, added, r.process().recording(), o);
        if (!rec) return rec.error();
        store::ProcessInfo proc = from_proto(r.process());
        proc.node = b.node();  // as the recording's (above)
        if (auto st = rows_.put_process(*rec, proc); !st) return st;
        o.rows["processes"]++;
        break;
      }
      case ingest::Record::kStack: {
        Stack s;
        s.reserve(static_cast<size_t>(r.stack().frames_size()));
        for (const auto& f : r.stack().frames()) s.push_back(from_proto(f));
        auto id = rows_.intern_stack(s, static_cast<store::UnwindMethod>(r.stack().method()));
        if (!id) return id.error();
        if (auto st = ledger_.put_agent_id(agent, store::AgentIdKind::kStack, r.stack().local_id(), *id); !st) return st;
        added.stacks[r.stack().local_id()] = *id;
        o.rows["stacks"]++;
        break;
      }
      case ingest::Record::kWindow: {
        const auto& w = r.window();
        auto rec = recording(b, m, added, w.recording(), o);
        if (!rec) return rec.error();
        std::vector<store::StackCount> counts;
        counts.reserve(static_cast<size_t>(w.counts_size()));
        for (const auto& c : w.counts()) {
          auto sid = stack(b, m, added, c.stack(), o);
          if (!sid) return sid.error();
          counts.push_back({c.pid(), c.tid(), c.thread_comm(), *sid, c.value()});
        }
        // An older agent says nothing of the window's fidelity: 0 / "" (the recording's rate).
        const store::WindowFidelity fidelity{w.sample_hz(), w.unwinding()};
        if (auto st = rows_.put_window(*rec, w.start_ns(), w.end_ns(), static_cast<store::CountKind>(w.kind()), counts,
                                        fidelity);
            !st)
          return st;
        o.rows["stack_counts"] += counts.size();
        break;
      }
      case ingest::Record::kMetrics: {
        const auto& x = r.metrics();
        auto rec = recording(b, m, added, x.recording(), o);
        if (!rec) return rec.error();
        std::vector<store::Metric> rows;
        rows.reserve(static_cast<size_t>(x.metrics_size()));
        for (const auto& p : x.metrics()) rows.push_back(store::catalog::from_message(store::catalog::kMetrics, p));
        if (auto st = rows_.put_metrics(*rec, x.start_ns(), x.end_ns(), rows); !st) return st;
        o.rows["metrics"] += rows.size();
        break;
      }
      case ingest::Record::kCommunicators: {
        const auto& x = r.communicators();
        auto rec = recording(b, m, added, x.recording(), o);
        if (!rec) return rec.error();
        std::vector<store::CommunicatorRecord> rows;
        for (const auto& p : x.rows()) rows.push_back(store::catalog::from_message(store::catalog::kCommunicators, p));
        if (auto st = rows_.put_communicators(*rec, rows); !st) return st;
        o.rows["communicators"] += rows.size();
        break;
      }
      case ingest::Record::kCollectives: {
        const auto& x = r.collectives();
        auto rec = recording(b, m, added, x.recording(), o);
        if (!rec) return rec.error();
        std::vector<store::CollectiveRecord> rows;
        rows.reserve(static_cast<size_t>(x.rows_size()));
        for (const auto& p : x.rows()) rows.push_back(store::catalog::from_message(store::catalog::kCollectives, p));
        if (auto st = rows_.put_collectives(*rec, rows); !st) return st;
        o.rows["collectives"] += rows.size();
        break;
      }
      case ingest::Record::kDeviceActivity: {
        const auto& x = r.device_activity();
        auto rec = recording(b, m, added, x.recording(), o);
        if (!rec) return rec.error();
        std::vector<store::DeviceActivity> rows;
        rows.reserve(static_cast<size_t>(x.rows_size()));
        for (const auto& p : x.rows()) rows.push_back(store::catalog::from_message(store::catalog::kDeviceActivity, p));
        if (auto st = rows_.put_device_activity(*rec, rows); !st) return st;
        o.rows["device_activity"] += rows.size();
        break;
      }
      case ingest::Record::kSteps: {
        const auto& x = r.steps();
        auto rec = recording(b, m, added, x.recording(), o);
        if (!rec) return rec.error();
        std::vector<store::StepRecord> rows;
        rows.reserve(static_cast<size_t>(x.rows_size()));
        for (const auto& p : x.rows()) rows.push_back(store::catalog::from_message(store::catalog::kSteps, p));
        if (auto st = rows_.put_steps(*rec, rows); !st) return st;
        o.rows["steps"] += rows.size();
        break;
      }
      case ingest::Record::kLaunchSamples: {
        const auto& x = r.launch_samples();
        auto rec = recording(b, m, added, x.recording(), o);
        if (!rec) return rec.error();
        std::vector<store::LaunchSample> rows;
        for (const auto& p : x.rows()) {
          auto sid = stack(b, m, added, p.stack(), o);
          if (!sid) return sid.error();
          rows.push_back(store::catalog::from_message(store::catalog::kLaunchSamples, p));
          rows.back().stack_id = *sid;  // the agent's StackDef id, as this store's
        }
        if (auto st = rows_.put_launch_samples(*rec, x.start_ns(), x.end_ns(), rows); !st) return st;
        o.rows["launch_samples"] += rows.size();
        break;
      }
      case ingest::Record::kStat: {
        auto rec = recording(b, m, added, r.stat().recording(), o);
        if (!rec) return rec.error();
        if (auto st = rows_.put_stat(*rec, r.stat().key(), r.stat().value()); !st) return st;
        o.rows["stats"]++;
        break;
      }
      case ingest::Record::KIND_NOT_SET:
        return Error{"malformed batch: empty record"};
    }
  }
  return {};
}

Result<ApplyOutcome> IngestApplier::apply(const ingest::Batch& b, const std::string& health_json, uint64_t now_ns) {
  GroupItem item{&b, &health_json, now_ns};
  GroupItem* one = &item;
  apply_group({&one, 1});
  return std::move(item.out);
}

void IngestApplier::apply_group(std::span<GroupItem* const> items) {
  if (items.empty()) return;
  Status together = apply_together(items);
  if (!together && items.size() > 1) {
    // The whole group was rolled back: each batch on its own, so only one that fails again fails.
    for (GroupItem* item : items) {
      if (auto st = apply_together({&item, 1}); !st) item->out = st.error();
    }
  } else if (!together) {
    items[0]->out = together.error();
  }
  for (GroupItem* item : items) item->done = true;
}

Status IngestApplier::apply_together(std::span<GroupItem* const> items) {
  if (auto st = rows_.begin(); !st) return st;
  auto fail = [&](const Error& e) -> Status {
    (void)rows_.rollback();
    return e;
  };
  // Per agent, the ids this transaction mapped: merged into the cache only once it commits. A later
  // batch of the same agent in the group finds its earlier batch's here.
  std::unordered_map<std::string, AgentMaps> added;
  std::vector<ApplyOutcome> outs(items.size());
  {
    std::vector<std::pair<std::string, uint64_t>> batches;
    batches.reserve(items.size());
    for (const GroupItem* item : items) batches.emplace_back(item->batch->agent_id(), item->batch->batch_id());
    if (auto st = ledger_.prepare_batches(batches); !st) return fail(st.error());
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const ingest::Batch& b = *items[i]->batch;
    ApplyOutcome& o = outs[i];
    auto maps = maps_for(b.agent_id());
    if (!maps) return fail(maps.error());
    auto seen = ledger_.batch_applied(b.agent_id(), b.batch_id());
    if (!seen) return fail(seen.error());
    if (*seen) {
      o.duplicate = true;
    } else {
      if (auto st = ledger_.begin_batch(b.agent_id(), b.batch_id()); !st) return fail(st.error());
      if (auto st = apply_records(b, **maps, added[b.agent_id()], o); !st) return fail(st.error());
      if (auto st = ledger_.mark_batch_applied(b.agent_id(), b.batch_id(), items[i]->now_ns); !st)
        return fail(st.error());
    }
    store::AgentStatus a;
    a.agent_id = b.agent_id();
    a.node = b.node();
    a.last_seen_ns = items[i]->now_ns;
    a.last_batch = b.batch_id();
    a.interval_s = b.health().interval_s();
    a.health_json = *items[i]->health_json;
    if (auto st = ledger_.put_agent_status(a); !st) return fail(st.error());
  }
  if (auto st = rows_.commit(); !st) return fail(st.error());
  for (size_t i = 0; i < items.size(); ++i) items[i]->out = std::move(outs[i]);
  // An agent whose cache another agent's batch pushed out meanwhile has nothing to add to: the
  // store holds its mappings.
  for (auto& [agent, a] : added) {
    if (auto it = agents_.find(agent); it != agents_.end()) remember(it->second, a);
  }
  evict_to_budget(items.back()->batch->agent_id());
  return {};
}

}  // namespace strata::server
