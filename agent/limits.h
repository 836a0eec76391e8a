// Bounds on what the agent holds in memory, whatever the targets do. Each is enforced where the data
// lives; tests/unit/agent_memory_test.cpp drives 64 processes and 100k distinct stacks through them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::agent {

// A window keeps its distinct normalized stacks (with their module paths and build ids) until it is
// written. Past this many the window is closed early: nothing is lost, windows just get shorter
// (a stack is ~1-3 KB once normalized, so this is ~30-100 MB at most).
inline constexpr size_t kMaxWindowStacks = 32768;

// The agent's resident memory the limits above are sized for (README: Sizing).
inline constexpr uint64_t kDefaultMemoryCapBytes = 200ull << 20;

}  // namespace strata::agent
