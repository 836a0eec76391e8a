// strata serve's continuous diagnosis, without root: a recorded job (tests/data/diagnose) is
// replayed through the agent's shipping store (BatchingWriter) into an in-process collector, in
// time slices as an agent would ship its windows. The collector diagnoses each job that got new
// data, keeps the findings in its store, leaves unchanged jobs alone, and after a restart answers
// from what it kept (same first-seen time, nothing diagnosed again).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <regex>
#include <thread>

#include "agent/shipper/batching_writer.h"
#include "server/server.h"
#include "store/store.h"
#include "tests/support/run.h"

namespace strata {
namespace {

using test::run;
using test::strata_bin;
using test::TempDir;

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t n = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  close(fd);
  return ntohs(a.sin_port);
}

class Collector {
 public:
  Collector(const std::string& db, int port) : port_(port) {
    server::ServeOptions o;
    o.store = "sqlite:" + db;
    o.listen = "127.0.0.1:" + std::to_string(port);
    o.diagnose_every_s = 0.2;
    thread_ = std::thread([this, o] {
      auto st = server::serve(o, stop_, std::cerr);
      if (!st) std::cerr << "serve: " << st.error().message << "\n";
    });
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 200 && !c.Get("/metrics"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ~Collector() {
    stop_ = true;
    thread_.join();
  }
  std::string get(const std::string& path) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    auto r = c.Get(path.c_str());
    return r && r->status == 200 ? r->body : std::string();
  }
  uint64_t kept() {
    std::smatch m;
    std::string metrics = get("/metrics");
    static const std::regex re("strata_serve_diagnoses_total\\{outcome=\"kept\"\\} ([0-9]+)");
    return std::regex_search(metrics, m, re) ? std::stoull(m[1]) : 0;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

uint64_t number_after(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\":([0-9]+)");
  return std::regex_search(json, m, re) ? std::stoull(m[1]) : 0;
}

// Everything of the recorded job, ready to be cut in time slices.
struct Recorded {
  std::vector<store::ProcessInfo> procs;
  std::vector<store::StepRecord> steps;
  std::vector<store::CollectiveRecord> colls;
  std::vector<store::CommunicatorRecord> comms;
  std::vector<store::DeviceActivity> device;
  std::vector<store::Store::MetricRow> metrics;
  std::vector<std::pair<store::CountKind, report::Profile>> profiles;
  uint64_t start_ns = UINT64_MAX, end_ns = 0;
};

Recorded load(const std::string& path) {
  auto s = store::Store::open_sqlite(path, store::Store::Mode::kReadOnly);
  EXPECT_TRUE(s) << (s ? "" : s.error().message);
  Recorded r;
  auto& st = **s;
  r.procs = *st.processes();
  r.steps = *st.steps();
  r.colls = *st.collectives();
  r.comms = *st.communicators();
  r.device = *st.device_activity();
  r.metrics = *st.metrics("");
  for (auto k : {store::CountKind::kOnCpu, store::CountKind::kOffCpu}) {
    store::ProfileFilter f;
    f.kind = k;
    r.profiles.emplace_back(k, *st.load_profile(f));
  }
  for (const auto& x : r.steps) {
    r.start_ns = std::min(r.start_ns, x.start_ns);
    r.end_ns = std::max(r.end_ns, x.end_ns);
  }
  return r;
}

// Ships slice `i` of `n` (rows that end in it); the metrics and the profiles, which cover the whole
// recording, go with the last slice.
void ship_slice(agent::shipper::BatchingWriter& w, int64_t rec, const Recorded& r, int i, int n) {
  uint64_t span = r.end_ns - r.start_ns;
  uint64_t lo = i == 0 ? 0 : r.start_ns + span * static_cast<uint64_t>(i) / static_cast<uint64_t>(n);
  uint64_t hi = i == n - 1 ? UINT64_MAX : r.start_ns + span * static_cast<uint64_t>(i + 1) / static_cast<uint64_t>(n);
  auto in = [&](uint64_t t) { return t > lo && t <= hi; };
  if (i == 0) {
    for (const auto& p : r.procs) ASSERT_TRUE(w.put_process(rec, p));
    ASSERT_TRUE(w.put_communicators(rec, r.comms));
  }
  std::vector<store::StepRecord> steps;
  for (const auto& x : r.steps) if (in(x.end_ns)) steps.push_back(x);
  std::vector<store::CollectiveRecord> colls;
  for (const auto& x : r.colls) if (in(x.enter_ns)) colls.push_back(x);
  std::vector<store::DeviceActivity> dev;
  for (const auto& x : r.device) if (in(x.end_ns)) dev.push_back(x);
  ASSERT_TRUE(w.put_steps(rec, steps));
  ASSERT_TRUE(w.put_collectives(rec, colls));
  ASSERT_TRUE(w.put_device_activity(rec, dev));
  if (i == n - 1) {
    std::map<std::pair<uint64_t, uint64_t>, std::vector<store::Metric>> by_window;
    for (const auto& m : r.metrics) by_window[{m.start_ns, m.end_ns}].push_back(m.metric);
    for (const auto& [win, ms] : by_window) ASSERT_TRUE(w.put_metrics(rec, win.first, win.second, ms));
    for (const auto& [kind, prof] : r.profiles) {
      std::vector<store::StackCount> counts;
      for (const auto& smp : prof.samples) {
        auto id = w.intern_stack(prof.stacks[smp.stack_index], store::UnwindMethod::kFramePointer);
        ASSERT_TRUE(id);
        counts.push_back({smp.pid, smp.tid, smp.comm, *id, smp.count});
      }
      ASSERT_TRUE(w.put_window(rec, r.start_ns, r.end_ns, kind, counts));
    }
  }
  ASSERT_TRUE(w.commit());
  ASSERT_TRUE(w.drain(30));
}

TEST(ServeDiagnosis, KeepsFindingsAsWindowsArriveAndAfterARestart) {
  TempDir tmp;
  const std::string db = tmp.file("server.db");
  Recorded r = load(std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/host-hotspot.db");
  ASSERT_FALSE(r.steps.empty());
  const std::string job = "strata-sim-19106";
  const int port = free_port();
  uint64_t first_seen = 0;
  {
    Collector c(db, port);
    agent::shipper::ShipperOptions so;
    so.server = c.url();
    so.node = "vm";
    so.agent_id = "replay-1";
    so.spool_dir = tmp.file("spool");
    auto w = agent::shipper::BatchingWriter::open(so, nullptr, nullptr);
    ASSERT_TRUE(w) << w.error().message;
    store::RecordingInfo info;
    info.node = "vm";
    info.command = "replay of host-hotspot.db";
    info.started_ns = r.start_ns;
    info.sample_hz = 99;
    info.window_s = 10;
    auto rec = (*w)->begin_recording(info);
    ASSERT_TRUE(rec);

    // Slice 1 of 4: steps 1-10, before the hotspot starts (step 10): a healthy job.
    const int n = 4;
    ship_slice(**w, *rec, r, 0, n);
    for (int k = 0; k < 300 && c.kept() < 1; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_GE(c.kept(), 1u) << "no diagnosis round after the first window";
    std::string early = c.get("/api/v1/findings?job=" + job);
    uint64_t first_round = number_after(early, "diagnosed_ns");
    EXPECT_NE(early.find("\"healthy\":true"), std::string::npos) << early;

    // The rest: every slice with new data gets a round; the hotspot appears.
    for (int i = 1; i < n; ++i) {
      uint64_t before = c.kept();
      ship_slice(**w, *rec, r, i, n);
      for (int k = 0; k < 300 && c.kept() <= before; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      EXPECT_GT(c.kept(), before) << "no round after slice " << i;
    }
    std::string late = c.get("/api/v1/findings?job=" + job);
    ASSERT_NE(late.find("\"cause\":\"host-hotspot\""), std::string::npos) << late;
    auto hist = late.substr(late.find("\"history\":["));
    EXPECT_NE(hist.find("\"rank\":3"), std::string::npos) << hist;
    EXPECT_NE(hist.find("\"active\":true"), std::string::npos) << hist;
    first_seen = number_after(hist, "first_seen_ns");
    EXPECT_GT(first_seen, first_round) << "the finding cannot predate the healthy first round";

    // Nothing new: no more rounds (unchanged jobs are skipped).
    uint64_t settled = c.kept();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_EQ(c.kept(), settled);
    w->reset();
  }
  {
    // A restart: the kept findings answer, with their history; nothing is diagnosed again.
    Collector c(db, port);
    std::string again = c.get("/api/v1/findings?job=" + job);
    ASSERT_NE(again.find("\"cause\":\"host-hotspot\""), std::string::npos) << again;
    EXPECT_EQ(number_after(again.substr(again.find("\"history\":[")), "first_seen_ns"), first_seen);
    EXPECT_EQ(c.kept(), 0u);
    auto text = run(strata_bin() + " diagnose --server " + c.url() + " --job " + job);
    EXPECT_EQ(text.exit_code, 0) << text.err;
    EXPECT_NE(text.out.find("ACTIVE"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("host-hotspot on rank 3"), std::string::npos) << text.out;
  }
}

}  // namespace
}  // namespace strata
