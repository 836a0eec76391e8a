// Small /proc readers of the OS layer: page faults of a process, the socket inodes it holds, and
// the names of hard IRQs. Parsers take text so tests need no live process.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace strata::agent::os {

struct Faults {
  uint64_t minor = 0;
  uint64_t major = 0;
};

// /proc/PID/stat text: minflt (field 10) and majflt (field 12) of the whole thread group.
std::optional<Faults> parse_proc_stat_faults(const std::string& text);
std::optional<Faults> read_faults(uint32_t pid);

// Inodes of the sockets pid holds ("socket:[INODE]" links in /proc/PID/fd).
std::set<uint64_t> socket_inodes(uint32_t pid);

// /proc/interrupts text -> irq number -> name (the last column: the device or handler name).
std::map<unsigned, std::string> parse_irq_names(const std::string& text);
std::map<unsigned, std::string> read_irq_names();

// The kernel's softirq vector names (NET_RX, TIMER, ...), "VEC<n>" beyond the known ones.
std::string softirq_name(unsigned vector);

}  // namespace strata::agent::os
