// A source of one layer's data (off-CPU, OS metrics, CUDA, NCCL, NVML, ...), driven by the recorder
// or the agent: told about the watched processes, polled, and flushed into the store every window.
// Live sources talk to the kernel; tests drive the same interface with made-up input.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "store/store.h"

namespace strata::agent {

struct WindowContext {
  int64_t recording = 0;
  uint64_t start_ns = 0;  // unix ns
  uint64_t end_ns = 0;
  uint64_t mono_start_ns = 0;  // CLOCK_MONOTONIC, as BPF timestamps are
  uint64_t mono_end_ns = 0;
  // The run's last window (record's end, the agent's shutdown): what a source holds back until more
  // data confirms it (a step pattern seen for fewer cycles than a decision needs) is written now,
  // as for a process that exited, since no later window will take it.
  bool last = false;
};

class Source {
 public:
  virtual ~Source() = default;
  virtual std::string name() const = 0;
  // A watched process appeared (or exec'd: then called again with the new image).
  virtual void on_process(const store::ProcessInfo& /*p*/) {}
  virtual void on_process_exit(uint32_t /*pid*/) {}
  // Starts the source's own threads, if it has any. Called once, after the agent dropped its
  // privileges for the whole process: a thread gets its capabilities from the thread that creates
  // it, so none started here keeps the start-up's.
  virtual void start_threads() {}
  // Takes what is ready without blocking long (the record loop calls it a few times a second).
  virtual Status poll() = 0;
  // A file descriptor that becomes readable when the source wants poll() called soon (its ring
  // buffer filling up); -1 when a few polls a second are enough.
  virtual int wake_fd() const { return -1; }
  // Writes the window's aggregates; called inside the store's transaction.
  virtual Status flush(store::Writer& store, const WindowContext& w) = 0;
  // Its own counters for the closing summary and /metrics: drops, probe hits, ...
  virtual void stats(std::vector<std::pair<std::string, double>>& /*out*/) const {}
  // What its kernel side has cost so far: the run time of its BPF programs (kernel BPF stats) plus
  // the modeled trap cost of its uprobe hits, which no BPF counter sees. The cost budget adds it
  // to the agent's own CPU, so the budget judges everything the agent costs the node.
  virtual uint64_t kernel_cost_ns() const { return 0; }
  // The cost budget's level for the next window (CostBudget: 0 full, higher cheaper); a source
  // with a knob of its own turns it down with the level.
  virtual void set_cost_level(int /*level*/) {}
};

}  // namespace strata::agent
