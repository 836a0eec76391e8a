// Test support: `strata serve` in the test's own process (server::serve on a thread), on a free
// loopback port, stopped and joined by the destructor.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <string>
#include <thread>

#include "server/server.h"
#include "tests/support/net.h"

namespace strata::test {

class InProcessCollector {
 public:
  // `o.listen` is set here; everything else is the test's choice.
  explicit InProcessCollector(server::ServeOptions o, int port = free_port()) : port_(port) {
    o.listen = "127.0.0.1:" + std::to_string(port_);
    thread_ = std::thread([this, o] {
      auto st = server::serve(o, stop_, std::cerr);
      if (!st) std::cerr << "serve: " << st.error().message << "\n";
    });
    // Up to 10 s for the first answer: a loaded machine is slow to start; no time is asserted.
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 200 && !c.Get("/metrics"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ~InProcessCollector() {
    stop_ = true;
    thread_.join();
  }
  InProcessCollector(const InProcessCollector&) = delete;
  InProcessCollector& operator=(const InProcessCollector&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

  // The body of a 200 answer; empty for anything else.
  std::string get(const std::string& path) const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    auto r = c.Get(path.c_str());
    return r && r->status == 200 ? r->body : std::string();
  }

  // The value of one series of /metrics, named as it is written there (labels included, e.g.
  // `strata_serve_diagnoses_total{outcome="kept"}`); UINT64_MAX when it is not there.
  uint64_t metric(const std::string& series) const {
    const std::string body = "\n" + get("/metrics");
    const std::string key = "\n" + series + " ";
    size_t at = body.find(key);
    if (at == std::string::npos) return UINT64_MAX;
    return std::strtoull(body.c_str() + at + key.size(), nullptr, 10);
  }

 private:
  int port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace strata::test
