// The event engines the node pipeline takes the kernel's events from (issue 15): the live BPF
// sampler; the same with each drain written to a capture; or a capture replayed. The pipeline
// consumes the same events either way (agent/capture.h says what a capture holds).
#pragma once

#include <iosfwd>
#include <memory>
#include <string>

#include "agent/capture.h"
#include "agent/oncpu_sampler.h"
#include "common/result.h"
#include "store/store.h"

namespace strata::agent {

// The live sampler, each poll's events also written to the tape.
std::unique_ptr<OnCpuSampler> capturing_sampler(std::unique_ptr<OnCpuSampler> live, Tape& tape);
// The events of a capture, one recorded drain per poll; controls of the kernel side do nothing.
std::unique_ptr<OnCpuSampler> replay_sampler(Tape& tape);

// One drain's events, encoded (kSamplerPoll) and decoded back; false: corrupt.
void encode_sample(ByteWriter& w, const SampleEvent& e);
void encode_proc(ByteWriter& w, const ProcEvent& e);
bool decode_events(std::string_view payload, EventSink& sink);

struct ReplaySummary {
  uint64_t steps = 0;
  uint64_t windows = 0;
  uint64_t samples = 0;
};

// Runs a capture through a node pipeline into `sink`, as the live run's shell drove it: its
// recording, windows, stacks (as build id + offset, unsymbolized), collectives, steps and device
// records come out as the live run stored them. A capture that ends early, or that this pipeline
// reads differently from the one that made it, is an Error of one line.
struct ReplayOptions {
  bool flight_recorder = false;  // keep raw records for /drilldown as `strata agent` does (benchmarks)
};
Result<ReplaySummary> replay_capture(const std::string& path, store::Writer& sink, std::ostream& log,
                                     const ReplayOptions& options = {});

}  // namespace strata::agent
