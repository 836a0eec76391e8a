#include "testbed/nccl/transport.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "testbed/common/testbed_env.h"

namespace testbed::nccl {

using strata::Error;
using strata::Result;
using strata::Status;

static void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Result<Listener> listen_any() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error::from_errno("socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 128) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    return Error::from_errno("listening on a TCP port", err);
  }
  return Listener{fd, ntohs(addr.sin_port)};
}

Result<int> connect_to(uint32_t ip_be, uint16_t port_be) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = ip_be;
  addr.sin_port = port_be;
  char text[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &addr.sin_addr, text, sizeof(text));
  std::string where = std::string(text) + ":" + std::to_string(ntohs(port_be));
  uint64_t deadline = monotonic_ns() + 30'000'000'000ull;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Error::from_errno("socket", errno);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
      set_nodelay(fd);
      return fd;
    }
    int err = errno;
    ::close(fd);
    bool retry = err == ECONNREFUSED || err == ETIMEDOUT || err == EINTR || err == ENETUNREACH;
    if (!retry || monotonic_ns() > deadline) return Error::from_errno("connecting to " + where, err);
    sleep_until_ns(monotonic_ns() + 50'000'000);
  }
}

Result<int> accept_one(int listen_fd) {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      set_nodelay(fd);
      return fd;
    }
    if (errno != EINTR) return Error::from_errno("accepting a peer", errno);
  }
}

Status send_all(int fd, const void* buf, size_t len) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Error::from_errno("sending to a peer", n < 0 ? errno : EPIPE);
    p += n;
    len -= static_cast<size_t>(n);
  }
  return {};
}

Status recv_all(int fd, void* buf, size_t len) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return Error{"receiving from a peer: connection closed (peer exited?)"};
    if (n < 0) return Error::from_errno("receiving from a peer", errno);
    p += n;
    len -= static_cast<size_t>(n);
  }
  return {};
}

void Pacer::before_send(size_t bytes) {
  if (rate_ == 0) return;
  uint64_t now = monotonic_ns();
  if (next_ns_ < now) next_ns_ = now;
  sleep_until_ns(next_ns_);
  next_ns_ += bytes * 1'000'000'000ull / rate_;
}

Status run_transfers(std::vector<Transfer>& transfers, Pacer& pacer) {
  std::vector<pollfd> fds;
  std::vector<size_t> index;
  for (;;) {
    fds.clear();
    index.clear();
    // Only the first unfinished transfer per (socket, direction) may move: they run in order.
    for (size_t i = 0; i < transfers.size(); ++i) {
      Transfer& t = transfers[i];
      if (t.done >= t.len) continue;
      bool earlier = false;
      for (size_t j = 0; j < i; ++j) {
        const Transfer& u = transfers[j];
        if (u.fd == t.fd && u.send == t.send && u.done < u.len) earlier = true;
      }
      if (earlier) continue;
      fds.push_back(pollfd{t.fd, static_cast<short>(t.send ? POLLOUT : POLLIN), 0});
      index.push_back(i);
    }
    if (fds.empty()) return {};
    int n = ::poll(fds.data(), fds.size(), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Error::from_errno("poll", errno);
    }
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Transfer& t = transfers[index[k]];
      size_t want = t.len - t.done;
      ssize_t got;
      if (t.send) {
        want = std::min(want, pacer.max_chunk());
        pacer.before_send(want);
        got = ::send(t.fd, t.buf + t.done, want, MSG_NOSIGNAL | MSG_DONTWAIT);
      } else {
        got = ::recv(t.fd, t.buf + t.done, want, MSG_DONTWAIT);
        if (got == 0) return Error{"receiving from a peer: connection closed (peer exited?)"};
      }
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        return Error::from_errno(t.send ? "sending to a peer" : "receiving from a peer", errno);
      }
      t.done += static_cast<size_t>(got);
    }
  }
}

}  // namespace testbed::nccl
