// strata serve's hard limits (README "Limits"), each against what it guards against:
//  - a decompression bomb: a ~2 KB zstd batch of 10M empty collective rows is refused (413, with
//    the reason) before any row is built, and the collector's peak memory stays flat;
//  - slow clients: 200 sockets that trickle a header byte at a time do not stop an agent's
//    batches, and a request that does not arrive whole in time loses its connection;
//  - drill-down: the collector connects only to the address an agent's batches come from (or an
//    allowed host), presents the agent's own credential (never its users' token), and reads a
//    bounded answer.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <mutex>
#include <regex>
#include <vector>
#include <thread>

#include "proto/ingest_codec.h"
#include "server/drilldown.h"
#include "server/ingest_applier.h"
#include "server/server.h"
#include "store/store.h"
#include "tests/support/collector.h"
#include "tests/support/run.h"

namespace strata {
namespace {

using test::strata_bin;
using test::TempDir;

const char* kBatchType = "application/x-strata-batch+zstd";

using test::free_port;

// A field's key and a varint, as protobuf writes them.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>(0x80 | (v & 0x7f));
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void key(std::string& out, int field, int wire) { varint(out, static_cast<uint64_t>(field) << 3 | wire); }
void bytes_field(std::string& out, int field, const std::string& v) {
  key(out, field, 2);
  varint(out, v.size());
  out += v;
}

// A batch with one Collectives record of `rows` empty rows, written by hand: building it through the
// generated classes would itself take the gigabytes the collector must not.
std::string bomb(uint64_t rows) {
  std::string coll;
  coll.reserve(rows * 2);
  for (uint64_t i = 0; i < rows; ++i) coll.append("\x12\x00", 2);  // rows = 2, an empty message
  std::string record;
  bytes_field(record, ingest::Record::kCollectivesFieldNumber, coll);
  coll.clear();
  coll.shrink_to_fit();
  std::string batch;
  key(batch, ingest::Batch::kSchemaVersionFieldNumber, 0);
  varint(batch, ingest::kIngestVersion);
  bytes_field(batch, ingest::Batch::kAgentIdFieldNumber, "bomber");
  bytes_field(batch, ingest::Batch::kNodeFieldNumber, "bomb-node");
  key(batch, ingest::Batch::kBatchIdFieldNumber, 0);
  varint(batch, 1);
  bytes_field(batch, ingest::Batch::kRecordsFieldNumber, record);
  record.clear();
  record.shrink_to_fit();
  std::string z(ZSTD_compressBound(batch.size()), '\0');
  size_t n = ZSTD_compress(z.data(), z.size(), batch.data(), batch.size(), 19);
  EXPECT_FALSE(ZSTD_isError(n));
  z.resize(n);
  return z;
}

// kB from /proc/PID/status ("VmHWM:" is the peak resident set, "VmRSS:" the current one).
uint64_t status_kb(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field, 0) == 0) return std::stoull(line.substr(field.size()));
  }
  return 0;
}

