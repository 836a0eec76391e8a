// TCP transport of the libnccl.so.2 stand-in: listeners, connects, and moving several buffers at
// once over blocking-free sockets (poll), so that a ring step's send and receive progress together
// and a rank never deadlocks against its neighbour.
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/result.h"

namespace testbed::nccl {

struct Listener {
  int fd = -1;
  uint16_t port = 0;  // host order
};

// Listens on INADDR_ANY, an ephemeral port: reachable from the loopback and from a network
// namespace joined by a veth alike.
strata::Result<Listener> listen_any();

// Connects to ip:port (ip and port in network order), retrying refused connections for a while
// (the peer may not listen yet). TCP_NODELAY set.
strata::Result<int> connect_to(uint32_t ip_be, uint16_t port_be);

strata::Result<int> accept_one(int listen_fd);

strata::Status send_all(int fd, const void* buf, size_t len);
strata::Status recv_all(int fd, void* buf, size_t len);

// One buffer to move over one socket. Transfers on the same socket and direction run in order.
struct Transfer {
  int fd = -1;
  bool send = false;
  char* buf = nullptr;
  size_t len = 0;
  size_t done = 0;
};

// Paces sends to a byte rate (the user-space fallback of the network-slow fault); 0 = unlimited.
class Pacer {
 public:
  explicit Pacer(uint64_t bytes_per_sec) : rate_(bytes_per_sec) {}
  size_t max_chunk() const { return rate_ == 0 ? SIZE_MAX : 64 * 1024; }
  void before_send(size_t bytes);

 private:
  uint64_t rate_;
  uint64_t next_ns_ = 0;
};

// Moves every transfer to completion, all progressing concurrently. Blocks (in poll) as long as
// peers do not move: a late peer makes this rank wait, as in NCCL. Fails when a peer goes away.
strata::Status run_transfers(std::vector<Transfer>& transfers, Pacer& pacer);

}  // namespace testbed::nccl
