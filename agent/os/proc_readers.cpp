#include "agent/os/proc_readers.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <linux/tcp.h>  // tcp_info with tcpi_bytes_acked (glibc's copy is older)
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>

#include <fstream>
#include <sstream>
#include <vector>

#include "common/parse.h"

namespace strata::agent::os {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::optional<Faults> parse_proc_stat_faults(const std::string& text) {
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  auto close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream in(text.substr(close + 1));
  std::vector<std::string> f;  // f[0] is field 3 (state)
  std::string tok;
  while (f.size() < 10 && in >> tok) f.push_back(tok);
  if (f.size() < 10) return std::nullopt;
  auto minor = parse_int<uint64_t>(f[7]), major = parse_int<uint64_t>(f[9]);  // fields 10 and 12
  if (!minor || !major) return std::nullopt;
  return Faults{*minor, *major};
}

std::optional<Faults> read_faults(uint32_t pid) {
  std::string text = slurp("/proc/" + std::to_string(pid) + "/stat");
  if (text.empty()) return std::nullopt;
  return parse_proc_stat_faults(text);
}

std::map<int, uint64_t> socket_fds(uint32_t pid) {
  std::map<int, uint64_t> out;
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char buf[64];
    ssize_t n = readlink((dir + "/" + e->d_name).c_str(), buf, sizeof(buf) - 1);
    if (n <= 0) continue;
    buf[n] = 0;
    if (std::strncmp(buf, "socket:[", 8) != 0) continue;
    auto fd = parse_int<int>(e->d_name);
    auto inode = parse_int_prefix<uint64_t>(buf + 8);
    if (fd && inode) out[*fd] = *inode;
  }
  closedir(d);
  return out;
}

std::string endpoint_string(const void* addr, size_t len) {
  char ip[INET6_ADDRSTRLEN] = {};
  auto* sa = static_cast<const sockaddr*>(addr);
  if (len >= sizeof(sockaddr_in) && sa->sa_family == AF_INET) {
    auto* in = static_cast<const sockaddr_in*>(addr);
    if (!inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip))) return {};
    return std::string(ip) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (len >= sizeof(sockaddr_in6) && sa->sa_family == AF_INET6) {
    auto* in6 = static_cast<const sockaddr_in6*>(addr);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {  // an IPv4 peer on a dual-stack socket: as IPv4
      if (!inet_ntop(AF_INET, in6->sin6_addr.s6_addr + 12, ip, sizeof(ip))) return {};
      return std::string(ip) + ":" + std::to_string(ntohs(in6->sin6_port));
    }
    if (!inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip))) return {};
    return "[" + std::string(ip) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return {};
}

std::vector<TcpLink> read_tcp_links(uint32_t pid, const std::map<int, uint64_t>& sockets, size_t max_links) {
  std::vector<TcpLink> out;
  if (sockets.empty()) return out;
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
  if (pidfd < 0) return out;
  for (const auto& [fd, inode] : sockets) {
    if (out.size() >= max_links) break;
    // A duplicate of the process's socket: reading tcp_info through it changes nothing for the
    // process (the connection stays its own; closing the duplicate only drops a reference).
    int s = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
    if (s < 0) continue;
    int proto = 0;
    socklen_t plen = sizeof(proto);
    tcp_info ti{};
    socklen_t tlen = sizeof(ti);
    sockaddr_storage la{}, ra{};
    socklen_t llen = sizeof(la), rlen = sizeof(ra);
    if (::getsockopt(s, SOL_SOCKET, SO_PROTOCOL, &proto, &plen) == 0 && proto == IPPROTO_TCP &&
        ::getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &tlen) == 0 && ti.tcpi_state == 1 /* TCP_ESTABLISHED */ &&
        ::getsockname(s, reinterpret_cast<sockaddr*>(&la), &llen) == 0 &&
        ::getpeername(s, reinterpret_cast<sockaddr*>(&ra), &rlen) == 0) {
      TcpLink l;
      l.local = endpoint_string(&la, llen);
      l.remote = endpoint_string(&ra, rlen);
      l.srtt_us = ti.tcpi_rtt;
      l.bytes_acked = ti.tcpi_bytes_acked;
      l.bytes_received = ti.tcpi_bytes_received;
      // Fields past the kernel's own struct (an older kernel writes fewer bytes) stay 0.
      if (tlen >= offsetof(tcp_info, tcpi_rwnd_limited) + sizeof(ti.tcpi_rwnd_limited))
        l.busy_us = ti.tcpi_busy_time > ti.tcpi_rwnd_limited ? ti.tcpi_busy_time - ti.tcpi_rwnd_limited : 0;
      if (!l.local.empty() && !l.remote.empty()) out.push_back(std::move(l));
    }
    ::close(s);
  }
  ::close(pidfd);
  return out;
}

std::map<unsigned, std::string> parse_irq_names(const std::string& text) {
  std::map<unsigned, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string num = line.substr(0, colon);
    num.erase(0, num.find_first_not_of(' '));
    auto irq = parse_int<unsigned>(num);
    if (!irq) continue;  // NMI, LOC, ...
    std::istringstream rest(line.substr(colon + 1));
    std::string tok, last;
    while (rest >> tok) last = tok;
    out[*irq] = last;
  }
  return out;
}

std::map<unsigned, std::string> read_irq_names() { return parse_irq_names(slurp("/proc/interrupts")); }

std::string softirq_name(unsigned vector) {
  static const char* names[] = {"HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"};
  if (vector < sizeof(names) / sizeof(names[0])) return names[vector];
  return "VEC" + std::to_string(vector);
}

}  // namespace strata::agent::os
