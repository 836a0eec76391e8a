// Small /proc readers of the OS layer: page faults of a process, the socket inodes it holds, and
// the names of hard IRQs. Parsers take text so tests need no live process.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace strata::agent::os {

struct Faults {
  uint64_t minor = 0;
  uint64_t major = 0;
};

// /proc/PID/stat text: minflt (field 10) and majflt (field 12) of the whole thread group.
std::optional<Faults> parse_proc_stat_faults(const std::string& text);
std::optional<Faults> read_faults(uint32_t pid);

// The sockets pid holds: fd -> inode ("socket:[INODE]" links in /proc/PID/fd).
std::map<int, uint64_t> socket_fds(uint32_t pid);

// One established TCP connection of a process, as the kernel's tcp_info says (the socket is read
// through a duplicate taken with pidfd_getfd, so the process's network namespace does not matter).
struct TcpLink {
  std::string local, remote;  // "addr:port" (IPv6 in brackets)
  uint64_t srtt_us = 0;       // smoothed RTT, measured by the sending side
  uint64_t bytes_acked = 0;   // sent and acknowledged, since the connection began
  uint64_t bytes_received = 0;
  // Time the connection had data on its way and the receiver's window did not hold it back
  // (tcp_info's busy time less its receive-window-limited time; 0 on kernels older than 4.10):
  // bytes_acked over it is the rate the path moved data while it had data to move.
  uint64_t busy_us = 0;
};

// The established TCP connections among pid's sockets (socket_fds), at most max_links of them.
// Needs ptrace access to pid (CAP_SYS_PTRACE, or the same user); empty when it has none or
// cannot be read.
std::vector<TcpLink> read_tcp_links(uint32_t pid, const std::map<int, uint64_t>& sockets, size_t max_links = 256);

// "addr:port" of a socket address; "" for families other than IPv4 / IPv6.
std::string endpoint_string(const void* sockaddr, size_t len);

// /proc/interrupts text -> irq number -> name (the last column: the device or handler name).
std::map<unsigned, std::string> parse_irq_names(const std::string& text);
std::map<unsigned, std::string> read_irq_names();

// The kernel's softirq vector names (NET_RX, TIMER, ...), "VEC<n>" beyond the known ones.
std::string softirq_name(unsigned vector);

}  // namespace strata::agent::os
