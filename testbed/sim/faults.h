// Fault injection for strata-sim: what each fault sets up before the ranks start, what a rank's
// child process does before exec (join a cgroup or namespace, CPU pinning), what happens when the
// culprit reaches start_step, and the teardown of all of it. Real where the OS allows: hog
// processes, cgroup quotas and memory limits, block-device throttling, tc tbf on a veth;
// simulated on the stand-in GPU where only hardware could (slowdown, hang).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/result.h"
#include "testbed/gpu_state.h"
#include "testbed/sim/spec.h"

namespace testbed::sim {

// Per-rank process setup decided by the fault, applied in the forked child before exec.
struct RankSetup {
  std::vector<int> cpus;                  // sched_setaffinity
  std::vector<std::string> cgroup_procs;  // cgroup.procs files to join
  std::string netns;                      // /run/netns/<name> to enter
  std::map<std::string, std::string> env; // extra environment
};

class FaultInjector {
 public:
  FaultInjector(const Options& opts, std::string run_dir, strata_gpu_state* gpus);
  ~FaultInjector();  // tears down whatever is still set up

  // Before the ranks start. Fails with what is missing (root, cgroup controller, ip/tc...).
  strata::Status prepare();
  // What rank `r`'s process needs before exec.
  RankSetup rank_setup(int rank) const;
  void set_rank_pids(std::vector<pid_t> pids) { rank_pids_ = std::move(pids); }
  // Called with the culprit's pid when it has finished step start_step - 1 (or at launch).
  strata::Status activate(pid_t culprit_pid);
  bool active() const { return active_; }
  // Undo everything; idempotent, safe from any exit path.
  void teardown();

  // For the truth file: how the fault was realized ("mechanism") and its culprit name.
  std::string mechanism() const { return mechanism_; }
  std::string culprit() const { return culprit_; }
  // The ranks the fault acts on: its rank, and for slow-cpu and irq-softirq every rank pinned to that
  // rank's CPU (a slower core, or receive work on a core, slows all that run on it). Empty for a
  // job-wide fault.
  std::vector<int> acted_on(int ranks) const;
  std::string master_addr() const { return master_addr_; }
  std::vector<pid_t> hog_pids() const { return hogs_; }
  std::map<std::string, std::string> details() const { return details_; }

 private:
  strata::Status prepare_cgroup(const std::string& controller);
  strata::Status prepare_netns();
  strata::Status prepare_loop();
  strata::Status prepare_irq();
  void send_packets(int ns_fd, int cpu, double rate);
  std::string cgroup_file(const std::string& controller, const std::string& file) const;

  Options opts_;
  std::string run_dir_;
  strata_gpu_state* gpus_;
  bool active_ = false;
  std::string mechanism_;
  std::string culprit_;
  std::string master_addr_ = "127.0.0.1";
  std::map<std::string, std::string> details_;
  int ncpu_ = 1;

  // things to tear down
  std::map<std::string, std::string> cgroups_;  // controller -> directory we created
  bool cgroup_v2_ = false;
  std::vector<pid_t> hogs_;
  std::vector<std::string> namespaces_;   // every one made (network-slow): the switch's, each rank's
  std::vector<std::string> rank_netns_;   // rank r's namespace
  std::vector<std::pair<std::string, std::string>> slowed_ends_;  // (namespace, device): the culprit's link
  std::string loop_dev_;
  std::vector<pid_t> rank_pids_;
  // page-faults: the thread that keeps pushing the culprit's mapped data out of memory.
  std::thread evictor_;
  std::atomic<bool> stop_evicting_{false};
  // irq-softirq: the namespace whose loopback receives for the rank's CPU, and its sender.
  std::string irq_netns_;
  std::thread sender_;
  std::atomic<bool> stop_sending_{false};
  std::atomic<uint64_t> packets_sent_{0};
};

// The hog process body (strata-sim __hog CPU NICE).
[[noreturn]] void run_hog(int cpu, int nice);

// A unique-ish tag for names of things this sim creates (netns, veth, cgroups): strata-<pid>.
std::string sim_tag();

}  // namespace testbed::sim
