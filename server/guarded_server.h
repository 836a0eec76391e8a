// An httplib::Server that a few clients cannot stall. cpp-httplib 0.11 bounds each recv() (the read
// timeout) but not a request: a client that sends a header byte every few seconds holds a worker
// thread forever, and its fixed pool (8 threads here) then queues every agent's batch behind a
// handful of such sockets. This server serves each connection itself (httplib's request parsing
// and routing, over a stream of its own):
//   - each connection runs on a thread of its own, up to a cap on open connections; a connection
//     over the cap gets an immediate 503 and is closed;
//   - a request must arrive whole (headers and body) within a deadline of its start (the
//     connection's opening, or the previous response on a kept-alive connection), and a response
//     must be written within the same time; past it the connection is closed;
//   - each recv()/send() waits at most the I/O timeout, as in httplib.
#pragma once

#include <httplib.h>

#include <atomic>
#include <cstdint>

namespace strata::server {

struct ConnectionLimits {
  // Open connections at once. 1,000 agents sending every 10 s with ~50 ms requests keep ~5 open;
  // 512 leaves room for the web UI, slow links and bursts after a collector restart, at ~64 KB of
  // stack actually touched per connection thread.
  size_t max_connections = 512;
  // A request (headers and body) must arrive, and its response be written, within this long. An
  // agent's largest batch (32 MB compressed) needs ~5 Mbit/s to make it; typical batches are well
  // under 1 MB.
  double request_deadline_s = 60;
  // Each recv()/send() may wait this long (httplib's default).
  time_t io_timeout_s = 5;
  // A kept-alive connection serves at most this many requests, idle at most this long between them
  // (httplib's defaults).
  size_t keep_alive_max_count = 5;
  time_t keep_alive_timeout_s = 5;
};

struct ConnectionCounters {
  uint64_t open = 0;             // connections being served now
  uint64_t refused = 0;          // over the cap: 503 and closed
  uint64_t deadline_closed = 0;  // a request did not arrive (or its response go out) in time
};

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(ConnectionLimits limits = {});

  // After bind_to_port: httplib listens with a backlog of 5, so a burst of connections (agents after
  // a collector restart, a page's requests) loses SYNs and each retry costs a second. Connections
  // waiting to be accepted, at most (the kernel caps it at net.core.somaxconn).
  static constexpr int kListenBacklog = 1024;
  bool widen_backlog();

  ConnectionCounters counters() const;

 private:
  // httplib calls this for each accepted connection, on a thread of the task queue.
  bool process_and_close_socket(socket_t sock) override;

  ConnectionLimits limits_;
  std::atomic<uint64_t> open_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> deadline_closed_{0};
};

}  // namespace strata::server
