#include "server/guarded_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace strata::server {
namespace {

using Clock = std::chrono::steady_clock;

// Connections over the cap still need a thread to be answered and closed; a few are enough, since
// each refusal is one non-blocking send.
constexpr size_t kRefusalThreads = 8;
// How long a refused connection is read from (and discarded) before it is closed.
constexpr auto kRefusalLinger = std::chrono::milliseconds(500);

// A pool that starts a thread when none is idle, up to `max` threads; threads stay for reuse. Each
// connection so gets a thread as soon as it is accepted, up to the connection cap.
class GrowingPool : public httplib::TaskQueue {
 public:
  explicit GrowingPool(size_t max) : max_(max) {}

  void enqueue(std::function<void()> fn) override {
    std::lock_guard lock(mu_);
    jobs_.push_back(std::move(fn));
    // More waiting connections than idle threads to take them: one more thread.
    if (jobs_.size() > idle_ && threads_.size() < max_) threads_.emplace_back([this] { work(); });
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();  // enqueue is not called after shutdown
    threads_.clear();
  }

 private:
  void work() {
    std::unique_lock lock(mu_);
    while (true) {
      if (jobs_.empty()) {
        if (stop_) return;
        ++idle_;
        cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
        --idle_;
        continue;
      }
      auto fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  const size_t max_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

void refuse(socket_t sock) {
  static const char kBody[] = "{\"error\":\"too many open connections to this collector; retry in a second\"}\n";
  const std::string reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
                            "Connection: close\r\nContent-Length: " + std::to_string(sizeof kBody - 1) + "\r\n\r\n" + kBody;
  (void)::send(sock, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  // Closing a socket with the client's request unread resets it, and the client may lose the 503
  // with it: end our side, read what the client sends for a moment, then close.
  ::shutdown(sock, SHUT_WR);
  const auto until = Clock::now() + kRefusalLinger;
  char sink[4096];
  for (auto now = Clock::now(); now < until; now = Clock::now()) {
    pollfd p{sock, POLLIN, 0};
    const int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count()) + 1;
    if (::poll(&p, 1, ms) <= 0 || ::recv(sock, sink, sizeof sink, MSG_DONTWAIT) <= 0) break;
  }
  ::close(sock);
}

// The address of a socket's end as httplib reports it ("127.0.0.1", "::1").
void address_of(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    port = ntohs(v6->sin6_port);
  }
  ip = buf;
}

// httplib's socket stream, with a deadline over each request's reads and each response's writes.
class DeadlineStream : public httplib::Stream {
 public:
  DeadlineStream(socket_t sock, const ConnectionLimits& limits) : sock_(sock), limits_(limits) {}

  // A new request starts: its reads (and then its response's writes) have the deadline from now.
  void start_request() {
    read_deadline_ = Clock::now() + deadline();
    write_deadline_.reset();
  }
  bool missed_deadline() const { return missed_; }
  bool has_buffered() const { return off_ < len_; }

  bool is_readable() const override { return has_buffered() || wait(POLLIN, read_deadline_); }
  bool is_writable() const override {
    if (!write_deadline_) write_deadline_ = Clock::now() + deadline();
    return wait(POLLOUT, *write_deadline_);
  }

  ssize_t read(char* ptr, size_t size) override {
    if (!has_buffered()) {
      if (!wait(POLLIN, read_deadline_)) return -1;
      ssize_t n = ::recv(sock_, buf_.data(), buf_.size(), 0);
      if (n <= 0) return n;
      off_ = 0;
      len_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, len_ - off_);
    std::copy_n(buf_.data() + off_, n, ptr);
    off_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    return ::send(sock_, ptr, size, MSG_NOSIGNAL);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { name(::getpeername, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { name(::getsockname, ip, port); }
  socket_t socket() const override { return sock_; }

 private:
  Clock::duration deadline() const {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(limits_.request_deadline_s));
  }

  // Waits for the socket up to the I/O timeout and the deadline, whichever comes first.
  bool wait(short events, Clock::time_point deadline) const {
    while (true) {
      const auto now = Clock::now();
      if (now >= deadline) {
        missed_ = true;
        return false;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
      const int ms = static_cast<int>(std::min<int64_t>(left, limits_.io_timeout_s * 1000));
      pollfd p{sock_, events, 0};
      int r = ::poll(&p, 1, ms);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        if (r == 0 && Clock::now() >= deadline) missed_ = true;
        return false;  // an I/O timeout or an error, as httplib has it
      }
      return (p.revents & (events | POLLHUP | POLLERR)) != 0;
    }
  }

  void name(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t n = sizeof a;
    if (get(sock_, reinterpret_cast<sockaddr*>(&a), &n) == 0) address_of(a, ip, port);
  }

  socket_t sock_;
  const ConnectionLimits& limits_;
  std::array<char, 4096> buf_{};
  size_t off_ = 0, len_ = 0;
  Clock::time_point read_deadline_{};
  mutable std::optional<Clock::time_point> write_deadline_;
  mutable bool missed_ = false;
};

}  // namespace

GuardedServer::GuardedServer(ConnectionLimits limits) : limits_(limits) {
  const size_t threads = limits_.max_connections + kRefusalThreads;
  new_task_queue = [threads] { return new GrowingPool(threads); };
  set_read_timeout(limits_.io_timeout_s, 0);
  set_write_timeout(limits_.io_timeout_s, 0);
  set_keep_alive_max_count(limits_.keep_alive_max_count);
  set_keep_alive_timeout(limits_.keep_alive_timeout_s);
}

bool GuardedServer::widen_backlog() {
  return svr_sock_ != INVALID_SOCKET && ::listen(svr_sock_, kListenBacklog) == 0;
}

ConnectionCounters GuardedServer::counters() const {
  return {open_.load(), refused_.load(), deadline_closed_.load()};
}

// httplib's own loop (process_server_socket), over a DeadlineStream: requests one after another on a
// kept-alive connection, each parsed and routed by httplib's process_request.
bool GuardedServer::process_and_close_socket(socket_t sock) {
  if (open_.fetch_add(1) >= limits_.max_connections) {
    open_.fetch_sub(1);
    refused_.fetch_add(1);
    refuse(sock);
    return false;
  }
  DeadlineStream strm(sock, limits_);
  bool ok = false;
  for (size_t left = limits_.keep_alive_max_count; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
    // The next request, or the connection's end: idle at most the keep-alive timeout.
    if (!strm.has_buffered()) {
      pollfd p{sock, POLLIN, 0};
      int r;
      do {
        r = ::poll(&p, 1, static_cast<int>(limits_.keep_alive_timeout_s * 1000));
      } while (r < 0 && errno == EINTR);
      if (r <= 0) break;
    }
    strm.start_request();
    bool closed = false;
    ok = process_request(strm, left == 1, closed, nullptr);
    if (strm.missed_deadline()) deadline_closed_.fetch_add(1);
    if (!ok || closed || strm.missed_deadline()) break;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  open_.fetch_sub(1);
  return ok;
}

}  // namespace strata::server
