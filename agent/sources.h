// Where every layer's source is registered: the recorder and the agent ask here for the sources of
// the layers the user chose.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "agent/source.h"
#include "common/result.h"

namespace strata::agent {

// Layers a user can choose with --layers (DESIGN §3): cpu (on-CPU stacks), offcpu, os, gpu, comm.
const std::vector<std::string>& all_layers();
Result<std::set<std::string>> parse_layers(const std::string& spec);

class Normalizer;
class FlightRecorder;
class Tape;

struct SourceEnv {
  int targets_map_fd = -1;  // the BPF map of watched tgids, shared by every BPF source
  int target_bits_fd = -1;  // the same as a bitmap (bpf/strata_targets.bpf.h), for hot paths
  Normalizer* normalizer = nullptr;  // the recorder's: user frames -> build id + offset + module
  unsigned frequency_hz = 99;
  // Raw per-kernel GPU records into the store every window (strata record: one box, kept for the
  // timeline); the cluster agent ships per-window summaries only and keeps raw records in its flight
  // recorder (DESIGN §2: summaries always, detail on demand).
  bool raw_device_records = true;
  // Where raw collectives and device records are kept for drill-down (the agent's); none: not kept.
  FlightRecorder* flight_recorder = nullptr;
  // Where the sources read the world (agent/capture.h): nullptr is live; a capturing tape also
  // writes what they read; a replaying one answers from a capture.
  Tape* tape = nullptr;
};

struct Sources {
  std::vector<std::unique_ptr<Source>> sources;
  std::vector<std::string> warnings;  // layers that could not start here, and why
};

// Starts the sources of `layers` except "cpu" (the recorder's own sampler). A layer that cannot
// start on this machine is skipped with a warning; the others still run.
Sources make_sources(const std::set<std::string>& layers, const SourceEnv& env);
// The sources a replay runs (env.tape replaying): the GPU/comm layer's decoding, collective
// matching, step detection and device records; the off-CPU and OS layers' decoding, aggregation
// and metrics. NVML reads the machine in ways a capture does not keep: it is left out, said in
// `warnings`.
Sources make_replay_sources(const std::set<std::string>& layers, const SourceEnv& env);

}  // namespace strata::agent
