// strata serve's continuous diagnosis, without root: a recorded job (tests/data/diagnose) is
// replayed through the agent's shipping store (BatchingWriter) into an in-process collector, in
// time slices as an agent would ship its windows. The collector diagnoses each job that got new
// data, keeps the findings in its store, leaves unchanged jobs alone, and after a restart answers
// from what it kept (same first-seen time, nothing diagnosed again).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "agent/shipper/batching_writer.h"
#include "server/server.h"
#include "store/store.h"
#include "tests/support/collector.h"
#include "tests/support/run.h"

namespace strata {
namespace {

using test::run;
using test::strata_bin;
using test::TempDir;

using test::free_port;
using Collector = test::InProcessCollector;

// An agent's shipper for `node`, sending to the collector at `url` and spooling in `spool`.
Result<std::unique_ptr<agent::shipper::BatchingWriter>> node_writer(const std::string& url, const std::string& node,
                                                                    const std::string& agent_id, const std::string& spool) {
  agent::shipper::ShipperOptions so;
  so.server = url;
  so.node = node;
  so.agent_id = agent_id;
  so.spool_dir = spool;
  return agent::shipper::BatchingWriter::open(so, nullptr, nullptr);
}

// A collector on SQLite FILE that diagnoses every 0.2 s.
server::ServeOptions diagnosing(const std::string& db) {
  server::ServeOptions o;
  o.store = "sqlite:" + db;
  o.diagnose_every_s = 0.2;
  return o;
}

// Diagnoses the collector has made and kept so far.
uint64_t kept(const Collector& c) {
  uint64_t n = c.metric("strata_serve_diagnoses_total{outcome=\"kept\"}");
  return n == UINT64_MAX ? 0 : n;
}

uint64_t number_after(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\":([0-9]+)");
  return std::regex_search(json, m, re) ? std::stoull(m[1]) : 0;
}

// A rank's process as an agent announces it: pid on node, of job.
store::ProcessInfo rank_on(uint32_t pid, const std::string& node, const std::string& job, int rank) {
  store::ProcessInfo p;
  p.pid = pid;
  p.node = node;
  p.comm = "python";
  p.job = job;
  p.rank = rank;
  return p;
}

// Everything of the recorded job, ready to be cut in time slices.
struct Recorded {
  std::vector<store::ProcessInfo> procs;
  std::vector<store::StepRecord> steps;
  std::vector<store::CollectiveRecord> colls;
  std::vector<store::CommunicatorRecord> comms;
  std::vector<store::DeviceActivity> device;
  std::vector<store::Store::MetricRow> metrics;
  std::vector<std::pair<store::CountKind, Profile>> profiles;
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

// The recording an agent on `node` begins for a replay of `r`, at its start, 99 Hz, 10 s windows.
Result<int64_t> begin_replay(agent::shipper::BatchingWriter& w, const Recorded& r, const std::string& node,
                             const std::string& command) {
  store::RecordingInfo info;
  info.node = node;
  info.command = command;
  info.started_ns = r.start_ns;
  info.sample_hz = 99;
  info.window_s = 10;
  return w.begin_recording(info);
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
    Collector c(diagnosing(db), port);
    auto w = node_writer(c.url(), "vm", "replay-1", tmp.file("spool"));
    ASSERT_TRUE(w) << w.error().message;
    auto rec = begin_replay(**w, r, "vm", "replay of host-hotspot.db");
    ASSERT_TRUE(rec);

    // Slice 1 of 4: steps 1-10, before the hotspot starts (step 10): a healthy job.
    const int n = 4;
    ship_slice(**w, *rec, r, 0, n);
    for (int k = 0; k < 300 && kept(c) < 1; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_GE(kept(c), 1u) << "no diagnosis round after the first window";
    std::string early = c.get("/api/v1/findings?job=" + job);
    uint64_t first_round = number_after(early, "diagnosed_ns");
    EXPECT_NE(early.find("\"healthy\":true"), std::string::npos) << early;

    // The rest: every slice with new data gets a round; the hotspot appears.
    for (int i = 1; i < n; ++i) {
      uint64_t before = kept(c);
      ship_slice(**w, *rec, r, i, n);
      for (int k = 0; k < 300 && kept(c) <= before; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      EXPECT_GT(kept(c), before) << "no round after slice " << i;
    }
    std::string late = c.get("/api/v1/findings?job=" + job);
    ASSERT_NE(late.find("\"cause\":\"host-hotspot\""), std::string::npos) << late;
    auto hist = late.substr(late.find("\"history\":["));
    EXPECT_NE(hist.find("\"rank\":3"), std::string::npos) << hist;
    EXPECT_NE(hist.find("\"active\":true"), std::string::npos) << hist;
    first_seen = number_after(hist, "first_seen_ns");
    EXPECT_GT(first_seen, first_round) << "the finding cannot predate the healthy first round";

    // Nothing new: no more rounds (unchanged jobs are skipped).
    uint64_t settled = kept(c);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_EQ(kept(c), settled);
    w->reset();
  }
  {
    // A restart: the kept findings answer, with their history; nothing is diagnosed again.
    Collector c(diagnosing(db), port);
    std::string again = c.get("/api/v1/findings?job=" + job);
    ASSERT_NE(again.find("\"cause\":\"host-hotspot\""), std::string::npos) << again;
    EXPECT_EQ(number_after(again.substr(again.find("\"history\":[")), "first_seen_ns"), first_seen);
    EXPECT_EQ(kept(c), 0u);
    auto text = run(strata_bin() + " diagnose --server " + c.url() + " --job " + job);
    EXPECT_EQ(text.exit_code, 0) << text.err;
    EXPECT_NE(text.out.find("ACTIVE"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("host-hotspot on rank 3"), std::string::npos) << text.out;
  }
}

// Two nodes whose processes have the same pids (containers, or just chance on a large cluster):
// the recorded 4-rank job is shipped by two agents through the real ingest path, ranks 0-1 from
// node-a and ranks 2-3 from node-b under node-a's pids. Every rank's steps, stacks and metrics stay
// its own, and the diagnosis names the culprit (rank 3) with its node.
void ship_node(agent::shipper::BatchingWriter& w, int64_t rec, const Recorded& r, const std::set<uint32_t>& pids,
               const std::map<uint32_t, uint32_t>& remap) {
  auto pid = [&](uint32_t p) {
    auto it = remap.find(p);
    return it == remap.end() ? p : it->second;
  };
  auto mine = [&](uint32_t p) { return pids.count(p) > 0; };
  for (auto p : r.procs) {
    if (!mine(p.pid)) continue;
    p.pid = pid(p.pid);
    ASSERT_TRUE(w.put_process(rec, p));
  }
  std::vector<store::CommunicatorRecord> comms;
  for (auto x : r.comms) if (mine(x.pid)) x.pid = pid(x.pid), comms.push_back(x);
  std::vector<store::StepRecord> steps;
  for (auto x : r.steps) if (mine(x.pid)) x.pid = pid(x.pid), steps.push_back(x);
  std::vector<store::CollectiveRecord> colls;
  for (auto x : r.colls) if (mine(x.pid)) x.pid = pid(x.pid), colls.push_back(x);
  std::vector<store::DeviceActivity> dev;
  for (auto x : r.device) if (mine(x.pid)) x.pid = pid(x.pid), dev.push_back(x);
  ASSERT_TRUE(w.put_communicators(rec, comms));
  ASSERT_TRUE(w.put_steps(rec, steps));
  ASSERT_TRUE(w.put_collectives(rec, colls));
  ASSERT_TRUE(w.put_device_activity(rec, dev));
  std::map<std::pair<uint64_t, uint64_t>, std::vector<store::Metric>> by_window;
  for (const auto& m : r.metrics) {
    if (m.metric.pid != 0 && !mine(m.metric.pid)) continue;  // pid 0: the node's own series, on each node
    store::Metric x = m.metric;
    x.pid = pid(x.pid);
    by_window[{m.start_ns, m.end_ns}].push_back(x);
  }
  for (const auto& [win, ms] : by_window) ASSERT_TRUE(w.put_metrics(rec, win.first, win.second, ms));
  for (const auto& [kind, prof] : r.profiles) {
    std::vector<store::StackCount> counts;
    for (const auto& smp : prof.samples) {
      if (!mine(smp.pid)) continue;
      auto id = w.intern_stack(prof.stacks[smp.stack_index], store::UnwindMethod::kFramePointer);
      ASSERT_TRUE(id);
      counts.push_back({pid(smp.pid), smp.tid, smp.comm, *id, smp.count});
    }
    ASSERT_TRUE(w.put_window(rec, r.start_ns, r.end_ns, kind, counts));
  }
  ASSERT_TRUE(w.commit());
  ASSERT_TRUE(w.drain(30));
}

uint64_t count_of(const std::string& body, const std::string& needle) {
  uint64_t n = 0;
  for (size_t at = body.find(needle); at != std::string::npos; at = body.find(needle, at + 1)) ++n;
  return n;
}

// Sum of the sample counts of a folded profile ("a;b;c 12" per line).
uint64_t folded_total(const std::string& folded) {
  uint64_t total = 0;
  std::stringstream in(folded);
  for (std::string line; std::getline(in, line);) {
    auto sp = line.rfind(' ');
    if (sp != std::string::npos) total += std::stoull(line.substr(sp + 1));
  }
  return total;
}

// strata diagnose FILE.db --from/--to: only the span is read. Before the hotspot (step 10) the job
// is healthy; over the whole run rank 3's hotspot is found; a span with no step is refused.
// Ranks whose environment names no RANK and no job (torch.multiprocessing.spawn's): the collector
// diagnoses their job, named after their parent as the loader names it, and keeps its findings.
// Before, its rounds took only processes with a RANK and never diagnosed such a job.
TEST(ServeDiagnosis, AJobWhoseRanksHaveNoRankIsDiagnosed) {
  TempDir tmp;
  Recorded r = load(std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/host-hotspot.db");
  ASSERT_FALSE(r.steps.empty());
  std::string job;
  for (auto& p : r.procs) {
    if (p.rank >= 0) job = "strata-sim-" + std::to_string(p.ppid);  // the parent's comm and pid
    p.rank = p.local_rank = p.world_size = -1;
    p.job.clear();
  }
  ASSERT_EQ(job, "strata-sim-19106");
  Collector c(diagnosing(tmp.file("server.db")), free_port());
  auto w = node_writer(c.url(), "vm", "replay-1", tmp.file("spool"));
  ASSERT_TRUE(w) << w.error().message;
  auto rec = begin_replay(**w, r, "vm", "replay of host-hotspot.db without RANK");
  ASSERT_TRUE(rec);
  ship_slice(**w, *rec, r, 0, 1);
  for (int k = 0; k < 300 && kept(c) < 1; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(kept(c), 1u) << "no diagnosis round";
  std::string found = c.get("/api/v1/findings?job=" + job);
  EXPECT_NE(found.find("\"cause\":\"host-hotspot\""), std::string::npos) << found;
  EXPECT_NE(found.find("has a RANK in its environment"), std::string::npos) << found;
  // The pages show the job as the diagnosis names it: the job list, the processes, a heatmap row
  // per rank and rank 3's differential profile (before, the job had no rank and no page).
  std::string jobs = c.get("/api/v1/jobs");
  EXPECT_NE(jobs.find("{\"job\":\"" + job + "\",\"world_size\":4,\"ranks\":4"), std::string::npos) << jobs;
  std::string procs = c.get("/api/v1/processes?job=" + job);
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(procs.find("\"rank\":" + std::to_string(rank) + ","), std::string::npos) << procs.substr(0, 600);
  std::string heat = c.get("/api/v1/heatmap?job=" + job + "&series=step_ms");
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(heat.find("{\"rank\":" + std::to_string(rank) + ",\"pid\":"), std::string::npos) << heat.substr(0, 600);
  std::string diff = c.get("/api/v1/diff?job=" + job + "&rank=3");
  EXPECT_EQ(diff.find("\"error\""), std::string::npos) << diff.substr(0, 300);
  EXPECT_NE(diff.find("cpu_work"), std::string::npos) << diff.substr(0, 600);
  w->reset();
}

// Ships the whole recorded job to `c` as one agent on node "vm", in one slice; the writer is the
// caller's to keep until it is done with the collector (none where the writer could not start).
std::unique_ptr<agent::shipper::BatchingWriter> ship_whole(const Collector& c, const Recorded& r, const TempDir& tmp) {
  auto w = node_writer(c.url(), "vm", "replay-1", tmp.file("spool"));
  EXPECT_TRUE(w) << (w ? "" : w.error().message);
  if (!w) return nullptr;
  auto rec = begin_replay(**w, r, "vm", "replay of host-hotspot.db");
  EXPECT_TRUE(rec);
  if (!rec) return nullptr;
  ship_slice(**w, *rec, r, 0, 1);
  return std::move(*w);
}

// A rank's timeline reads a span, never the rank's whole history: `from`/`to` keep the rows of that
// span; one of them alone reads 10 minutes from it, neither the store's latest 10 minutes (up to its
// latest step); the span read comes back in headers; a span past an hour, or backwards, is refused
// with its reason.
TEST(ServeTimeline, ARanksTimelineReadsItsSpanAndNeverTheWholeHistoryUnasked) {
  TempDir tmp;
  Recorded r = load(std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/host-hotspot.db");
  uint32_t pid = 0;
  for (const auto& p : r.procs)
    if (p.rank == 3) pid = p.pid;
  std::vector<store::StepRecord> mine;
  for (const auto& s : r.steps)
    if (s.pid == pid) mine.push_back(s);
  std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  ASSERT_GE(mine.size(), 20u);
  server::ServeOptions o;
  o.store = "sqlite:" + tmp.file("server.db");
  Collector c(o, free_port());
  auto w = ship_whole(c, r, tmp);
  ASSERT_TRUE(w);

  httplib::Client cli("127.0.0.1", c.port());
  cli.set_read_timeout(60, 0);
  const std::string base = "/api/v1/timeline?job=strata-sim-19106&rank=3";
  auto steps_in = [&](const std::string& query, uint64_t* from = nullptr, uint64_t* to = nullptr) -> size_t {
    auto res = cli.Get((base + query).c_str());
    EXPECT_TRUE(res && res->status == 200) << query << ": " << (res ? res->body.substr(0, 300) : "no answer");
    if (!res || res->status != 200) return SIZE_MAX;
    if (from) *from = std::stoull(res->get_header_value("X-Strata-Span-From-Ns"));
    if (to) *to = std::stoull(res->get_header_value("X-Strata-Span-To-Ns"));
    size_t n = 0;
    for (size_t at = 0; (at = res->body.find("\"cat\":\"step\"", at)) != std::string::npos; ++at) ++n;
    return n;
  };
  auto ns = [](uint64_t t) { return std::to_string(t); };
  const size_t k = mine.size() / 2;
  // Three steps from the middle of the run: those three, and at most a neighbour that touches the span.
  const size_t middle = steps_in("&from=" + ns(mine[k].start_ns) + "&to=" + ns(mine[k + 2].end_ns));
  EXPECT_GE(middle, 3u);
  EXPECT_LE(middle, 5u);
  // Neither: the latest 10 minutes up to the latest step; this run is shorter, so all of it.
  uint64_t from = 0, to = 0;
  EXPECT_EQ(steps_in("", &from, &to), mine.size());
  uint64_t latest = 0;
  for (const auto& s : r.steps) latest = std::max(latest, s.end_ns);
  EXPECT_EQ(to, latest + 1);
  EXPECT_EQ(to - from, 600'000'000'000ull);
  // `from` alone: 10 minutes on from there (the rest of the run); `to` alone: 10 minutes up to it.
  EXPECT_EQ(steps_in("&from=" + ns(mine[k].start_ns)), mine.size() - k);
  EXPECT_EQ(steps_in("&to=" + ns(mine[k].end_ns)), k + 1);
  // Refused, with the reason: more than an hour, backwards, not a number.
  for (const std::string& q : std::vector<std::string>{"&from=1000&to=" + ns(1000 + 3'600'000'000'001ull), "&from=2000&to=1000", "&from=yesterday"}) {
    auto res = cli.Get((base + q).c_str());
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << q;
    EXPECT_NE(res->body.find("\"error\""), std::string::npos) << q << ": " << res->body;
  }
  w.reset();
}

// The heatmap reads a span of steps (by default the latest 10 minutes up to the store's latest
// step), the job's alone, and lines its rows up on time: a span that starts between one rank's end
// of a step and its peer's (their ends differ by the all-reduce's spread) gives the first rank no
// cell in the first column, not a row one step ahead of the others.
TEST(ServeHeatmap, ASpanOfStepsWithRanksLinedUpOnTime) {
  TempDir tmp;
  Recorded r = load(std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/host-hotspot.db");
  std::map<uint32_t, std::vector<store::StepRecord>> by_pid;
  for (const auto& p : r.procs)
    if (p.rank >= 0) by_pid[p.pid];
  for (const auto& s : r.steps)
    if (by_pid.count(s.pid)) by_pid[s.pid].push_back(s);
  ASSERT_EQ(by_pid.size(), 4u);
  const size_t k = 20;
  uint64_t lo = UINT64_MAX, hi = 0, latest = 0;
  for (auto& [pid, v] : by_pid) {
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
    ASSERT_GT(v.size(), k + 10);
    lo = std::min(lo, v[k].end_ns);
    hi = std::max(hi, v[k].end_ns);
    latest = std::max(latest, v.back().end_ns);
  }
  ASSERT_LT(lo, hi) << "the ranks' step ends must differ for a span to cut between them";
  server::ServeOptions o;
  o.store = "sqlite:" + tmp.file("server.db");
  Collector c(o, free_port());
  auto w = ship_whole(c, r, tmp);
  ASSERT_TRUE(w);

  const std::string base = "/api/v1/heatmap?job=strata-sim-19106&series=step_ms";
  // No span: the latest 10 minutes up to the latest step; this run is shorter, so all of its steps.
  auto all = nlohmann::json::parse(c.get(base), nullptr, false);
  ASSERT_FALSE(all.is_discarded());
  EXPECT_EQ(all["steps"].get<size_t>(), by_pid.begin()->second.size());
  EXPECT_EQ(all["to_ns"].get<uint64_t>(), latest + 1);
  EXPECT_EQ(all["to_ns"].get<uint64_t>() - all["from_ns"].get<uint64_t>(), 600'000'000'000ull);

  // A span from between the ranks' ends of step k.
  const uint64_t from = lo + (hi - lo) / 2;
  const uint64_t to = from + 2'000'000'000ull;
  auto cut = nlohmann::json::parse(c.get(base + "&from=" + std::to_string(from) + "&to=" + std::to_string(to)), nullptr, false);
  ASSERT_FALSE(cut.is_discarded());
  const size_t columns = cut["steps"].get<size_t>();
  ASSERT_GE(columns, 8u);
  const auto& starts = cut["step_start_ns"];
  const auto& ends = cut["step_end_ns"];
  std::vector<uint64_t> lengths;
  for (const auto& [pid, v] : by_pid)
    for (const auto& s : v) lengths.push_back(s.end_ns - s.start_ns);
  std::sort(lengths.begin(), lengths.end());
  const uint64_t median = lengths[lengths.size() / 2];
  // Each column holds one step of every rank: from its earliest start to its latest end, about one
  // step long (two, where a row was a step ahead).
  for (size_t i = 0; i < columns; ++i)
    EXPECT_LT(ends[i].get<uint64_t>() - starts[i].get<uint64_t>(), median * 3 / 2) << "column " << i;
  size_t first_empty = 0, first_full = 0;
  for (const auto& row : cut["series"]["step_ms"]) {
    ASSERT_FALSE(row.empty());
    (row[0].is_null() ? first_empty : first_full)++;
  }
  EXPECT_GT(first_empty, 0u) << "a rank whose step ended before the span has no cell in its first column";
  EXPECT_GT(first_full, 0u);
  // Refused with the reason: a span longer than an hour.
  EXPECT_EQ(c.get(base + "&from=1&to=" + std::to_string(1 + 3'600'000'000'001ull)), "");

  // os=: OS metrics summed per rank over the span (the per-rank breakdown's columns), each window
  // prorated by its share in the span: the whole of every window here, then half of the run.
  uint64_t m_lo = UINT64_MAX, m_hi = 0;
  std::map<uint32_t, double> cpu_us;  // pid -> os.cpu_time_us over the run
  for (const auto& m : r.metrics) {
    m_lo = std::min(m_lo, m.start_ns);
    m_hi = std::max(m_hi, m.end_ns);
    if (m.metric.name == "os.cpu_time_us") cpu_us[m.metric.pid] += m.metric.value;
  }
  auto with_os = nlohmann::json::parse(
      c.get(base + "&os=os.cpu_time_us,os.blocked_us&from=" + std::to_string(m_lo) + "&to=" + std::to_string(m_hi)), nullptr, false);
  ASSERT_FALSE(with_os.is_discarded());
  ASSERT_TRUE(with_os["summary"].contains("os")) << with_os["summary"].dump().substr(0, 300);
  const auto& ranks = with_os["ranks"];
  for (size_t i = 0; i < ranks.size(); ++i) {
    const uint32_t pid = ranks[i]["pid"].get<uint32_t>();
    ASSERT_GT(cpu_us[pid], 0) << "pid " << pid;
    EXPECT_NEAR(with_os["summary"]["os"]["os.cpu_time_us"][i].get<double>(), cpu_us[pid], 0.01) << "rank " << ranks[i]["rank"];
  }
  const uint64_t half = m_lo + (m_hi - m_lo) / 2;
  std::map<uint32_t, double> cpu_half;
  for (const auto& m : r.metrics) {
    if (m.metric.name != "os.cpu_time_us" || m.end_ns <= m.start_ns) continue;
    const uint64_t hi = std::min(m.end_ns, half);
    if (hi > m.start_ns) cpu_half[m.metric.pid] += m.metric.value * static_cast<double>(hi - m.start_ns) / static_cast<double>(m.end_ns - m.start_ns);
  }
  auto first_half = nlohmann::json::parse(
      c.get(base + "&os=os.cpu_time_us&from=" + std::to_string(m_lo) + "&to=" + std::to_string(half)), nullptr, false);
  ASSERT_FALSE(first_half.is_discarded());
  for (size_t i = 0; i < first_half["ranks"].size(); ++i) {
    const uint32_t pid = first_half["ranks"][i]["pid"].get<uint32_t>();
    EXPECT_LT(cpu_half[pid], cpu_us[pid]);
    EXPECT_NEAR(first_half["summary"]["os"]["os.cpu_time_us"][i].get<double>(), cpu_half[pid], 0.01) << "rank " << first_half["ranks"][i]["rank"];
  }
  EXPECT_FALSE(all["summary"].contains("os")) << "only when asked";
  EXPECT_EQ(c.get(base + "&os=cpu_time_us"), "") << "a name outside os. is refused";
  w.reset();
}

// What `strata record` diagnoses, the collector diagnoses from what agents ship: the recorded
// slow-cpu case (os.cpu_time_by_cpu_us, where each rank ran) replayed through an agent's shipper
// names the same rank and CPU.
TEST(ServeDiagnosis, ASlowerCpuIsNamedFromWhatTheAgentShips) {
  TempDir tmp;
  Recorded r = load(std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/slow-cpu.db");
  ASSERT_FALSE(r.steps.empty());
  Collector c(diagnosing(tmp.file("server.db")), free_port());
  auto w = ship_whole(c, r, tmp);
  ASSERT_TRUE(w);
  std::string found;
  for (int k = 0; k < 300 && found.find("\"cause\":\"slow-cpu\"") == std::string::npos; ++k) {
    found = c.get("/api/v1/findings?job=strata-sim-2816");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(found.find("\"cause\":\"slow-cpu\""), std::string::npos) << found.substr(0, 600);
  EXPECT_NE(found.find("\"culprit\":\"CPU 1 of vm\""), std::string::npos) << found.substr(0, 600);
  EXPECT_NE(found.find("\"rank\":1,\"node\":\"vm\""), std::string::npos) << found.substr(0, 600);
  w.reset();
}

// A job that ended before the store's latest 10 minutes (another job ran on since) opens on its own
// latest steps, found by its kept diagnosis: the heatmap, the timeline, the differential profile and
// the fidelity notice read the span that ends a quarter of the default span after its last
// diagnosed window. The later job's pages read the store's latest 10 minutes, as before.
TEST(ServeHeatmap, AJobThatEndedEarlierOpensOnItsOwnLatestSteps) {
  TempDir tmp;
  Recorded r = load(std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/host-hotspot.db");
  const std::string job = "strata-sim-19106";
  size_t rank3_steps = 0;
  uint32_t rank3 = 0;
  for (const auto& p : r.procs)
    if (p.rank == 3) rank3 = p.pid;
  for (const auto& s : r.steps) rank3_steps += s.pid == rank3;
  ASSERT_GT(rank3_steps, 10u);
  Collector c(diagnosing(tmp.file("server.db")), free_port());
  auto w = ship_whole(c, r, tmp);
  ASSERT_TRUE(w);
  std::string found;
  for (int k = 0; k < 300 && found.find("\"window_end_ns\"") == std::string::npos; ++k) {
    found = c.get("/api/v1/findings?job=" + job);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const uint64_t window_end = number_after(found, "window_end_ns");
  ASSERT_GT(window_end, 0u) << found.substr(0, 300);

  // Half an hour after it ended, another job on another node: five steps of a second.
  constexpr uint64_t kS = 1'000'000'000ull;
  const uint64_t later0 = r.end_ns + 1800 * kS;
  auto w2 = node_writer(c.url(), "vm2", "later-agent", tmp.file("spool-later"));
  ASSERT_TRUE(w2) << w2.error().message;
  auto rec = (*w2)->begin_recording({"vm2", "train.py", later0, 99, 10});
  ASSERT_TRUE(rec);
  store::ProcessInfo p = rank_on(7, "vm2", "later", 0);
  p.world_size = 1;
  ASSERT_TRUE((*w2)->put_process(*rec, p));
  std::vector<store::StepRecord> steps;
  for (uint64_t i = 0; i < 5; ++i) {
    store::StepRecord s;
    s.node = "vm2";
    s.pid = 7;
    s.step = i + 1;
    s.start_ns = later0 + i * kS;
    s.end_ns = later0 + (i + 1) * kS;
    steps.push_back(s);
  }
  ASSERT_TRUE((*w2)->put_steps(*rec, steps));
  ASSERT_TRUE((*w2)->commit());
  ASSERT_TRUE((*w2)->drain(30));

  auto later = nlohmann::json::parse(c.get("/api/v1/heatmap?job=later&series=step_ms"), nullptr, false);
  ASSERT_FALSE(later.is_discarded());
  EXPECT_EQ(later["steps"].get<size_t>(), 5u);
  EXPECT_EQ(later["to_ns"].get<uint64_t>(), later0 + 5 * kS + 1) << "a running job's span ends at the store's latest step";

  // The job that ended: all of its steps, in the 10 minutes that end 150 s after its kept window.
  auto ended = nlohmann::json::parse(c.get("/api/v1/heatmap?job=" + job + "&series=step_ms"), nullptr, false);
  ASSERT_FALSE(ended.is_discarded());
  EXPECT_EQ(ended["steps"].get<size_t>(), rank3_steps) << "before, its page read the later job's span: no step of it";
  const uint64_t to = ended["to_ns"].get<uint64_t>();
  EXPECT_EQ(to, window_end + 150 * kS);
  EXPECT_EQ(to - ended["from_ns"].get<uint64_t>(), 600 * kS);
  EXPECT_GE(to, r.end_ns);
  // The other pages of the job read the same span, and so does the flame page's download.
  httplib::Client cli("127.0.0.1", c.port());
  cli.set_read_timeout(60, 0);
  for (const std::string& page : {"/api/v1/timeline?job=" + job + "&rank=3", "/api/v1/diff?job=" + job + "&rank=3",
                                 "/api/v1/fidelity?job=" + job, "/api/v1/profile?job=" + job + "&rank=3"}) {
    auto res = cli.Get(page.c_str());
    ASSERT_TRUE(res && res->status == 200) << page;
    EXPECT_EQ(res->get_header_value("X-Strata-Span-To-Ns"), std::to_string(to)) << page;
  }
  auto trace = cli.Get(("/api/v1/timeline?job=" + job + "&rank=3").c_str());
  ASSERT_TRUE(trace);
  size_t in_trace = 0;
  for (size_t at = 0; (at = trace->body.find("\"cat\":\"step\"", at)) != std::string::npos; ++at) ++in_trace;
  EXPECT_EQ(in_trace, rank3_steps);
  w.reset();
  w2->reset();
}

// Jobs whose ranks are still joining: the recorded 4-rank job (world size 4) comes from two agents,
// ranks 0-1 from node-a first. The background rounds wait for the other two (a round of half a job
// says little, and each round that finds new ranks reads the job's span whole again), and diagnose
// the job once node-b's ranks arrived, all four of them. A rank that never joins holds the rounds
// back no longer than the grace (DiagnoserOptions::join_grace_ns): then the two ranks there are
// diagnosed.
void ship_half(Collector& c, const Recorded& r, const std::string& node, int first_rank, const TempDir& tmp) {
  std::set<uint32_t> pids;
  for (const auto& p : r.procs)
    if (p.rank < 0 || p.rank == first_rank || p.rank == first_rank + 1) pids.insert(p.pid);
  auto w = node_writer(c.url(), node, node + "-agent", tmp.file("spool-" + node));
  ASSERT_TRUE(w) << w.error().message;
  auto rec = begin_replay(**w, r, node, "replay of host-hotspot.db");
  ASSERT_TRUE(rec);
  ship_node(**w, *rec, r, pids, {});
}

uint64_t waiting(const Collector& c) {
  uint64_t n = c.metric("strata_serve_diagnoses_total{outcome=\"waiting\"}");
  return n == UINT64_MAX ? 0 : n;
}

TEST(ServeDiagnosis, AJobWhoseRanksAreStillJoiningWaitsForThem) {
  TempDir tmp;
  Recorded r = load(std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/host-hotspot.db");
  ASSERT_FALSE(r.steps.empty());
  for (const auto& p : r.procs) {
    if (p.rank >= 0) {
      ASSERT_EQ(p.world_size, 4);
    }
  }
  const std::string job = "strata-sim-19106";
  Collector c(diagnosing(tmp.file("server.db")), free_port());  // the default grace: 30 s
  ship_half(c, r, "node-a", 0, tmp);
  for (int k = 0; k < 100 && waiting(c) < 3; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GE(waiting(c), 3u) << "no round waited for the ranks still joining";
  EXPECT_EQ(kept(c), 0u) << "a job with 2 of its 4 ranks was diagnosed before the grace ran out";
  ship_half(c, r, "node-b", 2, tmp);
  for (int k = 0; k < 300 && kept(c) < 1; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(kept(c), 1u) << "no round after every rank joined";
  std::string found = c.get("/api/v1/findings?job=" + job);
  EXPECT_NE(found.find("\"ranks\":4,"), std::string::npos) << found.substr(0, 300);
  EXPECT_NE(found.find("\"cause\":\"host-hotspot\""), std::string::npos) << found.substr(0, 600);
}

TEST(ServeDiagnosis, ARankThatNeverJoinsHoldsTheRoundsBackOnlyForTheGrace) {
  TempDir tmp;
  Recorded r = load(std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/host-hotspot.db");
  ASSERT_FALSE(r.steps.empty());
  auto o = diagnosing(tmp.file("server.db"));
  o.diagnose_join_grace_s = 1;
  Collector c(o, free_port());
  const auto t0 = std::chrono::steady_clock::now();
  ship_half(c, r, "node-a", 0, tmp);
  for (int k = 0; k < 300 && kept(c) < 1; ++k) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(kept(c), 1u) << "a job missing a rank was never diagnosed";
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << "diagnosed before the grace ran out";
  EXPECT_GE(waiting(c), 1u);
  std::string found = c.get("/api/v1/findings?job=strata-sim-19106");
  EXPECT_NE(found.find("\"ranks\":2,"), std::string::npos) << found.substr(0, 300);
}

TEST(ServeDiagnosis, ASpanOfARecordingIsDiagnosedAlone) {
  const std::string db = std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/host-hotspot.db";
  Recorded r = load(db);
  ASSERT_FALSE(r.steps.empty());
  uint64_t fault_start = UINT64_MAX, first = UINT64_MAX;
  for (const auto& s : r.steps) {
    first = std::min(first, s.start_ns);
    if (s.step == 10) fault_start = std::min(fault_start, s.start_ns);
  }
  ASSERT_NE(fault_start, UINT64_MAX);
  auto before = run(strata_bin() + " diagnose " + db + " --json --to " + std::to_string(fault_start));
  ASSERT_EQ(before.exit_code, 0) << before.err;
  EXPECT_NE(before.out.find("\"healthy\":true"), std::string::npos) << before.out.substr(0, 400);
  auto whole = run(strata_bin() + " diagnose " + db + " --json --from " + std::to_string(first));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  EXPECT_NE(whole.out.find("\"cause\":\"host-hotspot\""), std::string::npos) << whole.out.substr(0, 400);
  auto none = run(strata_bin() + " diagnose " + db + " --from 1 --to 2");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("no training step in the time span"), std::string::npos) << none.err;
  auto bad = run(strata_bin() + " diagnose " + db + " --from 5 --to 2");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--from must come before --to"), std::string::npos) << bad.err;
}

TEST(ServeDiagnosis, TwoNodesWithTheSamePidsKeepTheirOwnRanks) {
  TempDir tmp;
  const std::string db = tmp.file("server.db");
  Recorded r = load(std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/host-hotspot.db");
  ASSERT_FALSE(r.steps.empty());
  const std::string job = "strata-sim-19106";
  // The recording's processes: the launcher, ranks 0-3.
  std::map<int, uint32_t> pid_of_rank;
  uint32_t launcher = 0;
  for (const auto& p : r.procs) {
    if (p.rank >= 0) pid_of_rank[p.rank] = p.pid;
    else launcher = p.pid;
  }
  ASSERT_EQ(pid_of_rank.size(), 4u);
  ASSERT_NE(launcher, 0u);
  // node-b's ranks 2 and 3 run under node-a's rank 0 and 1 pids; each node has its own launcher.
  const std::set<uint32_t> a_pids{launcher, pid_of_rank[0], pid_of_rank[1]};
  const std::set<uint32_t> b_pids{launcher, pid_of_rank[2], pid_of_rank[3]};
  const std::map<uint32_t, uint32_t> b_remap{{pid_of_rank[2], pid_of_rank[0]}, {pid_of_rank[3], pid_of_rank[1]}};
  const uint32_t shared = pid_of_rank[1];  // rank 1 on node-a, rank 3 (the culprit) on node-b

  // What each rank had in the recording, to compare with what the collector keeps per (node, pid).
  auto steps_of = [&](uint32_t pid) {
    uint64_t n = 0, ns = 0;
    for (const auto& s : r.steps) if (s.pid == pid) ++n, ns += s.end_ns - s.start_ns;
    return std::pair{n, ns};
  };
  auto samples_of = [&](uint32_t pid) {
    uint64_t n = 0;
    for (const auto& smp : r.profiles[0].second.samples) if (smp.pid == pid) n += smp.count;
    return n;
  };
  auto metric_rows_of = [&](uint32_t pid) {
    uint64_t n = 0;
    for (const auto& m : r.metrics) n += m.metric.pid == pid && m.metric.name.rfind("os.", 0) == 0;
    return n;
  };
  ASSERT_NE(steps_of(pid_of_rank[1]).second, steps_of(pid_of_rank[3]).second);
  ASSERT_NE(samples_of(pid_of_rank[1]), samples_of(pid_of_rank[3]));

  Collector c(diagnosing(db), free_port());
  for (const std::string node : {"node-a", "node-b"}) {
    auto w = node_writer(c.url(), node, node + "-agent", tmp.file("spool-" + node));
    ASSERT_TRUE(w) << w.error().message;
    auto rec = begin_replay(**w, r, node, "replay of host-hotspot.db");
    ASSERT_TRUE(rec);
    const bool a = node == "node-a";
    ship_node(**w, *rec, r, a ? a_pids : b_pids, a ? std::map<uint32_t, uint32_t>{} : b_remap);
  }

  // Steps: the same pid on two nodes is two processes.
  for (const auto& [node, rank] : {std::pair{"node-a", 1}, std::pair{"node-b", 3}}) {
    const std::string q = "?node=" + std::string(node) + "&pid=" + std::to_string(shared) + "&limit=100000";
    std::string steps = c.get("/api/v1/steps" + q);
    auto [n, ns] = steps_of(pid_of_rank[rank]);
    EXPECT_EQ(count_of(steps, "\"step\":"), n) << node << " rank " << rank << ": " << steps.substr(0, 300);
    uint64_t got_ns = 0;
    std::regex span("\"start_ns\":([0-9]+),\"end_ns\":([0-9]+)");
    for (std::sregex_iterator it(steps.begin(), steps.end(), span), end; it != end; ++it)
      got_ns += std::stoull((*it)[2]) - std::stoull((*it)[1]);
    EXPECT_EQ(got_ns, ns) << node << " rank " << rank << "'s steps are not its own";
    // Stacks.
    std::string folded = c.get("/api/v1/profile" + q);
    EXPECT_EQ(folded_total(folded), samples_of(pid_of_rank[rank])) << node << " rank " << rank;
    // Metrics.
    std::string metrics = c.get("/api/v1/metrics" + q + "&prefix=os.");
    EXPECT_EQ(count_of(metrics, "\"name\":"), metric_rows_of(pid_of_rank[rank])) << node << " rank " << rank;
    EXPECT_EQ(count_of(metrics, "\"node\":\"" + std::string(node) + "\""), metric_rows_of(pid_of_rank[rank]));
  }
  // Without a node, a pid names that pid on every node.
  EXPECT_EQ(folded_total(c.get("/api/v1/profile?pid=" + std::to_string(shared))),
            samples_of(pid_of_rank[1]) + samples_of(pid_of_rank[3]));

  // The heatmap: four ranks, each with its own steps, and its node.
  std::string heat = c.get("/api/v1/heatmap?job=" + job + "&series=step_ms");
  EXPECT_NE(heat.find("{\"rank\":3,\"pid\":" + std::to_string(shared) + ",\"node\":\"node-b\"}"), std::string::npos) << heat.substr(0, 600);
  EXPECT_NE(heat.find("{\"rank\":1,\"pid\":" + std::to_string(shared) + ",\"node\":\"node-a\"}"), std::string::npos);
  EXPECT_EQ(number_after(heat, "steps"), steps_of(pid_of_rank[3]).first) << "a rank's row holds another's steps";

  // The differential profile of rank 3 holds rank 3's samples alone.
  std::string diff = c.get("/api/v1/diff?job=" + job + "&rank=3");
  uint64_t rank_total = 0;
  std::regex stack_row("\\[\"[^\"]*\",([0-9]+),([0-9]+)\\]");
  for (std::sregex_iterator it(diff.begin(), diff.end(), stack_row), end; it != end; ++it) rank_total += std::stoull((*it)[1]);
  EXPECT_EQ(rank_total, samples_of(pid_of_rank[3]));

  // The diagnosis names the culprit by rank and node.
  std::string found;
  for (int k = 0; k < 300; ++k) {
    found = c.get("/api/v1/findings?job=" + job);
    if (found.find("\"cause\":\"host-hotspot\"") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_NE(found.find("\"cause\":\"host-hotspot\""), std::string::npos) << found;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(found, m, std::regex("\\{(?:\"scope\":\"[a-z]+\",)?\"rank\":([0-9]+),\"node\":\"([^\"]*)\"")))
      << found.substr(0, 600);
  EXPECT_EQ(m[1], "3");
  EXPECT_EQ(m[2], "node-b");
  EXPECT_NE(found.find("\"culprit\":\"cpu_work\""), std::string::npos) << found.substr(0, 600);
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Issue 19: the windows' fidelity travels agent -> collector (ingest) -> store -> the web API and
// `strata report --server` (export): one window at 99 Hz with CFI, two at 24 Hz with frame pointers.
TEST(ServeFidelity, WindowRatesAndUnwindingReachTheApiAndTheRemoteReader) {
  TempDir tmp;
  Collector c(diagnosing(tmp.file("server.db")), free_port());
  auto w = node_writer(c.url(), "node-a", "node-a-agent", tmp.file("spool"));
  ASSERT_TRUE(w) << w.error().message;
  constexpr uint64_t kS = 1'000'000'000ull;
  const uint64_t t0 = 1'700'000'000 * kS;
  auto rec = (*w)->begin_recording({"node-a", "train.py", t0, 99, 10});
  ASSERT_TRUE(rec);
  ASSERT_TRUE((*w)->put_process(*rec, rank_on(42, "node-a", "job-f", 0)));
  Frame f;
  f.kind = FrameKind::kNative;
  f.module = "/usr/bin/app";
  f.function = "work";
  auto sid = (*w)->intern_stack({f}, store::UnwindMethod::kFramePointer);
  ASSERT_TRUE(sid);
  ASSERT_TRUE((*w)->put_window(*rec, t0, t0 + 10 * kS, store::CountKind::kOnCpu, {{42, 42, "python", *sid, 990}},
                               {99, store::kUnwindingCfi}));
  for (int i = 1; i <= 2; ++i)
    ASSERT_TRUE((*w)->put_window(*rec, t0 + 10 * kS * static_cast<uint64_t>(i), t0 + 10 * kS * static_cast<uint64_t>(i + 1),
                                 store::CountKind::kOnCpu, {{42, 42, "python", *sid, 240}},
                                 {24, store::kUnwindingFramePointers}));
  ASSERT_TRUE((*w)->commit());
  ASSERT_TRUE((*w)->drain(30));

  const std::string fid = c.get("/api/v1/fidelity?job=job-f");
  EXPECT_NE(fid.find("{\"node\":\"node-a\",\"ranks\":[0],\"start_ns\":" + std::to_string(t0 + 10 * kS) + ",\"end_ns\":" +
                     std::to_string(t0 + 30 * kS) + ",\"windows\":2,\"configured_hz\":99,\"sample_hz\":24,\"unwinding\":\"fp\"}"),
            std::string::npos) << fid;
  // The flame graph's folded profile: 990 samples at 99 Hz and 480 at 24 Hz are 30 s of CPU, 2970
  // samples at 99 Hz (not 1470).
  const std::string folded = c.get("/api/v1/profile?pid=42");
  ASSERT_EQ(folded.rfind("work ", 0), 0u) << folded;
  EXPECT_NEAR(std::stod(folded.substr(5)), 2970.0, 0.1) << folded;

  auto remote = store::Store::open_remote(c.url(), "");
  ASSERT_TRUE(remote) << remote.error().message;
  auto prof = (*remote)->load_profile({});
  ASSERT_TRUE(prof) << prof.error().message;
  EXPECT_NEAR(prof->weighted_total(), 2970.0, 0.1);
  auto runs = (*remote)->reduced_fidelity();
  ASSERT_TRUE(runs) << runs.error().message;
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ(runs->front().sample_hz, 24u);
  EXPECT_EQ(runs->front().unwinding, store::kUnwindingFramePointers);
  EXPECT_EQ(runs->front().windows, 2u);
}


// The flame graph's downloads (/api/v1/profile), the remote reader's export and `strata report
// --server` read a span, by default the store's latest 10 minutes up to its latest step, never its
// whole history: a window from an hour before the latest step is out of them unless asked for.
TEST(ServeProfile, TheProfileAndTheExportReadTheLatestTenMinutesUnasked) {
  TempDir tmp;
  Collector c(diagnosing(tmp.file("server.db")), free_port());
  auto w = node_writer(c.url(), "node-a", "node-a-agent", tmp.file("spool"));
  ASSERT_TRUE(w) << w.error().message;
  constexpr uint64_t kS = 1'000'000'000ull;
  const uint64_t t0 = 1'700'000'000 * kS;
  const uint64_t t1 = t0 + 3600 * kS;  // an hour on
  auto rec = (*w)->begin_recording({"node-a", "train.py", t0, 99, 10});
  ASSERT_TRUE(rec);
  ASSERT_TRUE((*w)->put_process(*rec, rank_on(42, "node-a", "job-p", 0)));
  std::vector<store::StepRecord> steps;
  for (uint64_t at : {t0, t1}) {
    store::StepRecord st;
    st.pid = 42;
    st.step = steps.size() + 1;
    st.start_ns = at;
    st.end_ns = at + 10 * kS;
    steps.push_back(st);
  }
  ASSERT_TRUE((*w)->put_steps(*rec, steps));
  Frame old_fn, new_fn;
  old_fn.module = new_fn.module = "/usr/bin/app";
  old_fn.function = "old_work";
  old_fn.offset = 0x10;
  new_fn.function = "new_work";
  new_fn.offset = 0x20;
  auto old_id = (*w)->intern_stack({old_fn}, store::UnwindMethod::kFramePointer);
  auto new_id = (*w)->intern_stack({new_fn}, store::UnwindMethod::kFramePointer);
  ASSERT_TRUE(old_id && new_id);
  ASSERT_TRUE((*w)->put_window(*rec, t0, t0 + 10 * kS, store::CountKind::kOnCpu, {{42, 42, "python", *old_id, 100}},
                               {99, store::kUnwindingFramePointers}));
  ASSERT_TRUE((*w)->put_window(*rec, t1, t1 + 10 * kS, store::CountKind::kOnCpu, {{42, 42, "python", *new_id, 50}},
                               {99, store::kUnwindingFramePointers}));
  ASSERT_TRUE((*w)->commit());
  ASSERT_TRUE((*w)->drain(30));

  httplib::Client cli("127.0.0.1", c.port());
  cli.set_read_timeout(60, 0);
  auto res = cli.Get("/api/v1/profile?pid=42");
  ASSERT_TRUE(res && res->status == 200);
  EXPECT_EQ(res->body, "new_work 50\n") << "the latest 10 minutes alone";
  EXPECT_EQ(res->get_header_value("X-Strata-Span-To-Ns"), std::to_string(t1 + 10 * kS + 1));
  EXPECT_EQ(res->get_header_value("X-Strata-Span-From-Ns"), std::to_string(t1 + 10 * kS + 1 - 600 * kS));
  const std::string early = "&from=" + std::to_string(t0) + "&to=" + std::to_string(t0 + 600 * kS);
  EXPECT_EQ(c.get("/api/v1/profile?pid=42" + early), "old_work 100\n");
  res = cli.Get(("/api/v1/profile?pid=42&from=" + std::to_string(t0) + "&to=" + std::to_string(t1 + 1)).c_str());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << "a span past an hour: " << res->body;
  EXPECT_NE(res->body.find("at most 1h"), std::string::npos) << res->body;

  // The export (the remote reader): the same span, and the store's latest step.
  auto remote = store::Store::open_remote(c.url(), "");
  ASSERT_TRUE(remote) << remote.error().message;
  auto latest = (*remote)->latest_step_ns();
  ASSERT_TRUE(latest && *latest) << (latest ? "none" : latest.error().message);
  EXPECT_EQ(**latest, t1 + 10 * kS);
  auto prof = (*remote)->load_profile({});
  ASSERT_TRUE(prof) << prof.error().message;
  EXPECT_EQ(prof->total(), 50u);

  // strata report --server: by default the latest 10 minutes, said on stderr; --from/--to and
  // --last another span; past an hour refused before a request.
  const std::string report = strata_bin() + " report --server " + c.url() + " --format folded";
  const uint64_t exports = c.metric("strata_serve_requests_total{route=\"export\"}");
  auto out = run(report);
  EXPECT_EQ(c.metric("strata_serve_requests_total{route=\"export\"}"), exports + 1)
      << "the first read (the latest step) was of the default span: read once";
  EXPECT_EQ(out.exit_code, 0) << test::describe(out);
  EXPECT_EQ(out.out, "new_work 50\n") << test::describe(out);
  EXPECT_NE(out.err.find("600 s, from " + std::to_string(t1 + 10 * kS + 1 - 600 * kS)), std::string::npos) << out.err;
  out = run(report + " --from " + std::to_string(t0) + " --to " + std::to_string(t0 + 600 * kS));
  EXPECT_EQ(out.out, "old_work 100\n") << test::describe(out);
  out = run(report + " --last 59m");
  EXPECT_EQ(out.exit_code, 0) << test::describe(out);
  EXPECT_EQ(out.out, "new_work 50\n") << test::describe(out);
  out = run(report + " --last 2h");
  EXPECT_EQ(out.exit_code, 1) << test::describe(out);
  EXPECT_NE(out.err.find("at most 1h"), std::string::npos) << out.err;

  // --format chrome-trace: the collector's timeline of the span's ranks (by default the latest 10
  // minutes: the step at t1, not the one at t0).
  const std::string trace_file = tmp.file("trace.json");
  const std::string trace = strata_bin() + " report --server " + c.url() + " --format chrome-trace -o " + trace_file;
  auto slurp = [&] {
    std::ifstream in(trace_file);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  out = run(trace);
  EXPECT_EQ(out.exit_code, 0) << test::describe(out);
  std::string body = slurp();
  EXPECT_NE(body.find("\"step 2\""), std::string::npos) << body.substr(0, 2000);
  EXPECT_EQ(body.find("\"step 1\""), std::string::npos) << body.substr(0, 2000);
  out = run(trace + " --rank 0 --from " + std::to_string(t0) + " --to " + std::to_string(t0 + 600 * kS));
  EXPECT_EQ(out.exit_code, 0) << test::describe(out);
  body = slurp();
  EXPECT_NE(body.find("\"step 1\""), std::string::npos) << body.substr(0, 2000);
  EXPECT_EQ(body.find("\"step 2\""), std::string::npos) << body.substr(0, 2000);
  out = run(trace + " --pid 42");
  EXPECT_EQ(out.exit_code, 1) << test::describe(out);
  EXPECT_NE(out.err.find("--rank"), std::string::npos) << out.err;
  // Seven ranks: 70 minutes of rank time in the default span, past the hour a trace holds.
  for (int r = 1; r < 7; ++r) ASSERT_TRUE((*w)->put_process(*rec, rank_on(42 + r, "node-a", "job-p", r)));
  ASSERT_TRUE((*w)->commit());
  ASSERT_TRUE((*w)->drain(30));
  out = run(trace);
  EXPECT_EQ(out.exit_code, 1) << test::describe(out);
  EXPECT_NE(out.err.find("7 ranks x 600 s"), std::string::npos) << out.err;
  out = run(trace + " --last 8m");
  EXPECT_EQ(out.exit_code, 0) << test::describe(out);
  w->reset();
}
}  // namespace
}  // namespace strata

namespace strata {
namespace {

// Sampled launches travel agent -> collector (ingest) -> store -> /api/v1/launch_samples -> the
// remote reader (`store::Store::open_remote`), which reads them as a store file's reader does
// (store_test's Store.LaunchSamplesReadBack): in time order, filtered by node, pid, span and name,
// paged, each stack resolved and listed once, though two agents sent it.
TEST(ServeLaunchSamples, TheRemoteReaderReadsThemBackThroughTheQueryApi) {
  TempDir tmp;
  Collector c(diagnosing(tmp.file("server.db")), free_port());
  constexpr uint64_t kS = 1'000'000'000ull;
  const uint64_t t0 = 1'700'000'000 * kS;
  Frame copy_fn, copy_loop, gemm_fn, main_fn;
  copy_fn.module = "/usr/lib/libcudart.so.13";
  copy_fn.function = "cudaMemcpy";
  copy_loop.module = gemm_fn.module = main_fn.module = "/usr/bin/app";
  copy_loop.function = "copy_loop";
  copy_loop.offset = 0x10;
  gemm_fn.function = "launch_gemm";
  gemm_fn.offset = 0x30;
  main_fn.function = "main";
  main_fn.offset = 0x20;
  // Rows past one page of the remote reader's (10,000 rows a request): the reader asks again.
  constexpr int kManyRows = 10'050;
  for (const std::string node : {"node-a", "node-b"}) {
    auto w = node_writer(c.url(), node, node + "-agent", tmp.file("spool-" + node));
    ASSERT_TRUE(w) << w.error().message;
    auto rec = (*w)->begin_recording({node, "train.py", t0, 99, 10});
    ASSERT_TRUE(rec);
    auto copy = (*w)->intern_stack({copy_fn, copy_loop, main_fn}, store::UnwindMethod::kFramePointer);
    auto gemm = (*w)->intern_stack({gemm_fn, main_fn}, store::UnwindMethod::kFramePointer);
    ASSERT_TRUE(copy && gemm);
    if (node == "node-a") {
      ASSERT_TRUE((*w)->put_launch_samples(*rec, t0, t0 + 10 * kS, {{42, 42, "[cudaMemcpy]", *copy, 5}, {42, 42, "gemm", *gemm, 3}}));
      ASSERT_TRUE((*w)->put_launch_samples(*rec, t0 + 10 * kS, t0 + 20 * kS, {{42, 43, "[cudaMalloc]", *gemm, 2}}));
      std::vector<store::LaunchSample> many;
      for (int i = 0; i < kManyRows; ++i) many.push_back({43, 43, "k" + std::to_string(100000 + i), *gemm, 1});
      ASSERT_TRUE((*w)->put_launch_samples(*rec, t0 + 20 * kS, t0 + 30 * kS, many));
    } else {
      ASSERT_TRUE((*w)->put_launch_samples(*rec, t0 + 10 * kS, t0 + 20 * kS, {{42, 42, "[cudaMemcpy]", *copy, 7}}));
    }
    ASSERT_TRUE((*w)->commit());
    ASSERT_TRUE((*w)->drain(30));
  }

  auto remote = store::Store::open_remote(c.url(), "");
  ASSERT_TRUE(remote) << remote.error().message;
  auto read = [&](store::RowQuery q) {
    auto r = (*remote)->query_launch_samples(q);
    EXPECT_TRUE(r) << r.error().message;
    return r ? *r : store::LaunchSamples{};
  };
  auto counts = [](const store::LaunchSamples& l) {
    std::string o;
    for (const auto& r : l.rows) o += r.node + ":" + r.sample.kernel + "=" + std::to_string(r.sample.count) + " ";
    return o;
  };
  store::RowQuery calls;
  calls.prefix = "[";
  const store::LaunchSamples mem = read(calls);
  EXPECT_EQ(counts(mem), "node-a:[cudaMemcpy]=5 node-a:[cudaMalloc]=2 node-b:[cudaMemcpy]=7 ")
      << "in time order, then node; only the names with the prefix";
  ASSERT_EQ(mem.stacks.size(), 2u) << "each stack the rows name, once (both agents sent the copy stack)";
  for (const auto& r : mem.rows) {
    ASSERT_LT(r.stack_index, mem.stacks.size());
    const Stack& st = mem.stacks[r.stack_index];
    ASSERT_FALSE(st.empty());
    EXPECT_EQ(st.back().function, "main") << "leaf first, root last";
    EXPECT_EQ(st.front().function, r.sample.kernel == "[cudaMemcpy]" ? "cudaMemcpy" : "launch_gemm");
    EXPECT_EQ(r.sample.pid, 42u);
    EXPECT_EQ(r.sample.tid, r.sample.kernel == "[cudaMalloc]" ? 43u : 42u);
  }
  EXPECT_EQ(mem.rows[0].start_ns, t0);
  EXPECT_EQ(mem.rows[0].end_ns, t0 + 10 * kS);

  store::RowQuery one = calls;
  one.node = "node-b";
  one.pid = 42;
  EXPECT_EQ(counts(read(one)), "node-b:[cudaMemcpy]=7 ") << "node and pid: one process";
  store::RowQuery span = calls;
  span.from_ns = t0 + 10 * kS;
  span.to_ns = t0 + 20 * kS;
  EXPECT_EQ(counts(read(span)), "node-a:[cudaMalloc]=2 node-b:[cudaMemcpy]=7 ") << "the windows that overlap the span";
  store::RowQuery page = calls;
  page.offset = 1;
  page.limit = 1;
  EXPECT_EQ(counts(read(page)), "node-a:[cudaMalloc]=2 ") << "offset and limit page through the rows";

  // Past the server's page: every row, in order, and their one stack.
  store::RowQuery all_k;
  all_k.prefix = "k";
  const store::LaunchSamples many = read(all_k);
  ASSERT_EQ(many.rows.size(), static_cast<size_t>(kManyRows));
  for (size_t i = 0; i < many.rows.size(); ++i)
    ASSERT_EQ(many.rows[i].sample.kernel, "k" + std::to_string(100000 + i)) << "row " << i;
  ASSERT_EQ(many.stacks.size(), 1u);
  EXPECT_EQ(many.stacks[0].front().function, "launch_gemm");
  all_k.offset = 10;
  all_k.limit = kManyRows - 20;
  EXPECT_EQ(read(all_k).rows.size(), static_cast<size_t>(kManyRows - 20)) << "a limit past one page";

  // The query API's own answer (JSON) and its refusals.
  const std::string json = c.get("/api/v1/launch_samples?prefix=%5B&node=node-b");
  EXPECT_NE(json.find("\"kernel\":\"[cudaMemcpy]\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"function\":\"cudaMemcpy\""), std::string::npos) << json;
  EXPECT_EQ(c.get("/api/v1/launch_samples?format=xml"), "") << "an unknown format is refused";
  EXPECT_EQ(c.get("/api/v1/launch_samples?limit=100001"), "") << "a page past kMaxPageRows is refused";
}

}  // namespace
}  // namespace strata
