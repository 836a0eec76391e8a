// `strata-sim agents`: N simulated node agents that ship a synthetic job (testbed/synth/job.h) to
// `strata serve` through the agent's own shipper (BatchingWriter: the real ingest protocol, spool and
// retries), one agent per node, for load and end-to-end tests without GPUs or ranks.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace testbed::sim {

// As given on the command line; checked by run_agents.
struct AgentsArgs {
  std::string server, token_file, job;
  std::string nodes, ranks_per_node, steps;
  std::string step_ms = "1000", window_s = "10", speed = "1", seed = "1";
  std::string fault = "none";
  std::string history = "0", history_every = "600";
  std::string threads, spool_dir, drain_timeout = "120", pid_base;
  std::string truth;
  bool same_pids = false;
  bool quiet = false;
};

void add_agents_options(CLI::App& app, AgentsArgs& args);
// Runs the agents; the exit code (0: every batch acknowledged, 1: bad usage, 3: batches left
// unacknowledged or a shipper failed).
int run_agents(const AgentsArgs& args);

}  // namespace testbed::sim
