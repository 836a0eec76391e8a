// What a replay must reproduce of a live run's store, as text (one row a line, sorted): the
// recording, processes, windows, on- and off-CPU stack counts per window (frames as kind, build id,
// module and offset: no symbols, which come from the capturing machine's files), communicators,
// collectives with their sequence numbers, steps, device activity, sampled launches, and the
// GPU/comm and OS layers' metrics. Left out, because replay does not run them (agent/capture.h):
// NVML metrics, the agent's own cost (agent.*) and the run's stats.
#pragma once

#include <string>

#include "common/result.h"

namespace strata::test {

Result<std::string> replay_dump(const std::string& db_path);

}  // namespace strata::test
