// The agent's flight recorder (DESIGN §2, "detail on demand"): the raw records that only ship as
// summaries (each collective call, each device activity) kept per process in bounded rings, for the
// diagnosis to drill into. Written by the sources on the agent's main thread, read by its HTTP
// thread (GET /drilldown), hence the lock.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "store/store.h"

namespace strata::agent {

struct FlightRecorderLimits {
  size_t collectives_per_process = 4096;
  size_t device_per_process = 8192;
  size_t exited_processes = 64;  // rings of processes that ended, kept for a late look
};

struct DrilldownQuery {
  std::optional<uint32_t> pid;
  std::optional<int> rank;
  uint64_t from_ns = 0;  // unix ns; a record is in when it starts inside [from, to]
  uint64_t to_ns = UINT64_MAX;
  size_t limit = 10000;  // per process and kind; the newest are kept when over
  bool collectives = true;
  bool device = true;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(FlightRecorderLimits limits = {}) : limits_(limits) {}

  // Who a pid is (job, rank), for queries by rank; again on exec.
  void note_process(const store::ProcessInfo& p);
  void note_exit(uint32_t pid);
  // Times in unix ns.
  void add_collective(const store::CollectiveRecord& r);
  void add_device(const store::DeviceActivity& r);
  // Many at once, in order (one lock, moved in): as add_device for each.
  void add_devices(std::vector<store::DeviceActivity>&& rows);

  // The records of the matching processes inside the window, as JSON:
  // {"node":..,"now_ns":..,"from_ns":..,"to_ns":..,"processes":[{"pid":..,"rank":..,"job":..,
  //  "alive":..,"collectives":[...],"collectives_total":..,"collectives_evicted":..,"device":[...],...}]}
  std::string query_json(const DrilldownQuery& q, const std::string& node, uint64_t now_ns) const;

 private:
  struct Proc {
    store::ProcessInfo info;
    bool known = false;  // note_process was called
    bool alive = true;
    uint64_t exited_seq = 0;
    std::deque<store::CollectiveRecord> collectives;
    std::deque<store::DeviceActivity> device;
    uint64_t collectives_evicted = 0, device_evicted = 0;
  };
  Proc& proc(uint32_t pid);
  void evict_exited();

  FlightRecorderLimits limits_;
  mutable std::mutex mu_;
  std::map<uint32_t, Proc> procs_;
  uint64_t exit_counter_ = 0;
};

// Parses a duration such as 30s, 2m, 500ms, 1h or a bare number of seconds; nullopt when malformed.
std::optional<uint64_t> parse_duration_ns(const std::string& text);

}  // namespace strata::agent
