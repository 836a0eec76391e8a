// Trace Event JSON (the chrome://tracing / Perfetto format): one process per rank, with tracks for
// its CPU threads (on-CPU samples per window, host API calls), GPU streams (kernels, copies,
// collective kernels), communicators (collectives), steps, and counter tracks for OS and GPU metrics.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "store/store.h"

namespace strata::report {

struct ThreadActivity {
  uint64_t start_ns = 0, end_ns = 0;  // the window
  uint32_t pid = 0, tid = 0;
  std::string comm;
  uint64_t samples = 0;
  std::string node;  // pids repeat across nodes
  unsigned sample_hz = 0;  // the window's sampling rate (the cost budget lowers it); 0: TimelineData's
};

// Everything the timeline shows, already read from a store (times in unix ns).
struct TimelineData {
  std::vector<store::ProcessInfo> processes;
  std::vector<store::CommunicatorRecord> communicators;
  std::vector<store::CollectiveRecord> collectives;
  std::vector<store::DeviceActivity> device;
  std::vector<store::StepRecord> steps;
  std::vector<ThreadActivity> threads;
  std::vector<store::Store::MetricRow> counters;  // per-window metrics shown as counter tracks
  unsigned sample_hz = 99;
};

// Appends a store's on-CPU thread windows to `d` as thread tracks.
void add_threads(const std::vector<store::Reader::ThreadWindow>& windows, TimelineData& d);

// Appends the rows `q` selects (its recording, node, pid and span) to `d`: collectives, device
// activity, steps, on-CPU thread tracks and OS counters (`q.prefix` is set to "os." for them).
Status append_rows(store::Reader& store, store::RowQuery q, TimelineData& d);

// Appends one process's rows (node, pid) to `d`: its collectives, device activity, steps, on-CPU
// thread tracks and OS counters, each read for that process alone (a collector's store holds every
// node's history; read whole and filtered, it would all be in memory at once). With `from_ns` /
// `to_ns`, only the rows whose time overlaps [from_ns, to_ns): a rank's timeline in a collector that
// has run for a week reads the span asked, not the week.
Status append_process(store::Reader& store, const std::string& node, uint32_t pid, TimelineData& d,
                      std::optional<uint64_t> from_ns = std::nullopt, std::optional<uint64_t> to_ns = std::nullopt);

// Writes {"traceEvents":[...],"displayTimeUnit":"ms"}; timestamps in µs from the earliest event.
// With `pid` set, only that process. Threads are named by their comm ("comm (tid)") where the
// samples know it. A histogram metric (name ending ".hist", one label "le=N" per bucket) is one
// counter track per process whose series are its buckets, every bucket in every window (0 where
// the window had none), so the track shows the distribution rather than a track per bucket.
void write_chrome_trace(const TimelineData& data, std::ostream& out);

}  // namespace strata::report
