// Bounds on what the agent holds in memory, whatever the targets do. Each is enforced where the data
// lives; tests/unit/agent_memory_test.cpp drives 64 processes and 100k distinct stacks through them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::agent {

// A window keeps its distinct normalized stacks (with their module paths and build ids) until it is
// written. Past this many the window is closed early: nothing is lost, windows just get shorter.
// A normalized stack of ~40 frames is ~9 KB, so ~75 MB at most (32768 measured 480 MB peak RSS
// in agent_memory_test, 8192 measured 147 MB).
inline constexpr size_t kMaxWindowStacks = 8192;

// The agent's resident memory the limits above are sized for (README: Sizing).
inline constexpr uint64_t kDefaultMemoryCapBytes = 200ull << 20;

}  // namespace strata::agent
