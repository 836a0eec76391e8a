// Nothing is lost on the way to the collector: the agent's shipper against a fake collector
// (cpp-httplib on loopback) that answers each status. Only the collector's own verdict "invalid"
// (400 with its JSON error) takes a batch out of the spool, into quarantine; 401, 403, 404, 413,
// a proxy's 400 page, 503, an unexpected status or no answer keep it, counted by status and said
// in the log once a minute at most; a batch stuck on 503 is set aside once a newer one gets
// through, while a collector that refuses everything keeps the batches in order.
#include <dirent.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <iostream>
#include <mutex>
#include <sstream>
#include <streambuf>
#include <thread>
#include <vector>

#include "agent/shipper/batching_writer.h"
#include "proto/ingest_codec.h"
#include "tests/support/run.h"

namespace strata::agent::shipper {
namespace {

// Long enough for the retries below (seconds each) on a loaded machine; reaching it fails.
constexpr auto kDeadline = std::chrono::seconds(90);

// A collector whose answer to each batch the test decides: (agent id, batch id, attempts of that
// batch so far) -> (status, body).
class FakeCollector {
 public:
  using Answer =
      std::function<std::pair<int, std::string>(const std::string& agent, uint64_t batch, int attempt)>;
  explicit FakeCollector(Answer a) : answer_(std::move(a)) {
    svr_.Post("/api/v1/ingest", [this](const httplib::Request& req, httplib::Response& res) {
      auto b = ingest::decode_batch(req.body);
      std::string agent = b ? b->agent_id() : "?";
      uint64_t id = b ? b->batch_id() : 0;
      std::pair<int, std::string> a;
      {
        std::lock_guard lock(mu_);
        int attempt = ++attempts_[{agent, id}];
        seen_[agent].push_back(id);
        a = answer_(agent, id, attempt);
        if (a.first == 200) delivered_[agent].push_back(id);
      }
      res.status = a.first;
      res.set_content(a.second, a.second.rfind("{", 0) == 0 ? "application/json" : "text/html");
    });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
  }
  ~FakeCollector() {
    svr_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<uint64_t> seen(const std::string& agent) {
    std::lock_guard lock(mu_);
    return seen_[agent];
  }
  std::vector<uint64_t> delivered(const std::string& agent) {
    std::lock_guard lock(mu_);
    return delivered_[agent];
  }

 private:
  httplib::Server svr_;
  std::thread thread_;
  int port_ = 0;
  Answer answer_;
  std::mutex mu_;
  std::map<std::pair<std::string, uint64_t>, int> attempts_;
  std::map<std::string, std::vector<uint64_t>> seen_, delivered_;
};

// std::cerr, caught for the test (the shipping threads write to it concurrently).
class CaughtCerr : public std::streambuf {
 public:
  CaughtCerr() : old_(std::cerr.rdbuf(this)) {}
  ~CaughtCerr() override { std::cerr.rdbuf(old_); }
  std::string text() {
    std::lock_guard lock(mu_);
    return text_;
  }

 protected:
  int overflow(int c) override {
    if (c == EOF) return 0;
    std::lock_guard lock(mu_);
    text_ += static_cast<char>(c);
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::lock_guard lock(mu_);
    text_.append(s, static_cast<size_t>(n));
    return n;
  }

