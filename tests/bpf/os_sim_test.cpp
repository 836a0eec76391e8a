// The OS layer against the testbed's OS faults (issue 6, items 1 and 3; root + BPF): `strata record
// --layers os` on strata-sim with each fault of the OS kind, and the matching metric of the faulty
// rank must stand out against its peers': above `ratio` times the largest peer's value (ratios, never
// absolute times: the machine is shared and its load moves every number). A healthy run must have no
// rank standing out by the same rule.
//
//   cpu-contention  os.runq_wait_us, and the hogs are the faulty rank's largest neighbours
//   cpu-throttling  os.cgroup_throttled_us (os.runq_wait_us grows too: reported)
//   memory-reclaim  os.direct_reclaim_count / _us (label memcg: the cgroup limit)
//   io-stall        os.blocked_us{io} and os.bio_count (its reads of the throttled device)
//   network-slow    net.tcp_srtt_us of the connections through the rank's link (its own netns, tbf),
//                   and each of its connections' other side recorded on the peer rank
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "store/store.h"
#include "tests/support/run.h"

namespace strata::test {
namespace {

std::string sim() { return env_or("STRATA_BIN", build_dir() + "/bin") + "/strata-sim"; }

struct ProcMetrics {
  std::map<std::string, double> sum;                               // name -> sum over labels, windows
  std::map<std::string, std::map<std::string, double>> by_label;  // name -> label -> sum over windows
  double get(const std::string& name, const std::string& label = "") const {
    if (label.empty()) {
      auto it = sum.find(name);
      return it == sum.end() ? 0 : it->second;
    }
    auto it = by_label.find(name);
    if (it == by_label.end()) return 0;
    auto l = it->second.find(label);
    return l == it->second.end() ? 0 : l->second;
  }
};

struct SimRecording {
  std::map<int, uint32_t> pid_of_rank;
  std::map<int, ProcMetrics> rank_metrics;
  std::set<uint32_t> hog_pids;
  std::string log;  // what the run printed, for failure messages
};

std::string describe_rank(const SimRecording& s, int rank) {
  std::ostringstream o;
  o << "rank " << rank << " (pid " << s.pid_of_rank.at(rank) << "):";
  for (const auto& [k, v] : s.rank_metrics.at(rank).sum) {
    if (k.find(".hist") == std::string::npos) o << " " << k << "=" << v;
  }
  return o.str();
}

std::string describe_all(const SimRecording& s) {
  std::string out;
  for (const auto& [rank, m] : s.rank_metrics) out += describe_rank(s, rank) + "\n";
  return out + s.log;
}

// Records a sim run with `fault` under the OS layer and sums each rank's metrics over the run.
SimRecording record_sim(const TempDir& dir, const std::string& fault, int steps) {
  SimRecording s;
  // The stand-in GPUs' state in a directory of its own: another sim on the machine resets the shared one.
  auto rec = run("mkdir -p " + dir.file("testbed") + " && STRATA_TESTBED_DIR=" + dir.file("testbed") + " " +
                 strata_bin() + " record --layers os --window 1 -o " + dir.file("os.db") + " -- " + sim() +
                 " run --ranks 4 --steps " + std::to_string(steps) + " --fault " + fault + " --truth " +
                 dir.file("truth.json"));
  s.log = rec.out + rec.err;
  EXPECT_EQ(rec.exit_code, 0) << describe(rec);
  if (rec.exit_code != 0) return s;
  auto t = run("python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))\n"
               "for p in t[\"per_rank\"]: print(\"rank\", p[\"rank\"], p[\"pid\"])\n"
               "for h in t[\"fault\"].get(\"details\", {}).get(\"hog_pids\", \"\").split(\",\"):\n"
               "  print(\"hog\", h) if h else None' " +
               dir.file("truth.json"));
  EXPECT_EQ(t.exit_code, 0) << describe(t);
  std::istringstream in(t.out);
  std::string kind;
  while (in >> kind) {
    if (kind == "rank") {
      int rank = 0;
      uint32_t pid = 0;
      in >> rank >> pid;
      s.pid_of_rank[rank] = pid;
    } else {
      uint32_t pid = 0;
      in >> pid;
      s.hog_pids.insert(pid);
    }
  }
  std::map<uint32_t, int> rank_of_pid;
  for (const auto& [rank, pid] : s.pid_of_rank) {
    rank_of_pid[pid] = rank;
    s.rank_metrics[rank];  // every rank present, even one with no metric
  }
  auto st = store::Store::open_sqlite(dir.file("os.db"), store::Store::Mode::kReadOnly);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  if (!st) return s;
  auto rows = (*st)->metrics("");
  EXPECT_TRUE(rows);
  if (!rows) return s;
  for (const auto& r : *rows) {
    auto it = rank_of_pid.find(r.metric.pid);
    if (it == rank_of_pid.end()) continue;
    if (r.metric.name.rfind("os.", 0) != 0 && r.metric.name.rfind("net.", 0) != 0) continue;
    auto& m = s.rank_metrics[it->second];
    m.sum[r.metric.name] += r.metric.value;
    m.by_label[r.metric.name][r.metric.label] += r.metric.value;
  }
  return s;
}

// The metrics the OS faults move, with the ratio and the floor that make a rank stand out: its value
// above `ratio` times every peer's and above `slack` (a floor for metrics that are zero on healthy
// ranks, so one stray event is no signal). A fault test asserts its metric by its rule; the healthy
// test asserts that no rank meets any rule.
struct Rule {
  const char* name;
  const char* label;  // "": the sum over labels
  double ratio;
  double slack;
  std::string what() const { return std::string(name) + (*label ? std::string("{") + label + "}" : ""); }
};
// Run-queue wait, the total of the rank's threads: two hogs of higher priority on the faulty rank's
// CPU make it several times its peers' (3-10x here), but the machine's other load (2 CPUs shared with
// builds and tests) adds to every rank's, down to ~2.3x at a load average of 19: hence 1.5x. The hogs
// as its largest neighbours are the sharper signal (checked in the test).
const Rule kRunqWait{"os.runq_wait_us", "", 1.5, 0};
const Rule kThrottled{"os.cgroup_throttled_us", "", 10, 50'000};
const Rule kReclaimCount{"os.direct_reclaim_count", "memcg", 10, 20};
const Rule kReclaimUs{"os.direct_reclaim_us", "memcg", 10, 1'000};
const Rule kIoBlocked{"os.blocked_us", "io", 10, 50'000};
const Rule kBioCount{"os.bio_count", "", 10, 50};

double value(const SimRecording& s, int rank, const Rule& r) {
  const ProcMetrics& m = s.rank_metrics.at(rank);
  return m.get(r.name, r.label);
}

// The largest value among the ranks other than `rank`.
double max_of_peers(const SimRecording& s, int rank, const Rule& r) {
  double most = 0;
  for (const auto& [other, m] : s.rank_metrics) {
    if (other != rank) most = std::max(most, value(s, other, r));
  }
  return most;
}

bool stands_out(const SimRecording& s, int rank, const Rule& r) {
  return value(s, rank, r) > r.ratio * max_of_peers(s, rank, r) + r.slack;
}

void expect(const SimRecording& s, int rank, const Rule& r) {
  double v = value(s, rank, r), peers = max_of_peers(s, rank, r);
  EXPECT_TRUE(stands_out(s, rank, r)) << r.what() << ": rank " << rank << " " << v << " vs peers' max " << peers
                                      << " (want > " << r.ratio << "x + " << r.slack << ")\n"
                                      << describe_all(s);
  std::printf("    %s: rank %d %.0f, peers' max %.0f (%.1fx)\n", r.what().c_str(), rank, v, peers,
              peers > 0 ? v / peers : 0.0);
}

void report(const SimRecording& s, int rank, const char* name) {
  Rule r{name, "", 0, 0};
  std::printf("    %s (reported): rank %d %.0f, peers' max %.0f\n", name, rank, value(s, rank, r),
              max_of_peers(s, rank, r));
}

TEST(OsSimFaults, CpuContentionRaisesRunQueueWaitAndNamesTheHogs) {
  TempDir dir;
  auto s = record_sim(dir, "cpu-contention:rank=2,start_step=1", 12);
  ASSERT_EQ(s.rank_metrics.size(), 4u) << s.log;
  ASSERT_EQ(s.hog_pids.size(), 2u) << s.log;
  expect(s, 2, kRunqWait);
  // The neighbours: the two hogs ran most on the faulty rank's CPU, and hardly on its peers'.
  const auto& culprit = s.rank_metrics.at(2);
  ASSERT_TRUE(culprit.by_label.count("os.neighbour_run_us")) << describe_all(s);
  std::vector<std::pair<double, std::string>> nb;
  for (const auto& [label, us] : culprit.by_label.at("os.neighbour_run_us")) nb.push_back({us, label});
  std::sort(nb.rbegin(), nb.rend());
  ASSERT_GE(nb.size(), 2u) << describe_all(s);
  double hogs_us = 0;
  for (size_t i = 0; i < 2; ++i) {
    const std::string& label = nb[i].second;
    EXPECT_EQ(label.rfind("strata-hog:", 0), 0u) << "neighbour #" << i << ": " << label << "\n" << describe_all(s);
    uint32_t pid = static_cast<uint32_t>(std::stoul(label.substr(label.find(':') + 1)));
    EXPECT_TRUE(s.hog_pids.count(pid)) << label << " is not one of the sim's hogs";
    hogs_us += nb[i].first;
  }
  EXPECT_GT(hogs_us, 3 * culprit.get("os.cpu_time_us")) << "the hogs had most of the rank's CPU\n" << describe_all(s);
  for (int peer : {0, 1, 3}) {
    double peer_hog = 0;
    for (uint32_t h : s.hog_pids) peer_hog += s.rank_metrics.at(peer).get("os.neighbour_run_us", "strata-hog:" + std::to_string(h));
    EXPECT_LT(peer_hog * 10, hogs_us) << "rank " << peer << " shares no CPU with the hogs\n" << describe_all(s);
  }
  std::printf("    hogs on rank 2's CPU: %.0f us (rank 2 ran %.0f us)\n", hogs_us, culprit.get("os.cpu_time_us"));
}

TEST(OsSimFaults, CpuThrottlingShowsThrottledTimeAndRunQueueWait) {
  TempDir dir;
  auto s = record_sim(dir, "cpu-throttling:rank=0,start_step=1", 12);
  ASSERT_EQ(s.rank_metrics.size(), 4u) << s.log;
  expect(s, 0, kThrottled);
  // Its run-queue wait grows too, but less reliably (about 2-3x here): reported, not asserted.
  report(s, 0, "os.runq_wait_us");
  EXPECT_GT(s.rank_metrics.at(0).get("os.cgroup_nr_throttled"), 5) << describe_all(s);
}

TEST(OsSimFaults, MemoryReclaimShowsDirectReclaimInTheRanksCgroup) {
  TempDir dir;
  auto s = record_sim(dir, "memory-reclaim:rank=3,start_step=1", 12);
  ASSERT_EQ(s.rank_metrics.size(), 4u) << s.log;
  expect(s, 3, kReclaimCount);
  expect(s, 3, kReclaimUs);
}

TEST(OsSimFaults, IoStallShowsBlockedReadsOfTheRank) {
  TempDir dir;
  auto s = record_sim(dir, "io-stall:rank=1,start_step=1", 12);
  ASSERT_EQ(s.rank_metrics.size(), 4u) << s.log;
  expect(s, 1, kIoBlocked);
  expect(s, 1, kBioCount);
  // Its reads wait on the throttled device: the latency of its requests is the device's, not 0.
  EXPECT_GT(s.rank_metrics.at(1).get("os.bio_latency_us.max"), 0) << describe_all(s);
}

// The rank behind a slow link (its own network namespace, tbf both ways): the connections through
// it (rank 1 -> 2 and rank 2 -> 3 in the ring) have an RTT far above the others', and each of the
// rank's connections is recorded from the other side on its peer ("A>B" on one, "B>A" on the other),
// which is how the diagnosis tells the link's end.
TEST(OsSimFaults, NetworkSlowShowsTheSlowConnectionsFromBothSides) {
  TempDir dir;
  auto s = record_sim(dir, "network-slow:rank=2,start_step=3", 24);
  ASSERT_EQ(s.rank_metrics.size(), 4u) << s.log;
  auto max_rtt = [&](int rank) {
    double worst = 0;
    const auto& m = s.rank_metrics.at(rank);
    if (!m.by_label.count("net.tcp_srtt_us")) return worst;
    for (const auto& [label, v] : m.by_label.at("net.tcp_srtt_us")) worst = std::max(worst, v);
    return worst;
  };
  double fast = std::max(max_rtt(0), max_rtt(3));
  std::printf("    worst summed RTT: rank 0 %.0f, rank 1 %.0f, rank 2 %.0f, rank 3 %.0f us\n", max_rtt(0), max_rtt(1),
              max_rtt(2), max_rtt(3));
  EXPECT_GT(max_rtt(2), 4 * fast + 1000) << describe_all(s);  // it sends to rank 3 over its link
  EXPECT_GT(max_rtt(1), 4 * fast + 1000) << describe_all(s);  // rank 1 sends to it over its link
  // Both sides: every connection of rank 2 that moved data is on another rank reversed.
  std::set<std::string> others;
  for (int rank : {0, 1, 3}) {
    for (const auto& [name, labels] : s.rank_metrics.at(rank).by_label) {
      if (name.rfind("net.tcp_", 0) == 0)
        for (const auto& [label, v] : labels) others.insert(label);
    }
  }
  int paired = 0;
  for (const char* name : {"net.tcp_sent_bytes", "net.tcp_received_bytes"}) {
    if (!s.rank_metrics.at(2).by_label.count(name)) continue;
    for (const auto& [label, v] : s.rank_metrics.at(2).by_label.at(name)) {
      auto gt = label.find('>');
      ASSERT_NE(gt, std::string::npos) << label;
      std::string reversed = label.substr(gt + 1) + ">" + label.substr(0, gt);
      EXPECT_TRUE(others.count(reversed)) << label << " has no other side\n" << describe_all(s);
      ++paired;
    }
  }
  EXPECT_GE(paired, 2) << describe_all(s);  // at least its send and its receive connection
}

// Item 3 on the sim: with no fault no rank stands out by any of the rules above.
TEST(OsSimFaults, HealthyRunHasNoRankStandingOut) {
  TempDir dir;
  auto s = record_sim(dir, "none", 12);
  ASSERT_EQ(s.rank_metrics.size(), 4u) << s.log;
  for (const Rule& r : {kRunqWait, kThrottled, kReclaimCount, kReclaimUs, kIoBlocked, kBioCount}) {
    double worst = 0;  // the largest rank / peers' max ratio, for the log
    for (int rank = 0; rank < 4; ++rank) {
      double v = value(s, rank, r), peers = max_of_peers(s, rank, r);
      if (peers > 0) worst = std::max(worst, v / peers);
      EXPECT_FALSE(stands_out(s, rank, r)) << r.what() << ": rank " << rank << " " << v << " vs peers' max " << peers
                                           << "\n" << describe_all(s);
    }
    std::printf("    %s: largest rank / peers' max %.2f (stands out above %.1fx)\n", r.what().c_str(), worst, r.ratio);
  }
  // And no hog anywhere: the neighbour lists name no strata-hog.
  for (const auto& [rank, m] : s.rank_metrics) {
    if (!m.by_label.count("os.neighbour_run_us")) continue;
    for (const auto& [label, us] : m.by_label.at("os.neighbour_run_us"))
      EXPECT_NE(label.rfind("strata-hog:", 0), 0u) << "rank " << rank << ": " << label;
  }
}

}  // namespace
}  // namespace strata::test
