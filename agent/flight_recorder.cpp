#include "agent/flight_recorder.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <vector>

#include "common/json.h"
#include "common/parse.h"

namespace strata::agent {
namespace {

std::string jstr(const std::string& s) { return json_str(s); }

std::string jnum(uint64_t v) { return std::to_string(v); }
std::string jnum(int v) { return std::to_string(v); }
std::string jnum(uint32_t v) { return std::to_string(v); }

void collective_json(const store::CollectiveRecord& c, std::string& o) {
  o += "{\"tid\":" + jnum(c.tid) + ",\"library\":" + jstr(c.library) + ",\"op\":" + jstr(c.op) +
       ",\"comm_id\":" + jstr(c.comm_id) + ",\"seq\":" + jnum(c.seq) + ",\"count\":" + jnum(c.count) +
       ",\"dtype\":" + jnum(c.dtype) + ",\"bytes\":" + jnum(c.bytes) + ",\"redop\":" + jnum(c.redop) +
       ",\"peer\":" + jnum(c.peer) + ",\"stream\":" + jnum(c.stream) + ",\"enter_ns\":" + jnum(c.enter_ns) +
       ",\"exit_ns\":" + jnum(c.exit_ns) + ",\"device_start_ns\":" + jnum(c.device_start_ns) +
       ",\"device_end_ns\":" + jnum(c.device_end_ns) + ",\"completion\":" + jstr(c.completion) +
       ",\"ret\":" + jnum(c.ret) + "}";
}

void device_json(const store::DeviceActivity& d, std::string& o) {
  o += "{\"device\":" + jnum(d.device) + ",\"kind\":" + jstr(d.kind) + ",\"name\":" + jstr(d.name) +
       ",\"stream\":" + jnum(d.stream) + ",\"start_ns\":" + jnum(d.start_ns) + ",\"end_ns\":" + jnum(d.end_ns) +
       ",\"api_ns\":" + jnum(d.api_ns) + ",\"api_tid\":" + jnum(d.api_tid) + ",\"bytes\":" + jnum(d.bytes) + "}";
}

// The records of a ring that start inside [from, to], the newest `limit` of them; `total`: how
// many were inside.
template <typename T, typename StartOf>
std::vector<const T*> window(const std::deque<T>& ring, const DrilldownQuery& q, StartOf start_of, size_t& total) {
  std::vector<const T*> in;
  for (const auto& r : ring) {
    uint64_t s = start_of(r);
    if (s >= q.from_ns && s <= q.to_ns) in.push_back(&r);
  }
  total = in.size();
  if (in.size() > q.limit) in.erase(in.begin(), in.end() - static_cast<std::ptrdiff_t>(q.limit));
  return in;
}

}  // namespace

FlightRecorder::Proc& FlightRecorder::proc(uint32_t pid) {
  auto& p = procs_[pid];
  if (!p.known && p.info.pid == 0) p.info.pid = pid;
  return p;
}

void FlightRecorder::note_process(const store::ProcessInfo& info) {
  std::lock_guard lock(mu_);
  auto it = procs_.find(info.pid);
  // A pid reused by another process: the old one's records are not this one's.
  if (it != procs_.end() && !it->second.alive) procs_.erase(it);
  auto& p = proc(info.pid);
  p.info = info;
  p.known = true;
  p.alive = true;
}

void FlightRecorder::note_exit(uint32_t pid) {
  std::lock_guard lock(mu_);
  auto it = procs_.find(pid);
  if (it == procs_.end() || !it->second.alive) return;
  it->second.alive = false;
  it->second.exited_seq = ++exit_counter_;
  evict_exited();
}

void FlightRecorder::evict_exited() {
  size_t exited = 0;
  for (const auto& [pid, p] : procs_) exited += p.alive ? 0 : 1;
  while (exited > limits_.exited_processes) {
    auto oldest = procs_.end();
    for (auto it = procs_.begin(); it != procs_.end(); ++it)
      if (!it->second.alive && (oldest == procs_.end() || it->second.exited_seq < oldest->second.exited_seq)) oldest = it;
    procs_.erase(oldest);
    --exited;
  }
}

void FlightRecorder::add_collective(const store::CollectiveRecord& r) {
  std::lock_guard lock(mu_);
  auto& p = proc(r.pid);
  if (p.collectives.size() >= limits_.collectives_per_process) {
    p.collectives.pop_front();
    ++p.collectives_evicted;
  }
  p.collectives.push_back(r);
}

void FlightRecorder::add_device(const store::DeviceActivity& r) {
  std::lock_guard lock(mu_);
  auto& p = proc(r.pid);
  if (p.device.size() >= limits_.device_per_process) {
    p.device.pop_front();
    ++p.device_evicted;
  }
  p.device.push_back(r);
}

void FlightRecorder::add_devices(std::vector<store::DeviceActivity>&& rows) {
  std::lock_guard lock(mu_);
  Proc* p = nullptr;
  uint32_t pid = 0;
  for (auto& r : rows) {
    if (!p || r.pid != pid) {
      pid = r.pid;
      p = &proc(pid);
    }
    if (p->device.size() >= limits_.device_per_process) {
      p->device.pop_front();
      ++p->device_evicted;
    }
    p->device.push_back(std::move(r));
  }
}

std::string FlightRecorder::query_json(const DrilldownQuery& q, const std::string& node, uint64_t now_ns) const {
  std::lock_guard lock(mu_);
  std::string o = "{\"node\":" + jstr(node) + ",\"now_ns\":" + jnum(now_ns) + ",\"from_ns\":" + jnum(q.from_ns) +
                  ",\"to_ns\":" + jnum(q.to_ns) + ",\"limits\":{\"collectives_per_process\":" +
                  jnum(static_cast<uint64_t>(limits_.collectives_per_process)) +
                  ",\"device_per_process\":" + jnum(static_cast<uint64_t>(limits_.device_per_process)) +
                  "},\"processes\":[";
  bool first = true;
  for (const auto& [pid, p] : procs_) {
    if (q.pid && pid != *q.pid) continue;
    if (q.rank && p.info.rank != *q.rank) continue;
    o += first ? "" : ",";
    first = false;
    o += "{\"pid\":" + jnum(pid) + ",\"rank\":" + jnum(p.info.rank) + ",\"local_rank\":" + jnum(p.info.local_rank) +
         ",\"world_size\":" + jnum(p.info.world_size) + ",\"job\":" + jstr(p.info.job) + ",\"comm\":" +
         jstr(p.info.comm) + ",\"start_ns\":" + jnum(p.info.start_ns) + ",\"alive\":" + (p.alive ? "true" : "false");
    if (q.collectives) {
      size_t total = 0;
      auto rows = window(p.collectives, q, [](const store::CollectiveRecord& c) { return c.enter_ns; }, total);
      o += ",\"collectives_in_window\":" + jnum(static_cast<uint64_t>(total)) +
           ",\"collectives_evicted\":" + jnum(p.collectives_evicted) + ",\"collectives\":[";
      for (size_t i = 0; i < rows.size(); ++i) {
        if (i) o += ",";
        collective_json(*rows[i], o);
      }
      o += "]";
    }
    if (q.device) {
      size_t total = 0;
      auto rows = window(p.device, q, [](const store::DeviceActivity& d) { return d.start_ns; }, total);
      o += ",\"device_in_window\":" + jnum(static_cast<uint64_t>(total)) +
           ",\"device_evicted\":" + jnum(p.device_evicted) + ",\"device\":[";
      for (size_t i = 0; i < rows.size(); ++i) {
        if (i) o += ",";
        device_json(*rows[i], o);
      }
      o += "]";
    }
    o += "}";
  }
  return o + "]}\n";
}

std::optional<uint64_t> parse_duration_ns(const std::string& text) {
  if (text.empty() || text.size() > 24) return std::nullopt;
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.'))
    ++digits;
  if (digits == 0) return std::nullopt;
  auto parsed = parse_double(std::string_view(text).substr(0, digits));
  if (!parsed) return std::nullopt;
  double v = *parsed;
  std::string unit = text.substr(digits);
  double scale;
  if (unit.empty() || unit == "s") scale = 1e9;
  else if (unit == "ms") scale = 1e6;
  else if (unit == "m") scale = 60e9;
  else if (unit == "h") scale = 3600e9;
  else return std::nullopt;
  double ns = v * scale;
  if (!std::isfinite(ns) || ns < 0 || ns > 1e19) return std::nullopt;
  return static_cast<uint64_t>(ns);
}

}  // namespace strata::agent