 private:
  std::streambuf* old_;
  std::mutex mu_;
  std::string text_;
};

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

size_t files_in(const std::string& dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

std::unique_ptr<BatchingWriter> writer(const std::string& server, const std::string& agent,
                                       const std::string& spool) {
  ShipperOptions o;
  o.server = server;
  o.node = "node-a";
  o.agent_id = agent;
  o.spool_dir = spool;
  auto w = BatchingWriter::open(o, nullptr, nullptr);
  EXPECT_TRUE(w) << (w ? "" : w.error().message);
  return w ? std::move(*w) : nullptr;
}

bool wait_for(const std::function<bool()>& done) {
  auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

const std::string kInvalid = "{\"error\":\"batch: records[0]: unknown kind\"}\n";

TEST(Shipper, QuarantinesOnlyWhatTheCollectorCallsInvalid) {
  FakeCollector c([](const std::string&, uint64_t batch, int) {
    return batch == 1 ? std::make_pair(400, kInvalid)
                      : std::make_pair(200, std::string("{\"status\":\"applied\"}"));
  });
  test::TempDir d;
  auto w = writer(c.url(), "a", d.file("spool"));
  ASSERT_TRUE(w);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(w->seal());
  ASSERT_TRUE(w->drain(kDeadline.count())) << "the spool did not drain";
  EXPECT_EQ(c.delivered("a"), (std::vector<uint64_t>{2, 3}));
  auto k = w->counters();
  EXPECT_EQ(k.batches_rejected, 1u);
  EXPECT_EQ(k.batches_sent, 2u);
  EXPECT_EQ(files_in(d.file("spool") + "/quarantine"), 1u) << "the refused batch is kept for a person";
  std::ostringstream m;
  w->write_metrics(m);
  EXPECT_NE(m.str().find("strata_agent_batches_quarantined_total 1\n"), std::string::npos) << m.str();
}

TEST(Shipper, KeepsTheBatchOnEveryOtherAnswerAndSaysSoOnce) {
  // Each agent id gets one answer until its batch has been refused twice, then 200.
  const std::vector<std::pair<int, std::string>> answers = {
      {401, "{\"error\":\"missing or wrong bearer token\"}"},
      {403, "{\"error\":\"forbidden\"}"},
      {404, "<html>proxy: no route</html>"},
      {413, "<html>proxy: request entity too large</html>"},
      {400, "<html>proxy: bad request</html>"},  // not the collector's verdict
      {418, "unexpected"},
      {503, "{\"error\":\"store unavailable\"}"},
  };
  FakeCollector c([&](const std::string& agent, uint64_t, int attempt) {
    int status = std::stoi(agent);
    for (const auto& a : answers)
      if (a.first == status && attempt <= 2) return a;
    return std::make_pair(200, std::string("{\"status\":\"applied\"}"));
  });
  CaughtCerr log;
  test::TempDir d;
  // No answer at all: a port nobody listens on.
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(s);
  std::string nowhere = "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  {
    std::map<int, std::unique_ptr<BatchingWriter>> writers;
    for (const auto& [status, body] : answers) {
      writers[status] = writer(c.url(), std::to_string(status), d.file("spool-" + std::to_string(status)));
      ASSERT_TRUE(writers[status]);
      ASSERT_TRUE(writers[status]->seal());
    }
    writers[0] = writer(nowhere, "0", d.file("spool-0"));
    ASSERT_TRUE(writers[0]->seal());
    for (auto& [status, w] : writers) {
      SCOPED_TRACE("status " + std::to_string(status));
      if (status == 0) {
        EXPECT_TRUE(wait_for([&] { return w->counters().kept_answers[0] >= 2; }));
        EXPECT_EQ(w->counters().spool_batches, 1u) << "kept while the collector cannot be reached";
      } else {
        // Kept through two refusals, then delivered: nothing lost, nothing quarantined.
        EXPECT_TRUE(w->drain(kDeadline.count()));
        EXPECT_EQ(c.delivered(std::to_string(status)), std::vector<uint64_t>{1});
        EXPECT_EQ(c.seen(std::to_string(status)).size(), 3u);
        auto k = w->counters();
        EXPECT_EQ(k.kept_answers[status], 2u);
        EXPECT_EQ(k.batches_rejected, 0u);
        EXPECT_EQ(files_in(d.file("spool-" + std::to_string(status)) + "/quarantine"), 0u);
        std::ostringstream m;
        w->write_metrics(m);
        EXPECT_NE(m.str().find("strata_agent_batch_answers_kept_total{status=\"" + std::to_string(status) +
                               "\"} 2\n"),
                  std::string::npos)
            << m.str();
      }
    }
  }
  // Each agent said it once, though each was refused at least twice within the minute.
  std::string text = log.text();
  for (const auto& [status, body] : answers)
    EXPECT_EQ(count_of(text, "gave HTTP " + std::to_string(status) + " "), 1u) << status << "\n" << text;
  EXPECT_EQ(count_of(text, "gave no answer"), 1u) << text;
}

TEST(Shipper, ABatchStuckOn503DoesNotStarveNewerOnes) {
  FakeCollector c([](const std::string&, uint64_t batch, int) {
    return batch == 1 ? std::make_pair(503, std::string("{\"error\":\"store unavailable: row too big\"}"))
                      : std::make_pair(200, std::string("{\"status\":\"applied\"}"));
  });
  CaughtCerr log;  // keeps the expected complaints out of the test output
  test::TempDir d;
  auto w = writer(c.url(), "a", d.file("spool"));
  ASSERT_TRUE(w);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(w->seal());
  EXPECT_TRUE(wait_for([&] { return c.delivered("a").size() == 3; }));
  EXPECT_EQ(c.delivered("a"), (std::vector<uint64_t>{2, 3, 4}));
  // The stuck one stays in the spool, and is tried again after it was set aside (its three
  // failures, then the probe that got through, then it).
  // The collector counts a batch delivered when it answers; the shipper takes it out of the spool
  // when the answer arrives, a moment later: wait for the spool, not only for the collector.
  EXPECT_TRUE(wait_for([&] {
    auto k = w->counters();
    return k.batches_set_aside == 1 && k.spool_batches == 1 && k.batches_held == 1;
  })) << "set aside " << w->counters().batches_set_aside << ", spooled " << w->counters().spool_batches << ", held "
      << w->counters().batches_held;
  EXPECT_TRUE(wait_for([&] {
    size_t n = 0;
    for (uint64_t id : c.seen("a")) n += id == 1;
    return n >= 4;
  })) << "the set-aside batch is retried";
  // Newer batches keep flowing past it.
  ASSERT_TRUE(w->seal());
  EXPECT_TRUE(wait_for([&] { return c.delivered("a").size() == 4; }));
}

TEST(Shipper, ACollectorRefusingEverythingKeepsTheBatchesInOrder) {
  // 503 for everything for the first four attempts (the oldest three times, then the next one
  // tried once), then the collector is back: the oldest goes first again.
  std::atomic<int> attempts{0};
  FakeCollector c([&](const std::string&, uint64_t, int) {
    return ++attempts <= 4 ? std::make_pair(503, std::string("{\"error\":\"store unavailable\"}"))
                           : std::make_pair(200, std::string("{\"status\":\"applied\"}"));
  });
  CaughtCerr log;
  test::TempDir d;
  auto w = writer(c.url(), "a", d.file("spool"));
  ASSERT_TRUE(w);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(w->seal());
  ASSERT_TRUE(w->drain(kDeadline.count()));
  EXPECT_EQ(c.delivered("a"), (std::vector<uint64_t>{1, 2, 3}))
      << "no batch passed another during the outage";
  EXPECT_EQ(w->counters().batches_set_aside, 0u);
  EXPECT_EQ(w->counters().kept_answers[503], 4u);
}

}  // namespace
}  // namespace strata::agent::shipper
