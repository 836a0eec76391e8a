#include "common/listen.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

namespace strata {

std::string bind_failure(const std::string& host, int port, const std::string& who) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res); rc != 0)
    return gai_strerror(rc);
  std::string why = "unknown reason";
  for (addrinfo* a = res; a; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    int rc = ::bind(fd, a->ai_addr, a->ai_addrlen);
    int err = errno;
    if (rc == 0 && ::listen(fd, 1) != 0) err = errno, rc = -1;
    ::close(fd);
    if (rc == 0) {
      why = "it was free a moment later; try again";
      break;
    }
    why = err == EADDRINUSE ? "address in use (another " + who + ", or another program, listens there)"
                            : std::strerror(err);
    break;
  }
  freeaddrinfo(res);
  return why;
}

namespace {

// Ports below this are left to services (ClickHouse's 8123 and 9000, Prometheus's 9090, ...).
constexpr int kLowestTestPort = 20000;
// How many random candidates to try before giving up: each is free unless something listens there.
constexpr int kPortAttempts = 200;

bool can_listen(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

int free_listen_port() {
  int eph_lo = 32768, eph_hi = 60999;  // the kernel's defaults
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> eph_lo >> eph_hi;
  int lo = kLowestTestPort, hi = eph_lo - 1;
  if (hi - lo < 1000) lo = eph_hi + 1, hi = 65535;
  if (hi - lo < 1000) lo = 1024, hi = 65535;  // no room outside the range: any unprivileged port
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> pick(lo, hi);
  for (int i = 0; i < kPortAttempts; ++i) {
    int port = pick(rng);
    if (can_listen(port)) return port;
  }
  return -1;
}

}  // namespace strata
