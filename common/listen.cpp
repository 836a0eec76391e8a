#include "common/listen.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

}  // namespace strata
