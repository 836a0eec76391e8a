// Shared by the stand-ins and strata-sim: where the testbed's files live and how the node's GPU
// state file is mapped. Never linked into the product.
#pragma once

#include <cstdint>
#include <string>

#include "testbed/gpu_state.h"

namespace testbed {

// $STRATA_TESTBED_DIR, default /tmp/strata-testbed; created on first use.
std::string testbed_dir();

// Where the libcudart stand-in writes its device timelines, as strata's CUPTI injection does
// (abi/gpu_timeline.h): $STRATA_TIMELINE_DIR, default /run/strata/timeline; created when it can.
std::string timeline_dir();

// Maps $STRATA_TESTBED_DIR/gpu-state shared, creating and initializing it (with `num_devices`
// healthy devices) when missing or of another version. Returns nullptr when the file cannot be
// mapped: callers then behave as healthy devices. Never unmapped: lives as long as the process.
strata_gpu_state* map_gpu_state();

// Number of simulated devices: $STRATA_TESTBED_GPUS (1..16), default 8.
unsigned configured_device_count();

// CLOCK_MONOTONIC in nanoseconds: the clock of every timestamp the testbed publishes.
uint64_t monotonic_ns();

// Sleeps until the CLOCK_MONOTONIC deadline; never spins.
void sleep_until_ns(uint64_t deadline_ns);

}  // namespace testbed
