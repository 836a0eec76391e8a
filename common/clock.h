// The wall clock now, in unix nanoseconds, for the collector's own timestamps (when a batch was
// applied, when a diagnosis ran). The agent's timeline is agent/process_info.h's unix_now_ns.
#pragma once

#include <chrono>
#include <cstdint>

namespace strata {

inline uint64_t wall_clock_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

}  // namespace strata
