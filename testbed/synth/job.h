// A synthetic multi-node training job, written through the store::Store writer interface: whatever
// receives it (an SQLite file, or an agent's BatchingWriter that ships it to `strata serve`) sees the
// rows real agents produce: processes, communicators, steps, collectives, GPU activity, per-window
// OS and NVML metrics, on-CPU stacks. Shared by `strata-sim agents` (one shipper per node) and the
// benchmarks' store generators (bench/web_store.cpp).
//
// The job is synchronous (data parallel): every rank leaves the step's all-reduce when the slowest
// arrives, so all ranks share one step timeline and a slow rank shows as busy longer and waiting
// less than its peers. Global rank = node * ranks_per_node + local rank; node names "node-K"; a rank
// drives GPU `local rank` of its node. Deterministic for a seed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/result.h"
#include "store/store.h"

namespace strata::synth {

enum class Fault { kNone, kGpuSlow, kCpuContention, kHostHotspot, kNetworkSlow, kHang };

// The cause class a correct finding names (diagnose/cause.h's names).
const char* fault_cause(Fault f);

// A stack of the synthetic trainer's native frames, given root first (stored leaf first).
Stack trainer_stack(std::initializer_list<const char*> root_first);

struct JobSpec {
  std::string job = "sim-agents";
  int nodes = 1;
  int ranks_per_node = 8;
  int steps = 100;            // live steps, after the history
  double step_ms = 1000;      // a healthy step
  double window_s = 10;       // the agents' window: metrics and stacks are per window
  bool same_pids = false;     // every node's ranks have the same pids (containers)
  // false: the ranks' environment names no RANK, job or world size, as under
  // torch.multiprocessing.spawn (the rank is an argument); each node's ranks are children of one
  // recorded launcher process.
  bool rank_env = true;
  int64_t pid_base = -1;      // the ranks' first pid; -1: chosen by the job's name (Job::pid)
  uint64_t seed = 1;
  uint64_t t0_ns = 0;         // the first live step starts here (unix ns)
  // A thinned healthy history before t0: one step per rank every history_every_s over history_s
  // (each with its own one-step window of metrics and stacks), so a job can look days old without
  // the rows of every step of those days.
  double history_s = 0;
  double history_every_s = 600;

  Fault fault = Fault::kNone;
  int fault_rank = -1;        // global rank
  int fault_start_step = 0;   // live step index (0-based) from which the fault acts
  // The fault's strength, as strata-sim run's parameters: gpu-slow factor, cpu-contention hogs,
  // host-hotspot ms, network-slow rate_mbit (ignored by the others).
  double fault_param = 0;
};

// The whole timeline: history steps then live steps, and the windows agents send them in.
class Job {
 public:
  explicit Job(JobSpec spec);

  const JobSpec& spec() const { return spec_; }
  int world() const { return spec_.nodes * spec_.ranks_per_node; }
  uint32_t pid(int rank) const;
  static std::string node_name(int node) { return "node-" + std::to_string(node); }
  // The culprit a correct finding names for the spec's fault ("GPU 1", "slow_augment", ...).
  std::string culprit() const;
  // Unix ns when the fault's first step starts (0 without a fault).
  uint64_t fault_start_ns() const;

  struct Window {
    uint64_t start_ns = 0, end_ns = 0;
    size_t first_step = 0, end_step = 0;  // steps [first, end) end inside it
    bool history = false;
  };
  // The windows of an agent whose clock closes them at the job's start + k windows (the history's
  // one-step windows first).
  const std::vector<Window>& windows() const { return windows_; }
  // The windows of an agent that closes its windows `offset_ns` later than that (modulo a window):
  // real agents start at different times, so each node's windows end at moments of their own. The
  // first live window is that much longer; the last ends with the job, as in windows().
  std::vector<Window> windows(uint64_t offset_ns) const;
  // Steps every rank completes (a hang stops them all).
  size_t steps_done() const;
  size_t history_steps() const { return history_steps_; }

  // What one node's agent writes. Each writer keeps its own stack ids (NodeWriter).
  class NodeWriter {
   public:
    NodeWriter(const Job& job, store::Writer& out, int node) : job_(job), out_(out), node_(node) {}
    // The recording, its processes and communicators.
    Status begin(uint64_t started_ns);
    // Window w's rows (steps, collectives, device activity, metrics, stacks); no commit.
    Status window(size_t w) { return window(job_.windows_.at(w)); }
    // The same for a window of Job::windows(offset_ns).
    Status window(const Window& w);
    Status end(uint64_t ended_ns);
    int64_t recording() const { return rec_; }

   private:
    Status intern();
    const Job& job_;
    store::Writer& out_;
    int node_;
    int64_t rec_ = -1;
    std::vector<int64_t> stacks_;  // ids of the job's stacks in `out_`, once interned
  };

 private:
  friend class NodeWriter;
  // One rank's step, in ms (see job.cpp for the model).
  struct RankStep {
    double dev = 0, idle = 0, cpu = 0, runq = 0, hotspot = 0, neighbour = 0;
    double busy() const { return dev + idle; }
  };
  RankStep rank_step(int rank, size_t step) const;
  bool faulty(int rank, size_t step) const;
  double step_ms_of(size_t step) const;
  // The live windows of an agent offset_ns behind the job's clock (offset_ns < a window).
  void append_live_windows(uint64_t offset_ns, std::vector<Window>& out) const;

  JobSpec spec_;
  size_t history_steps_ = 0;
  std::vector<uint64_t> start_ns_, end_ns_;  // per step (history, then live)
  std::vector<Window> windows_;
};

}  // namespace strata::synth
