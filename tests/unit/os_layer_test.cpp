// The OS layer's pure parts: histogram percentiles, per-window metrics from snapshots (deltas,
// neighbour weighting, names), cgroup v1/v2 resolution and cpu.stat parsing from canned files,
// /proc parsers, and the off-CPU aggregation into the store.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <sstream>

#include "agent/normalizer.h"
#include "agent/os/cgroup.h"
#include "agent/os/histogram.h"
#include "agent/os/offcpu_aggregator.h"
#include "agent/os/os_metrics.h"
#include "agent/os/proc_readers.h"
#include "report/os_table.h"
#include "store/store.h"
#include "tests/support/run.h"

namespace strata::agent::os {
namespace {

std::map<std::string, double> by_name(const std::vector<store::Metric>& v) {
  std::map<std::string, double> m;
  for (const auto& x : v) m[x.name + (x.label.empty() ? "" : "{" + x.label + "}")] += x.value;
  return m;
}

TEST(OsHistogram, BucketsMatchTheKernelsAndBoundTheirValues) {
  for (uint64_t v : {0ull, 1ull, 3ull, 4ull, 5ull, 7ull, 8ull, 9ull, 100ull, 1000ull, 123456ull, 1ull << 40}) {
    unsigned b = hist_bucket(v);
    EXPECT_LT(v, hist_upper(b)) << v;
    if (b > 0) {
      EXPECT_GE(v, hist_upper(b - 1)) << v;  // buckets are contiguous
    }
  }
  EXPECT_EQ(hist_bucket(4), 4u);
  EXPECT_EQ(hist_upper(4), 5u);
  EXPECT_EQ(hist_bucket(8), 8u);
  EXPECT_EQ(hist_upper(8), 10u);
}

TEST(OsHistogram, PercentilesWithinABucketOfTheTruth) {
  std::vector<uint64_t> buckets(kHistBuckets);
  // 990 waits of 50 us and 10 of 5000 us: p50 ~ 50, p99 ~ 50 (the 990th), max ~ 5000.
  buckets[hist_bucket(50)] = 990;
  buckets[hist_bucket(5000)] = 10;
  HistSummary s = summarize(buckets);
  EXPECT_EQ(s.count, 1000u);
  EXPECT_GE(s.p50, 50);
  EXPECT_LE(s.p50, 50 * 1.25);
  EXPECT_LE(s.p99, 50 * 1.25);
  EXPECT_GE(s.max, 5000);
  EXPECT_LE(s.max, 5000 * 1.25);
  buckets[hist_bucket(5000)] = 100;  // now over 1%: p99 is the slow group
  EXPECT_GE(summarize(buckets).p99, 5000);
  EXPECT_EQ(summarize(std::vector<uint64_t>(kHistBuckets)).count, 0u);
}

TEST(OsMetrics, DeltasBetweenSnapshots) {
  ProcSnapshot before, now;
  before.sched = strata_sched_stats{};
  now.sched = strata_sched_stats{};
  before.sched->cpu_ns[0] = 1'000'000;
  now.sched->cpu_ns[0] = 3'000'000;
  now.sched->cpu_ns[1] = 2'000'000;
  before.sched->involuntary = 5;
  now.sched->involuntary = 12;
  now.sched->migrations = 3;
  now.sched->offcpu_ns[STRATA_OFFCPU_IO] = 7'000'000;
  now.sched->runq_count = 4;
  now.sched->runq_ns = 400'000;
  now.sched->runq_hist[hist_bucket(100)] = 4;
  before.faults = Faults{10, 1};
  now.faults = Faults{25, 3};
  before.cpu_stat = CpuStat{100, 10, 5000, true};
  now.cpu_stat = CpuStat{150, 40, 65000, true};
  before.cgroup = now.cgroup = "/strata-x";
  MetricInputs in;
  auto m = by_name(process_metrics(42, before, now, in));
  EXPECT_DOUBLE_EQ(m["os.cpu_time_us"], 4000);
  EXPECT_DOUBLE_EQ(m["os.involuntary_switches"], 7);
  EXPECT_DOUBLE_EQ(m["os.migrations"], 3);
  EXPECT_DOUBLE_EQ(m["os.blocked_us{io}"], 7000);
  EXPECT_DOUBLE_EQ(m["os.blocked_us{sleep}"], 0);
  EXPECT_DOUBLE_EQ(m["os.runq_latency_us.count"], 4);
  EXPECT_DOUBLE_EQ(m["os.runq_latency_us.mean"], 100);
  EXPECT_GE(m["os.runq_latency_us.p99"], 100);
  EXPECT_DOUBLE_EQ(m["os.runq_wait_us"], 400);
  EXPECT_DOUBLE_EQ(m["os.minor_faults"], 15);
  EXPECT_DOUBLE_EQ(m["os.major_faults"], 2);
  EXPECT_DOUBLE_EQ(m["os.cgroup_nr_throttled{/strata-x}"], 30);
  EXPECT_DOUBLE_EQ(m["os.cgroup_throttled_us{/strata-x}"], 60000);
  EXPECT_DOUBLE_EQ(m["os.cgroup_nr_periods{/strata-x}"], 50);
}

TEST(OsMetrics, CounterResetsNeverGoNegative) {
  ProcSnapshot before, now;
  before.faults = Faults{100, 10};
  now.faults = Faults{5, 1};
  auto m = by_name(process_metrics(1, before, now, {}));
  EXPECT_DOUBLE_EQ(m["os.minor_faults"], 0);
  EXPECT_DOUBLE_EQ(m["os.major_faults"], 0);
}

TEST(OsMetrics, NeighboursAreWeightedByTheProcessesShareOfEachCpu) {
  ProcSnapshot before, now;
  now.sched = strata_sched_stats{};
  now.sched->cpu_ns[1] = 9'000'000;  // 90% of its time on CPU 1
  now.sched->cpu_ns[0] = 1'000'000;  // 10% on CPU 0
  MetricInputs in;
  in.neighbours = {{1, 500, "hog", 4'000'000}, {0, 600, "cron", 2'000'000}, {3, 700, "far", 9'000'000},
                   {1, 42, "self", 1'000'000}};
  auto m = by_name(process_metrics(42, before, now, in));
  EXPECT_DOUBLE_EQ(m["os.neighbour_run_us{hog:500}"], 3600);
  EXPECT_DOUBLE_EQ(m["os.neighbour_run_us{cron:600}"], 200);
  EXPECT_EQ(m.count("os.neighbour_run_us{far:700}"), 0u) << "a CPU it never ran on";
  EXPECT_EQ(m.count("os.neighbour_run_us{self:42}"), 0u) << "itself";
}

// Where a process ran: the CPUs with a twentieth of its run time or more, four at most, the rest as
// "other"; the parts add up to os.cpu_time_us.
TEST(OsMetrics, PlacementNamesTheCpusThatHeldTheRunTime) {
  ProcSnapshot before, now;
  before.sched = strata_sched_stats{};
  now.sched = strata_sched_stats{};
  before.sched->cpu_ns[3] = 5'000'000;
  now.sched->cpu_ns[3] = 95'000'000;  // 90 ms of this window on CPU 3
  now.sched->cpu_ns[0] = 6'000'000;
  now.sched->cpu_ns[1] = 4'000'000;   // 4%: a visit
  auto m = by_name(process_metrics(42, before, now, {}));
  EXPECT_DOUBLE_EQ(m["os.cpu_time_us"], 100'000);
  EXPECT_DOUBLE_EQ(m["os.cpu_time_by_cpu_us{3}"], 90'000);
  EXPECT_DOUBLE_EQ(m["os.cpu_time_by_cpu_us{0}"], 6'000);
  EXPECT_DOUBLE_EQ(m["os.cpu_time_by_cpu_us{other}"], 4'000);
  EXPECT_EQ(m.count("os.cpu_time_by_cpu_us{1}"), 0u);
  // Spread over ten CPUs alike: the first four by number, the rest "other".
  ProcSnapshot spread;
  spread.sched = strata_sched_stats{};
  for (unsigned c = 0; c < 10; ++c) spread.sched->cpu_ns[c] = 1'000'000;
  auto s = process_metrics(7, ProcSnapshot{}, spread, {});
  std::vector<std::string> labels;
  for (const auto& x : s)
    if (x.name == "os.cpu_time_by_cpu_us") labels.push_back(x.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"0", "1", "2", "3", "other"}));
  EXPECT_DOUBLE_EQ(by_name(s)["os.cpu_time_by_cpu_us{other}"], 6'000);
  // No run time: no rows.
  EXPECT_EQ(by_name(process_metrics(8, ProcSnapshot{}, ProcSnapshot{}, {})).count("os.cpu_time_by_cpu_us{other}"), 0u);
}

TEST(OsMetrics, IrqLabelsNameTheVector) {
  ProcSnapshot before, now;
  now.irq_ns[{STRATA_IRQ_SOFT, 3}] = 2'000'000;
  now.irq_ns[{STRATA_IRQ_HARD, 24}] = 500'000;
  before.irq_ns[{STRATA_IRQ_HARD, 24}] = 100'000;
  std::map<unsigned, std::string> names = {{24, "virtio0-input.0"}};
  MetricInputs in;
  in.irq_names = &names;
  auto m = by_name(process_metrics(1, before, now, in));
  EXPECT_DOUBLE_EQ(m["os.softirq_time_us{NET_RX}"], 2000);
  EXPECT_DOUBLE_EQ(m["os.irq_time_us{24:virtio0-input.0}"], 400);
}

TEST(OsCgroup, V1CpuHierarchyWins) {
  const char* mountinfo =
      "30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
      "31 30 0:27 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw\n"
      "33 30 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:7 - cgroup cgroup rw,cpu,cpuacct\n"
      "34 30 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
  auto mounts = parse_cgroup_mounts(mountinfo);
  ASSERT_EQ(mounts.size(), 3u);
  auto cg = parse_proc_cgroup("12:memory:/job\n4:cpu,cpuacct:/job/rank0\n0::/user.slice\n");
  EXPECT_EQ(cg.v1_cpu_path, "/job/rank0");
  EXPECT_EQ(cg.v2_path, "/user.slice");
  EXPECT_EQ(cpu_stat_path(cg, mounts), "/sys/fs/cgroup/cpu,cpuacct/job/rank0/cpu.stat");
}

TEST(OsCgroup, V2WhenNoV1CpuController) {
  auto mounts = parse_cgroup_mounts("29 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
  auto cg = parse_proc_cgroup("0::/system.slice/train.service\n");
  EXPECT_EQ(cpu_stat_path(cg, mounts), "/sys/fs/cgroup/system.slice/train.service/cpu.stat");
  auto root = parse_proc_cgroup("0::/\n");
  EXPECT_EQ(cpu_stat_path(root, mounts), "/sys/fs/cgroup/cpu.stat");
  // A mount of a subtree (inside a container): paths are relative to its root.
  auto sub = parse_cgroup_mounts("29 23 0:26 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  EXPECT_EQ(cpu_stat_path(parse_proc_cgroup("0::/kubepods/pod1/c1\n"), sub), "/sys/fs/cgroup/c1/cpu.stat");
  EXPECT_EQ(cpu_stat_path(parse_proc_cgroup("0::/\n"), {}), "");
}

TEST(OsCgroup, CpuStatV1NanosecondsV2Microseconds) {
  auto v1 = parse_cpu_stat("nr_periods 20\nnr_throttled 7\nthrottled_time 3500000\nnr_bursts 0\nburst_time 0\n");
  EXPECT_TRUE(v1.has_throttling);
  EXPECT_EQ(v1.nr_periods, 20u);
  EXPECT_EQ(v1.nr_throttled, 7u);
  EXPECT_EQ(v1.throttled_us, 3500u);
  auto v2 = parse_cpu_stat("usage_usec 100\nuser_usec 60\nsystem_usec 40\nnr_periods 9\nnr_throttled 2\nthrottled_usec 812\n");
  EXPECT_EQ(v2.throttled_us, 812u);
  EXPECT_EQ(v2.nr_throttled, 2u);
  // v2 without the cpu controller: usage only, no throttling to report.
  EXPECT_FALSE(parse_cpu_stat("usage_usec 100\nuser_usec 60\nsystem_usec 40\n").has_throttling);
}

TEST(OsProc, FaultsFromStatWithAWeirdCommand) {
  auto f = parse_proc_stat_faults(
      "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 1500 0 27 0 10 5 0 0 20 0 3 0 100 1000000 200 "
      "18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->minor, 1500u);
  EXPECT_EQ(f->major, 27u);
  EXPECT_FALSE(parse_proc_stat_faults("garbage"));
}

// A TCP connection over loopback inside this process: both of its sides are read, their endpoints
// mirror each other, and the sender's acknowledged bytes and RTT are there.
TEST(OsProc, TcpLinksOfAProcessMirrorEachOtherWithTheirBytes) {
  int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(ls, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(ls, 1), 0);
  socklen_t alen = sizeof(a);
  ASSERT_EQ(::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &alen), 0);
  int c = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(::connect(c, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  int srv = ::accept(ls, nullptr, nullptr);
  ASSERT_GE(srv, 0);
  std::vector<char> buf(100000, 'x');
  size_t sent = 0, got = 0;
  while (sent < buf.size() || got < buf.size()) {
    if (sent < buf.size()) {
      ssize_t n = ::send(c, buf.data() + sent, buf.size() - sent, MSG_DONTWAIT);
      if (n > 0) sent += static_cast<size_t>(n);
    }
    ssize_t n = ::recv(srv, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n > 0) got += static_cast<size_t>(n);
  }
  auto links = read_tcp_links(static_cast<uint32_t>(::getpid()), socket_fds(static_cast<uint32_t>(::getpid())));
  const TcpLink* client = nullptr;
  const TcpLink* server = nullptr;
  std::string port = ":" + std::to_string(ntohs(a.sin_port));
  for (const auto& l : links) {
    if (l.remote.size() > port.size() && l.remote.ends_with(port)) client = &l;
    if (l.local.size() > port.size() && l.local.ends_with(port)) server = &l;
  }
  ASSERT_NE(client, nullptr);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(client->local, server->remote);
  EXPECT_EQ(client->remote, server->local);
  EXPECT_EQ(client->local.rfind("127.0.0.1:", 0), 0u) << client->local;
  EXPECT_GE(client->bytes_acked, buf.size());
  EXPECT_GE(server->bytes_received, buf.size());
  EXPECT_GT(client->srtt_us, 0u);
  EXPECT_EQ(links.size(), 2u);
  ::close(c);
  ::close(srv);
  ::close(ls);
}

TEST(OsMetrics, TcpLinksThatMovedDataGetTheirBytesAndTheSendersRtt) {
  ProcSnapshot before, now;
  before.tcp = {TcpLink{"10.0.0.1:5000", "10.0.0.2:4000", 90, 1000, 10},
                TcpLink{"10.0.0.1:5001", "10.0.0.3:4000", 50, 7, 7}};
  before.tcp[0].busy_us = 4000;
  now.tcp = {TcpLink{"10.0.0.1:5000", "10.0.0.2:4000", 19000, 51000, 10, 14000},
             TcpLink{"10.0.0.1:5001", "10.0.0.3:4000", 60, 7, 7},       // idle: left out
             TcpLink{"10.0.0.1:4000", "10.0.0.4:6000", 40, 0, 3000}};  // new: receives only
  auto m = by_name(process_metrics(7, before, now, MetricInputs{}));
  EXPECT_EQ(m["net.tcp_sent_bytes{10.0.0.1:5000>10.0.0.2:4000}"], 50000);
  EXPECT_EQ(m["net.tcp_srtt_us{10.0.0.1:5000>10.0.0.2:4000}"], 19000);
  EXPECT_EQ(m["net.tcp_busy_us{10.0.0.1:5000>10.0.0.2:4000}"], 10000);  // the window's busy time, not the total
  EXPECT_EQ(m.count("net.tcp_busy_us{10.0.0.1:4000>10.0.0.4:6000}"), 0u);
  EXPECT_EQ(m.count("net.tcp_received_bytes{10.0.0.1:5000>10.0.0.2:4000}"), 0u);
  EXPECT_EQ(m["net.tcp_received_bytes{10.0.0.1:4000>10.0.0.4:6000}"], 3000);
  EXPECT_EQ(m.count("net.tcp_srtt_us{10.0.0.1:4000>10.0.0.4:6000}"), 0u);  // sent nothing: no RTT of its own
  for (const auto& [k, v] : m) EXPECT_EQ(k.find("10.0.0.3"), std::string::npos) << k;
}

TEST(OsProc, IrqNamesAndSoftirqVectors) {
  auto names = parse_irq_names(
      "           CPU0       CPU1\n"
      "  0:         44          0   IO-APIC   2-edge      timer\n"
      " 24:       1000        200  PCI-MSIX-0000:00:03.0   0-edge      virtio0-input.0\n"
      "NMI:          0          0   Non-maskable interrupts\n");
  EXPECT_EQ(names[0], "timer");
  EXPECT_EQ(names[24], "virtio0-input.0");
  EXPECT_EQ(names.size(), 2u);
  EXPECT_EQ(softirq_name(3), "NET_RX");
  EXPECT_EQ(softirq_name(1), "TIMER");
  EXPECT_EQ(softirq_name(42), "VEC42");
}

TEST(OffCpuAggregation, SameThreadAndStackAddUpWithTheReasonAsLeaf) {
  test::TempDir dir;
  auto st = store::Store::open_sqlite(dir.file("s.db"), store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  auto& store = **st;
  auto rec = store.begin_recording({});
  ASSERT_TRUE(rec);
  Normalizer norm;
  OffCpuAggregator agg(norm);
  OffCpuEvent e;
  e.sample.pid = 999999;  // no such process: frames stay unresolved, which is fine here
  e.sample.tid = 1000000;
  e.sample.comm = "worker";
  e.sample.kstack = {0xffffffff81000010ull, 0xffffffff81000020ull};
  e.reason = STRATA_OFFCPU_SLEEP;
  e.blocked_ns = 20'000'000;
  agg.add(e);
  agg.add(e);
  e.reason = STRATA_OFFCPU_IO;  // same frames, another reason: another stack
  e.blocked_ns = 5'000'400;
  agg.add(e);
  ASSERT_TRUE(store.begin());
  ASSERT_TRUE(agg.flush(store, *rec, 1, 2));
  ASSERT_TRUE(store.commit());
  EXPECT_EQ(agg.stored_us(), 45000u);

  store::ProfileFilter f;
  f.kind = store::CountKind::kOffCpu;
  auto p = store.load_profile(f);
  ASSERT_TRUE(p) << p.error().message;
  std::map<std::string, uint64_t> by_leaf;
  for (const auto& s : p->samples) {
    ASSERT_LT(s.stack_index, p->stacks.size());
    const auto& stack = p->stacks[s.stack_index];
    ASSERT_EQ(stack.size(), 3u);
    EXPECT_EQ(stack[0].module, "[offcpu]");
    by_leaf[stack[0].function] += s.count;
  }
  EXPECT_EQ(by_leaf["[sleep]"], 40000u);
  EXPECT_EQ(by_leaf["[io]"], 5000u);
  EXPECT_EQ(reason_frame(STRATA_OFFCPU_PREEMPTED).function, "[preempted]");
}

}  // namespace
}  // namespace strata::agent::os

namespace strata::report {
namespace {

TEST(OsTable, SumsWindowsAndReadsPercentilesFromHistograms) {
  std::vector<OsMetricRow> rows = {
      {7, "os.cpu_time_us", "", 1'000'000}, {7, "os.cpu_time_us", "", 500'000},
      {7, "os.cpu_time_by_cpu_us", "3", 1'000'000}, {7, "os.cpu_time_by_cpu_us", "3", 400'000},
      {7, "os.cpu_time_by_cpu_us", "other", 100'000},
      {7, "os.runq_wait_us", "", 2000},     {7, "os.runq_latency_us.count", "", 100},
      {7, "os.runq_latency_us.hist", "le=10", 98}, {7, "os.runq_latency_us.hist", "le=4000", 2},
      {7, "os.involuntary_switches", "", 12}, {7, "os.neighbour_run_us", "strata-hog:4411", 900'000},
      {7, "os.neighbour_run_us", "kworker/1:1:33", 1500}, {7, "os.blocked_us", "io", 30'000},
      {7, "os.cgroup_nr_periods", "/job", 50}, {7, "os.cgroup_nr_throttled", "/job", 20},
      {7, "os.cgroup_throttled_us", "/job", 250'000}, {8, "gpu.clock_mhz", "", 1},
  };
  std::ostringstream out;
  write_os_table({{7, 3, "train"}, {8, 4, "other"}}, rows, out);
  std::string s = out.str();
  EXPECT_NE(s.find("rank 3  pid 7  train"), std::string::npos) << s;
  EXPECT_NE(s.find("cpu 1.50 s (CPU 3 1.40 s, other CPUs 100.0 ms)"), std::string::npos) << s;
  EXPECT_NE(s.find("p50 10 us, p99 4.0 ms"), std::string::npos) << s;
  EXPECT_NE(s.find("12 involuntary"), std::string::npos) << s;
  EXPECT_NE(s.find("neighbours: strata-hog:4411 900.0 ms, kworker/1:1:33 1.5 ms"), std::string::npos) << s;
  EXPECT_NE(s.find("blocked: io 30.0 ms"), std::string::npos) << s;
  EXPECT_NE(s.find("cgroup /job: throttled 20 of 50 periods, 250.0 ms"), std::string::npos) << s;
  EXPECT_EQ(s.find("pid 8"), std::string::npos) << "no os. rows for pid 8";
  std::ostringstream none;
  write_os_table({{8, 4, "other"}}, {{8, "gpu.clock_mhz", "", 1}}, none);
  EXPECT_EQ(none.str(), "");
}

}  // namespace
}  // namespace strata::report