// `strata serve` as a process of its own, so its memory is its own.
class ServeProcess {
 public:
  ServeProcess(const std::string& db, int port) : port_(port) {
    pid_ = fork();
    if (pid_ == 0) {
      execl(strata_bin().c_str(), "strata", "serve", "--store", ("sqlite:" + db).c_str(), "--listen",
            ("127.0.0.1:" + std::to_string(port)).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 600 && !c.Get("/metrics"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ~ServeProcess() {
    kill(pid_, SIGTERM);
    int st = 0;
    waitpid(pid_, &st, 0);
  }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_;
};

std::string normal_batch(const std::string& agent, const std::string& node, uint64_t id,
                         const std::string& drilldown_url = "", const std::string& credential = "") {
  ingest::Batch b;
  b.set_schema_version(ingest::kIngestVersion);
  b.set_agent_id(agent);
  b.set_node(node);
  b.set_batch_id(id);
  b.mutable_health()->set_interval_s(10);
  b.mutable_health()->set_drilldown_url(drilldown_url);
  b.mutable_health()->set_drilldown_credential(credential);
  auto* rec = b.add_records()->mutable_recording();
  rec->set_local_id(1);
  rec->set_node(node);
  auto* steps = b.add_records()->mutable_steps();
  steps->set_recording(1);
  for (int i = 1; i <= 10; ++i) {
    auto* s = steps->add_rows();
    s->set_pid(100);
    s->set_step(static_cast<uint64_t>(i));
    s->set_start_ns(static_cast<uint64_t>(i) * 1'000'000'000);
    s->set_end_ns(static_cast<uint64_t>(i) * 1'000'000'000 + 500'000'000);
  }
  auto z = ingest::encode_batch(b);
  EXPECT_TRUE(z);
  return z ? *z : "";
}

TEST(ServeLimits, DecompressionBombIsRefusedBeforeItsRowsAreBuilt) {
  TempDir tmp;
  ServeProcess s(tmp.file("server.db"), free_port());
  const uint64_t kRows = 10'000'000;
  const std::string body = bomb(kRows);
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  ASSERT_TRUE(c.Get("/metrics")) << "strata serve did not start";
  const uint64_t rss_before = status_kb(s.pid(), "VmRSS:"), peak_before = status_kb(s.pid(), "VmHWM:");
  auto t0 = std::chrono::steady_clock::now();
  auto r = c.Post("/api/v1/ingest", body, kBatchType);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r);
  const uint64_t rss_after = status_kb(s.pid(), "VmRSS:"), peak_after = status_kb(s.pid(), "VmHWM:");
  // What the report quotes (not asserted: timing depends on the machine).
  std::cout << "bomb: " << body.size() << " bytes zstd, " << kRows << " empty collective rows: HTTP " << r->status
            << " in " << took << " s; collector RSS " << rss_before / 1024 << " -> " << rss_after / 1024
            << " MB, peak " << peak_before / 1024 << " -> " << peak_after / 1024 << " MB; " << r->body;
  EXPECT_LT(body.size(), 4096u);
  EXPECT_EQ(r->status, 413) << r->body;
  EXPECT_NE(r->body.find("10000000 collectives rows, limit 1000000"), std::string::npos) << r->body;
  // Flat: the decompressed batch (20 MB, in a string that grows by doubling) is all it holds while
  // counting; building the rows took 3.9 GB before the cap.
  constexpr uint64_t kMaxPeakGrowthKb = 128 * 1024;
  EXPECT_LT(peak_after - peak_before, kMaxPeakGrowthKb);
  // Nothing of it was written, and the collector still takes honest batches.
  auto ok = c.Post("/api/v1/ingest", normal_batch("honest", "n1", 1), kBatchType);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->body.find("kind=\"collectives\""), std::string::npos) << "bomb rows were written";
  EXPECT_NE(metrics->body.find("strata_serve_batches_total{outcome=\"rejected\",reason=\"oversized\"} 1"),
            std::string::npos);
}

TEST(ServeLimits, RowCapsPerKindAndPerBatch) {
  // Under the cap the same shape is accepted; the per-kind cap of steps is lower than the batch's.
  std::map<std::string, uint64_t> rows;
  ingest::DecodeLimits lim;
  EXPECT_EQ(ingest::row_cap("collectives", lim), 1'000'000u);
  EXPECT_EQ(ingest::row_cap("steps", lim), 100'000u);
  lim.max_rows = 1000;
  EXPECT_EQ(ingest::row_cap("steps", lim), 1000u);
  auto small = ingest::decode_batch(bomb(1000), lim);
  EXPECT_TRUE(small) << small.error().message;
  auto big = ingest::decode_batch(bomb(1001), lim);
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().message.find("1001 collectives rows, limit 1000"), std::string::npos) << big.error().message;
}

// An in-process collector with options of the test's choosing, diagnosing only when asked.
class Collector : public test::InProcessCollector {
 public:
  explicit Collector(server::ServeOptions o) : InProcessCollector(without_rounds(std::move(o))) {}

 private:
  static server::ServeOptions without_rounds(server::ServeOptions o) {
    o.diagnose_every_s = 0;
    return o;
  }
};

// Sockets that open a request and then send one header byte per `every`, never finishing it.
class SlowClients {
 public:
  SlowClients(int port, int n, std::chrono::milliseconds every) {
    // Trickling starts with the first socket: each must look alive to the server from the start.
    thread_ = std::thread([this, every] {
      while (!stop_) {
        {
          std::lock_guard lock(mu_);
          for (int fd : fds_) (void)send(fd, "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        std::this_thread::sleep_for(every);
      }
    });
    for (int i = 0; i < n; ++i) {
      int fd = open_one(port);
      if (fd < 0) continue;
      std::lock_guard lock(mu_);
      fds_.push_back(fd);
    }
  }
  ~SlowClients() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) close(fd);
  }
  size_t opened() {
    std::lock_guard lock(mu_);
    return fds_.size();
  }
  // The server never answers a request that has not arrived whole, so an answered socket was
  // refused: over the cap while a connection made before (the readiness check's, whose thread
  // had sent its answer but not yet let go of its slot) was still counted. Each answered socket
  // is replaced by a new one, every `settle`, until a round answers none (at most `rounds`).
  // Returns how many were replaced.
  size_t replace_answered(int port, int rounds, std::chrono::milliseconds settle) {
    size_t replaced = 0;
    for (int round = 0; round < rounds; ++round) {
      std::this_thread::sleep_for(settle);
      std::lock_guard lock(mu_);
      size_t now = 0;
      for (int& fd : fds_) {
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, 0) != 1) continue;
        close(fd);
        fd = open_one(port);
        ++now;
      }
      std::erase_if(fds_, [](int fd) { return fd < 0; });
      replaced += now;
      if (now == 0) break;
    }
    return replaced;
  }
  // How many the server has closed (a read returns end of file or an error).
  size_t closed_by_server() {
    std::lock_guard lock(mu_);
    size_t n = 0;
    for (int fd : fds_) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 0) == 1) {
        char buf[256];
        ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        n += r <= 0 || (p.revents & (POLLHUP | POLLERR)) ? 1 : 0;
      }
    }
    return n;
  }

 private:
  // A socket that has sent the start of a request and its first header's name; -1 if it could not connect.
  static int open_one(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd);
      return -1;
    }
    const char start[] = "POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    (void)send(fd, start, sizeof start - 1, MSG_NOSIGNAL);
    return fd;
  }

  std::mutex mu_;
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(ServeLimits, SlowClientsDoNotStopAnAgentsBatches) {
  TempDir tmp;
  server::ServeOptions o;
  o.store = "sqlite:" + tmp.file("server.db");
  Collector c(o);
  SlowClients slow(c.port(), 200, std::chrono::milliseconds(1000));
  ASSERT_EQ(slow.opened(), 200u);
  for (int i = 0; i < 200 && c.metric("strata_serve_connections") < 200; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // All 200 are open and held while an agent ships three batches.
  EXPECT_GE(c.metric("strata_serve_connections"), 200u);
  httplib::Client agent("127.0.0.1", c.port());
  agent.set_read_timeout(30, 0);
  for (uint64_t id = 1; id <= 3; ++id) {
    auto t0 = std::chrono::steady_clock::now();
    auto r = agent.Post("/api/v1/ingest", normal_batch("agent-1", "n1", id), kBatchType);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(r) << "batch " << id << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_NE(r->body.find("\"applied\""), std::string::npos) << r->body;
    std::cout << "slow-loris: batch " << id << " applied in " << took << " s beside "
              << c.metric("strata_serve_connections") << " open connections\n";
  }
  EXPECT_EQ(slow.closed_by_server(), 0u) << "the default deadline is a minute";
}

TEST(ServeLimits, ARequestThatDoesNotArriveInTimeLosesItsConnection) {
  TempDir tmp;
  server::ServeOptions o;
  o.store = "sqlite:" + tmp.file("server.db");
  o.request_deadline_s = 1;
  Collector c(o);
  SlowClients slow(c.port(), 20, std::chrono::milliseconds(200));
  ASSERT_EQ(slow.opened(), 20u);
  size_t closed = 0;
  for (int i = 0; i < 600 && closed < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    closed = slow.closed_by_server();
  }
  EXPECT_EQ(closed, 20u);
  EXPECT_GE(c.metric("strata_serve_request_deadline_closed_total"), 20u);
  // A request that arrives whole in time is served, on a connection the deadline then rearms for.
  httplib::Client agent("127.0.0.1", c.port());
  auto r = agent.Post("/api/v1/ingest", normal_batch("agent-1", "n1", 1), kBatchType);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
}

TEST(ServeLimits, ConnectionsOverTheCapAreRefusedAtOnce) {
  TempDir tmp;
  server::ServeOptions o;
  o.store = "sqlite:" + tmp.file("server.db");
  o.max_connections = 16;
  Collector c(o);
  {
    SlowClients slow(c.port(), 16, std::chrono::milliseconds(1000));
    ASSERT_EQ(slow.opened(), 16u) << "the slow sockets could not all connect";
    const size_t replaced = slow.replace_answered(c.port(), 20, std::chrono::milliseconds(200));
    ASSERT_EQ(slow.opened(), 16u) << "the slow sockets could not all connect again";
    // Full once the server holds all 16: then any other connection is refused.
    httplib::Client probe("127.0.0.1", c.port());
    bool full = false;
    std::string last;  // what the probe last got, for the message below
    for (int i = 0; i < 400 && !full; ++i) {
      auto r = probe.Get("/metrics");
      full = r && r->status == 503;
      if (!r) last = "error " + httplib::to_string(r.error());
      else if (!full) last = "HTTP " + std::to_string(r->status);
      if (!full) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(full) << "16 slow sockets never filled a cap of 16 (the probe's last answer: " << last << "; "
                      << slow.closed_by_server() << " slow sockets closed by the server; " << replaced
                      << " refused at first and replaced)";
    httplib::Client agent("127.0.0.1", c.port());
    agent.set_read_timeout(30, 0);
    auto r = agent.Post("/api/v1/ingest", normal_batch("agent-1", "n1", 1), kBatchType);
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 503) << r->body;
    EXPECT_NE(r->body.find("too many open connections"), std::string::npos) << r->body;
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  }
  // The slow sockets gone, the agent gets in, and the refusals were counted.
  httplib::Client agent("127.0.0.1", c.port());
  std::shared_ptr<httplib::Response> ok;
  for (int i = 0; i < 400; ++i) {
    auto r = agent.Post("/api/v1/ingest", normal_batch("agent-1", "n1", 1), kBatchType);
    if (r && r->status == 200) {
      ok = std::make_shared<httplib::Response>(*r);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(ok) << "the agent never got in after the slow sockets closed";
  EXPECT_GE(c.metric("strata_serve_connections_refused_total"), 2u);
}

// A stand-in agent's /drilldown on one address: what it was asked with, and an answer of `size` bytes.
class FakeAgent {
 public:
  FakeAgent(const std::string& host, size_t size) {
    svr_.Get("/drilldown", [this, size](const httplib::Request& req, httplib::Response& res) {
      {
        std::lock_guard lock(mu_);
        auth_.push_back(req.get_header_value("Authorization"));
      }
      res.set_content("{\"records\":\"" + std::string(size, 'x') + "\"}", "application/json");
    });
    port_ = svr_.bind_to_any_port(host);
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
    while (!svr_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ~FakeAgent() {
    svr_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  std::vector<std::string> auth() {
    std::lock_guard lock(mu_);
    return auth_;
  }

 private:
  httplib::Server svr_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> auth_;
};

TEST(ServeLimits, DrilldownConnectsOnlyWhereTheAgentIs) {
  TempDir tmp;
  const std::string token = "users-token";
  server::ServeOptions o;
  o.store = "sqlite:" + tmp.file("server.db");
  o.token = token;
  o.max_drilldown_bytes = 1u << 20;
  o.drilldown_allow = {"127.0.0.3"};
  Collector c(o);
  FakeAgent honest("127.0.0.1", 100);
  FakeAgent victim("127.0.0.2", 100);     // another node's service, named by a lying batch
  FakeAgent allowed("127.0.0.3", 100);    // a host the operator allows
  FakeAgent chatty("127.0.0.1", 2u << 20);  // answers more than the collector reads
  httplib::Client cli("127.0.0.1", c.port());
  cli.set_bearer_token_auth(token);
  cli.set_read_timeout(30, 0);
  auto ship = [&](const std::string& node, const std::string& url) {
    auto r = cli.Post("/api/v1/ingest", normal_batch(node + "-agent", node, 1, url, node + "-secret"), kBatchType);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
  };
  ship("liar", "http://127.0.0.2:" + std::to_string(victim.port()));
  ship("good", "http://127.0.0.1:" + std::to_string(honest.port()));
  ship("natted", "http://127.0.0.3:" + std::to_string(allowed.port()));
  ship("chatty", "http://127.0.0.1:" + std::to_string(chatty.port()));

  // The batch came from 127.0.0.1: the collector asks there (at the named port), never 127.0.0.2.
  auto lie = cli.Get("/api/v1/nodes/liar/drilldown");
  ASSERT_TRUE(lie);
  EXPECT_TRUE(victim.auth().empty()) << "the collector connected where a batch told it to";
  // The honest agent is asked with its own credential, never the users' token.
  auto good = cli.Get("/api/v1/nodes/good/drilldown?last=1m");
  ASSERT_TRUE(good);
  EXPECT_EQ(good->status, 200) << good->body;
  ASSERT_EQ(honest.auth().size(), 1u);
  EXPECT_EQ(honest.auth()[0], "Bearer good-secret");
  // An allowed host is asked where the batch says.
  auto natted = cli.Get("/api/v1/nodes/natted/drilldown");
  ASSERT_TRUE(natted);
  EXPECT_EQ(natted->status, 200) << natted->body;
  ASSERT_EQ(allowed.auth().size(), 1u);
  EXPECT_EQ(allowed.auth()[0], "Bearer natted-secret");
  // An answer past the cap is cut off and refused.
  auto big = cli.Get("/api/v1/nodes/chatty/drilldown");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 502) << big->body.substr(0, 200);
  EXPECT_NE(big->body.find("more than 1048576 bytes"), std::string::npos) << big->body.substr(0, 200);
  // The credentials are nowhere in what the collector serves.
  auto nodes = cli.Get("/api/v1/nodes");
  ASSERT_TRUE(nodes);
  EXPECT_NE(nodes->body.find("drilldown_url"), std::string::npos);
  EXPECT_EQ(nodes->body.find("-secret"), std::string::npos) << nodes->body.substr(0, 400);
  for (const auto& a : honest.auth()) EXPECT_EQ(a.find(token), std::string::npos);
  for (const auto& a : chatty.auth()) EXPECT_EQ(a.find(token), std::string::npos);
}

TEST(ServeLimits, AgentIdCachesAreBoundedAndTheStoreAnswersTheRest) {
  TempDir tmp;
  auto st = store::Store::open_sqlite(tmp.file("ids.db"), store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  constexpr size_t kBudget = 100, kPerAgent = 40;
  server::IngestApplier applier(**st, kBudget, kPerAgent);
  auto batch = [](const std::string& agent, uint64_t id, int first_stack, int stacks, bool define) {
    ingest::Batch b;
    b.set_schema_version(ingest::kIngestVersion);
    b.set_agent_id(agent);
    b.set_node(agent);
    b.set_batch_id(id);
    if (id == 1) {
      auto* rec = b.add_records()->mutable_recording();
      rec->set_local_id(1);
    }
    if (define) {
      for (int k = first_stack; k < first_stack + stacks; ++k) {
        auto* s = b.add_records()->mutable_stack();
        s->set_local_id(k);
        auto* f = s->add_frames();
        f->set_module("m");
        f->set_offset(static_cast<uint64_t>(k));
        f->set_function(agent + "_f" + std::to_string(k));
      }
    }
    auto* w = b.add_records()->mutable_window();
    w->set_recording(1);
    w->set_start_ns(1);
    w->set_end_ns(2);
    for (int k = first_stack; k < first_stack + stacks; ++k) {
      auto* c = w->add_counts();
      c->set_pid(1);
      c->set_stack(k);
      c->set_value(1);
    }
    return b;
  };
  // Ten agents, 30 stacks each: 310 mappings, more than the budget of 100.
  for (int a = 0; a < 10; ++a) {
    auto out = applier.apply(batch("agent-" + std::to_string(a), 1, 1, 30, true), "{}", 1);
    ASSERT_TRUE(out) << out.error().message;
    EXPECT_LE(applier.cached_ids(), kBudget);
  }
  // Every agent refers to its stacks again, the evicted ones too: the store answers, nothing is lost.
  for (int a = 0; a < 10; ++a) {
    auto out = applier.apply(batch("agent-" + std::to_string(a), 2, 1, 30, false), "{}", 2);
    ASSERT_TRUE(out) << out.error().message;
    EXPECT_EQ(out->lost_refs, 0u) << "agent " << a;
    EXPECT_LE(applier.cached_ids(), kBudget);
  }
  // One agent with ever-new stacks (its dictionary restarting) stays within its share.
  for (uint64_t id = 3; id < 10; ++id) {
    auto out = applier.apply(batch("agent-0", id, static_cast<int>(id) * 100, 30, true), "{}", 3);
    ASSERT_TRUE(out) << out.error().message;
    EXPECT_LE(applier.cached_ids(), kBudget);
  }
  auto old = applier.apply(batch("agent-0", 10, 1, 30, false), "{}", 4);
  ASSERT_TRUE(old) << old.error().message;
  EXPECT_EQ(old->lost_refs, 0u);
  // A stack never delivered is still a lost reference (the store does not invent one).
  auto lost = applier.apply(batch("agent-0", 11, 5000, 1, false), "{}", 5);
  ASSERT_TRUE(lost);
  EXPECT_EQ(lost->lost_refs, 1u);
}

TEST(ServeLimits, DrilldownTarget) {
  using server::drilldown_target;
  EXPECT_EQ(*drilldown_target("http://10.0.0.5:9465", "10.0.0.5", {}), "http://10.0.0.5:9465");
  // A name (an agent on a wildcard address announces its node's name) or another address: the
  // agent's own address, at the port it names.
  EXPECT_EQ(*drilldown_target("http://node-17:9465", "10.0.0.5", {}), "http://10.0.0.5:9465");
  EXPECT_EQ(*drilldown_target("http://10.0.0.9:22", "10.0.0.5", {}), "http://10.0.0.5:22");
  EXPECT_EQ(*drilldown_target("http://10.0.0.9:9465", "10.0.0.5", {"10.0.0.9"}), "http://10.0.0.9:9465");
  EXPECT_EQ(*drilldown_target("http://[::1]:9465", "::1", {}), "http://[::1]:9465");
  EXPECT_FALSE(drilldown_target("http://x", "10.0.0.5", {}));
  EXPECT_FALSE(drilldown_target("http://x:99999", "10.0.0.5", {}));
}

}  // namespace
}  // namespace strata
