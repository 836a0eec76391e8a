// The OS layer against the real kernel (root): off-CPU stacks and blocked time of threads that block
// in known places, and OS phenomena created here on purpose — a CPU hog sharing a worker's CPU, a
// cgroup CPU quota — each compared with a control worker that runs the same program at the same time
// (ratios, not absolute numbers). A healthy pair of identical workers must show no metric standing
// out. The testbed's four OS faults (memory-reclaim and io-stall too) against a rank's peers, and a
// healthy sim run: os_sim_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>

#include "store/store.h"
#include "tests/support/run.h"

namespace strata::test {
namespace {

struct ProcMetrics {
  std::string command;
  std::map<std::string, double> sum;                               // name -> sum over labels, windows
  std::map<std::string, std::map<std::string, double>> by_label;  // name -> label -> sum
};

// The metrics of every recorded process, summed over windows.
std::map<uint32_t, ProcMetrics> load_metrics(const std::string& db) {
  std::map<uint32_t, ProcMetrics> out;
  auto st = store::Store::open_sqlite(db, store::Store::Mode::kReadOnly);
  EXPECT_TRUE(st) << (st ? "" : st.error().message);
  if (!st) return out;
  auto procs = (*st)->processes();
  if (procs)
    for (const auto& p : *procs) out[p.pid].command = p.command;
  auto rows = (*st)->metrics("os.");
  EXPECT_TRUE(rows);
  if (!rows) return out;
  for (const auto& r : *rows) {
    auto& m = out[r.metric.pid];
    m.sum[r.metric.name] += r.metric.value;
    m.by_label[r.metric.name][r.metric.label] += r.metric.value;
  }
  return out;
}

// The one process whose command line ends with `tag`.
const ProcMetrics* find(const std::map<uint32_t, ProcMetrics>& all, const std::string& tag, uint32_t* pid = nullptr) {
  const ProcMetrics* found = nullptr;
  for (const auto& [p, m] : all) {
    if (m.command.size() >= tag.size() && m.command.ends_with(tag) && m.command.find("os_worker") != std::string::npos) {
      found = &m;
      if (pid) *pid = p;
    }
  }
  return found;
}

std::string describe_metrics(const ProcMetrics& m) {
  std::ostringstream s;
  s << m.command << ":";
  for (const auto& [k, v] : m.sum) s << " " << k << "=" << v;
  return s.str();
}

std::string worker() { return testprog("os_worker"); }

// --budget 0: these tests check what each layer records; with 1 s windows the agent's per-window
// work alone is over the 0.2% default budget, which would turn CFI unwinding off after the first
// window (the budget's own behaviour is tested in cost_budget_test).
std::string record(const TempDir& dir, const std::string& layers, const std::string& cmd) {
  return strata_bin() + " record --budget 0 --layers " + layers + " --window 1 -o " + dir.file("rec.db") + " -- " + cmd;
}

uint64_t number_after(const std::string& text, const std::string& key) {
  std::smatch m;
  if (std::regex_search(text, m, std::regex(key + "\\s*([0-9]+)"))) return std::stoull(m[1]);
  return 0;
}

struct Site {
  const char* function;
  const char* measured_key;
};
const Site kSleeperSites[] = {{"sleep_in_nanosleep", "nanosleep_us"}, {"block_in_pipe_read", "pipe_us"},
                              {"wait_on_futex", "futex_us"}};

// Off-CPU microseconds of the folded report's stacks that pass through `function`: all, and those
// that end in [sleep].
std::pair<uint64_t, uint64_t> recorded_us(const std::string& folded, const std::string& function) {
  uint64_t recorded = 0, sleeping = 0;
  std::istringstream in(folded);
  std::string line;
  while (std::getline(in, line)) {
    auto sp = line.rfind(' ');
    if (sp == std::string::npos || line.find(";" + function + ";") == std::string::npos) continue;
    uint64_t us = std::stoull(line.substr(sp + 1));
    recorded += us;
    if (line.substr(0, sp).ends_with(";[sleep]_[k]")) sleeping += us;
  }
  return {recorded, sleeping};
}

double stat_of(const std::string& db, const std::string& key) {
  auto st = store::Store::open_sqlite(db, store::Store::Mode::kReadOnly);
  if (!st) return -1;
  auto rec = (*st)->latest_recording();
  if (!rec || !*rec) return -1;
  auto stats = (*st)->stats(**rec);
  if (!stats) return -1;
  for (const auto& [k, v] : *stats)
    if (k == key) return v;
  return -1;
}

// Item 2: blocked time per known blocking site within 10% of what the program measured itself. The
// capture target is raised over the sleeper's ~320 blocks a second, so every wanted stack is taken
// (the next test covers the sampled captures of the default target).
TEST(OffCpu, ThreadsBlockedInKnownPlacesShowTheirStacksAndTime) {
  TempDir dir;
  auto rec = run("STRATA_OFFCPU_CAPTURE_TARGET=1000 " + record(dir, "offcpu", testprog("sleeper") + " 3"));
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  auto rep = run(strata_bin() + " report " + dir.file("rec.db") + " --kind offcpu --format folded");
  ASSERT_EQ(rep.exit_code, 0) << describe(rep);
  for (Site s : kSleeperSites) {
    uint64_t measured = number_after(rec.out + rec.err, s.measured_key);
    ASSERT_GT(measured, 1'000'000u) << s.measured_key << "\n" << describe(rec);
    auto [recorded, sleeping] = recorded_us(rep.out, s.function);
    double ratio = static_cast<double>(recorded) / static_cast<double>(measured);
    EXPECT_NEAR(ratio, 1.0, 0.10) << s.function << ": recorded " << recorded << " us, program measured " << measured
                                  << " us\n" << rep.out.substr(0, 3000);
    EXPECT_GE(static_cast<double>(sleeping), 0.95 * static_cast<double>(recorded)) << s.function << " not [sleep]";
  }
}

// Over the capture target a CPU takes one wanted stack in 2^k at random and weights the block it sends
// 2^k times: the blocked time per site stays right on average while most captures are skipped. With
// a target of 50 captures per CPU per second, the sleeper's ~320 blocks a second are sampled 1 in 4 to
// 1 in 8; each site still has 75-150 sampled blocks in 15 s, so the weighted sum lands within 40%
// (about four standard deviations). Unweighted it would be a quarter of the truth or less.
TEST(OffCpu, SampledCapturesKeepTheBlockedTimeWhole) {
  TempDir dir;
  auto rec = run("STRATA_OFFCPU_CAPTURE_TARGET=50 " + record(dir, "offcpu", testprog("sleeper") + " 15"));
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  double sampled_out = stat_of(dir.file("rec.db"), "offcpu_sampled_out");
  double captures = stat_of(dir.file("rec.db"), "offcpu_captures");
  ASSERT_GT(sampled_out, captures) << "most wanted captures are sampled out\n" << describe(rec);
  auto rep = run(strata_bin() + " report " + dir.file("rec.db") + " --kind offcpu --format folded");
  ASSERT_EQ(rep.exit_code, 0) << describe(rep);
  for (Site s : kSleeperSites) {
    uint64_t measured = number_after(rec.out + rec.err, s.measured_key);
    ASSERT_GT(measured, 10'000'000u) << s.measured_key << "\n" << describe(rec);
    double ratio = static_cast<double>(recorded_us(rep.out, s.function).first) / static_cast<double>(measured);
    std::cout << "sampled off-CPU: " << s.function << " recorded/measured " << ratio << " (" << sampled_out
              << " captures sampled out, " << captures << " taken)\n";
    EXPECT_NEAR(ratio, 1.0, 0.40) << s.function << ": program measured " << measured << " us\n"
                                  << rep.out.substr(0, 3000);
  }
}

// A thread that sleeps 50 us twelve times, then 4 ms, ~180 times a second: its long blocks come after
// more short ones than a thread stays wanted for a capture (eight), so they go with the kernel stack
// only. Those too are sampled over the per-CPU target (1 in 4 to 1 in 8 at the default 25) and
// weighted: each one cost a kernel stack walk and a ring-buffer write, and a node of such threads
// sent every one. ~1,500 long blocks in 10 s leave ~200-400 sent: the weighted sum lands within 40%.
// Its rare explored captures carry its own frames, so both kinds of stacks count.
TEST(OffCpu, LongBlocksWithoutACaptureAreSampledAndWeighted) {
  TempDir dir;
  auto rec = run(record(dir, "offcpu", testprog("sleeper") + " 10 bursty"));
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  const uint64_t measured = number_after(rec.out + rec.err, "bursty_long_us");
  ASSERT_GT(measured, 4'000'000u) << describe(rec);
  const double bare_sampled_out = stat_of(dir.file("rec.db"), "offcpu_bare_sampled_out");
  const double bare_sent = stat_of(dir.file("rec.db"), "offcpu_no_user_stack");
  EXPECT_GT(bare_sampled_out, bare_sent) << "most long blocks without a capture are sampled out\n" << describe(rec);
  auto rep = run(strata_bin() + " report " + dir.file("rec.db") + " --kind offcpu --format folded");
  ASSERT_EQ(rep.exit_code, 0) << describe(rep);
  uint64_t recorded = 0;
  std::istringstream in(rep.out);
  std::string line;
  while (std::getline(in, line)) {
    auto sp = line.rfind(' ');
    if (sp == std::string::npos || line.find("hrtimer_nanosleep") == std::string::npos) continue;
    // The bursty thread's own frames, or no user frame at all (every other thread's blocks are
    // long each time, so wanted and captured, with their user stacks).
    if (line.find(";bursty_thread;") != std::string::npos || line.starts_with("entry_SYSCALL"))
      recorded += std::stoull(line.substr(sp + 1));
  }
  const double ratio = static_cast<double>(recorded) / static_cast<double>(measured);
  std::cout << "bursty long blocks: recorded/measured " << ratio << " (" << bare_sampled_out << " sampled out, "
            << bare_sent << " sent with the kernel stack)\n";
  EXPECT_NEAR(ratio, 1.0, 0.40) << "program measured " << measured << " us\n" << rep.out.substr(0, 3000);
}

// Off-CPU stacks through code without frame pointers: a thread waits on a condition variable (glibc's
// frameless futex wait) at the end of a chain built with -fomit-frame-pointer. The frame-pointer walk
// stops in glibc; the stack copied at switch-out, unwound with CFI on the node, must give the whole
// chain, from the thread's start, for nearly all of the blocked time.
TEST(OffCpu, BlockedThreadWithoutFramePointersShowsItsWholeChain) {
  TempDir dir;
  // Every block captured (no sampling over the capture target, as in the test above): this test is
  // about unwinding, and the waiter's and main thread's ~100 blocks a second sit above the default
  // target of 25, where a CPU may take one wanted capture in four, weighted 4x. Sampled 1 in 2, the
  // ~150 blocks of 3 s land within +-8% (one s.d.) of the truth: a CI run recorded 79.5% of it.
  auto rec = run("STRATA_OFFCPU_CAPTURE_TARGET=1000 " + record(dir, "offcpu", testprog("offcpu_nofp") + " 3"));
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  uint64_t measured = number_after(rec.out + rec.err, "cond_wait_us");
  ASSERT_GT(measured, 1'000'000u) << describe(rec);
  auto rep = run(strata_bin() + " report " + dir.file("rec.db") + " --kind offcpu --format folded");
  ASSERT_EQ(rep.exit_code, 0) << describe(rep);
  const std::regex chain("(^|;)start_thread;waiter;waiter_main;cond_chain_1;cond_chain_2;cond_chain_3;pthread_cond_wait");
  uint64_t futex_us = 0, whole_us = 0;
  std::istringstream in(rep.out);
  std::string line;
  while (std::getline(in, line)) {
    auto sp = line.rfind(' ');
    if (sp == std::string::npos || line.find("futex") == std::string::npos) continue;
    if (line.find("offcpu_nofp") == std::string::npos && line.find("cond_chain") == std::string::npos &&
        line.find("__futex_abstimed_wait") == std::string::npos)
      continue;
    uint64_t us = std::stoull(line.substr(sp + 1));
    futex_us += us;
    if (std::regex_search(line.substr(0, sp), chain)) whole_us += us;
  }
  // The waiter's blocks are ~all of the futex time (the main thread sleeps in nanosleep instead).
  EXPECT_GE(static_cast<double>(futex_us), 0.8 * static_cast<double>(measured)) << rep.out.substr(0, 4000);
  EXPECT_GE(static_cast<double>(whole_us), 0.9 * static_cast<double>(futex_us))
      << "whole chain for " << whole_us << " of " << futex_us << " us blocked in futex waits\n"
      << rep.out.substr(0, 4000);
  std::cout << "offcpu_nofp: measured " << measured << " us waiting; recorded " << futex_us << " us in futex waits, "
            << whole_us << " us with the whole chain\n";
}

// Item 1, cpu-contention: a hog on the faulty worker's CPU; the control worker has a CPU of its own.
TEST(OsMetrics, CpuHogOnTheSameCpuRaisesRunQueueLatencyAndIsNamedAsNeighbour) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs 2 CPUs";
  TempDir dir;
  // Hog and workers run at nice -10, so the machine's other load (builds, other tests) weighs little
  // against them: on CPU 1 the faulty worker shares with the hog, on CPU 0 the control mostly has it alone.
  const std::string hi = "nice -n -10 taskset -c ";
  // With autogroup scheduling, nice only counts inside a session's group: raise the group as well.
  auto rec = run("(echo -10 > /proc/self/autogroup) 2>/dev/null; " + hi + "1 " + worker() +
                 " 8 hog spin & H=$!; echo HOG=$H; sleep 0.2; " +
                 record(dir, "os", "sh -c '" + hi + "1 " + worker() + " 4 faulty & " + hi + "0 " + worker() +
                                       " 4 control & wait'") +
                 "; R=$?; kill $H; wait $H; exit $R");
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  uint64_t hog = number_after(rec.out, "HOG=");
  ASSERT_GT(hog, 0u);
  auto all = load_metrics(dir.file("rec.db"));
  const ProcMetrics* faulty = find(all, " faulty");
  const ProcMetrics* control = find(all, " control");
  ASSERT_TRUE(faulty && control) << rec.out;
  double f = faulty->sum.at("os.runq_wait_us"), c = control->sum.at("os.runq_wait_us");
  // Run-queue wait: on a quiet machine the faulty worker's is many times the control's, but on a
  // loaded one (other builds on 2 CPUs) both wait long; so only "not less" is asserted here, and the
  // preemptions and the neighbour list, which only the hog explains, carry the test.
  EXPECT_GE(f, 0.8 * c) << describe_metrics(*faulty) << "\n" << describe_metrics(*control);
  EXPECT_GT(faulty->sum.at("os.involuntary_switches"), 3 * control->sum.at("os.involuntary_switches") + 50)
      << describe_metrics(*faulty) << "\n" << describe_metrics(*control);
  // The hog is the faulty worker's largest neighbour.
  const auto& nb = faulty->by_label.at("os.neighbour_run_us");
  std::string hog_label = "os_worker:" + std::to_string(hog);
  auto top = std::max_element(nb.begin(), nb.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
  ASSERT_NE(top, nb.end());
  EXPECT_EQ(top->first, hog_label) << describe_metrics(*faulty);
  EXPECT_GT(top->second, 0.3 * faulty->sum.at("os.cpu_time_us")) << "the hog took a large share of the CPU";
  double control_hog = 0;
  if (control->by_label.count("os.neighbour_run_us") && control->by_label.at("os.neighbour_run_us").count(hog_label))
    control_hog = control->by_label.at("os.neighbour_run_us").at(hog_label);
  EXPECT_LT(control_hog * 10, top->second) << "the control worker shares no CPU with the hog";
}

// Item 1, cpu-throttling: the faulty worker runs in a cgroup with a 5% CPU quota (v1 or v2): small, so
// that it binds even when a loaded machine gives the worker little CPU anyway.
TEST(OsMetrics, CgroupCpuQuotaShowsAsThrottling) {
  std::string cg, quota_cmd;
  if (access("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", F_OK) == 0) {
    cg = "/sys/fs/cgroup/cpu/strata-os-test-" + std::to_string(getpid());
    quota_cmd = "echo 100000 > " + cg + "/cpu.cfs_period_us && echo 5000 > " + cg + "/cpu.cfs_quota_us";
  } else if (access("/sys/fs/cgroup/cpu.max", F_OK) == 0 || access("/sys/fs/cgroup/unified/cgroup.subtree_control", F_OK) == 0) {
    std::string root = access("/sys/fs/cgroup/cpu.max", F_OK) == 0 ? "/sys/fs/cgroup" : "/sys/fs/cgroup/unified";
    if (slurp(root + "/cgroup.subtree_control").find("cpu") == std::string::npos) GTEST_SKIP() << "no cgroup cpu controller";
    cg = root + "/strata-os-test-" + std::to_string(getpid());
    quota_cmd = "echo '5000 100000' > " + cg + "/cpu.max";
  } else {
    GTEST_SKIP() << "no cgroup cpu controller mounted";
  }
  TempDir dir;
  auto rec = run("mkdir -p " + cg + " && " + quota_cmd + " && " +
                 record(dir, "os", "sh -c \"sh -c 'echo \\$\\$ > " + cg + "/cgroup.procs; exec " + worker() +
                                       " 3 faulty' & " + worker() + " 3 control & wait\"") +
                 "; R=$?; rmdir " + cg + "; exit $R");
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  auto all = load_metrics(dir.file("rec.db"));
  const ProcMetrics* faulty = find(all, " faulty");
  const ProcMetrics* control = find(all, " control");
  ASSERT_TRUE(faulty && control) << rec.out;
  ASSERT_TRUE(faulty->sum.count("os.cgroup_throttled_us")) << describe_metrics(*faulty);
  double f = faulty->sum.at("os.cgroup_throttled_us");
  double c = control->sum.count("os.cgroup_throttled_us") ? control->sum.at("os.cgroup_throttled_us") : 0;
  // Wide margins: on a loaded machine the worker gets less CPU and so meets its quota less often.
  EXPECT_GT(f, 10 * c + 20'000) << describe_metrics(*faulty) << "\n" << describe_metrics(*control);
  EXPECT_GE(faulty->sum.at("os.cgroup_nr_throttled"), 3);
  EXPECT_NE(faulty->by_label.at("os.cgroup_throttled_us").begin()->first.find("strata-os-test"), std::string::npos);
}

// Item 3: two identical workers at the same time: no metric of one stands out from the other's.
TEST(OsMetrics, HealthyPairShowsNoOutlier) {
  TempDir dir;
  auto rec = run(record(dir, "os", "sh -c '" + worker() + " 3 twin-a & " + worker() + " 3 twin-b & wait'"));
  ASSERT_EQ(rec.exit_code, 0) << describe(rec);
  auto all = load_metrics(dir.file("rec.db"));
  const ProcMetrics* a = find(all, " twin-a");
  const ProcMetrics* b = find(all, " twin-b");
  ASSERT_TRUE(a && b) << rec.out;
  // name -> absolute slack: small values are noise, a real fault is far larger (see the tests above).
  const std::map<std::string, double> band = {
      {"os.cpu_time_us", 100'000},      {"os.runq_wait_us", 100'000},       {"os.involuntary_switches", 100},
      {"os.voluntary_switches", 300},   {"os.migrations", 200},             {"os.blocked_us", 200'000},
      {"os.minor_faults", 100},         {"os.major_faults", 10},            {"os.direct_reclaim_us", 10'000},
      {"os.compaction_stall_us", 10'000}, {"os.softirq_time_us", 20'000},  {"os.irq_time_us", 20'000},
      {"os.cgroup_throttled_us", 10'000}, {"os.bio_count", 20},             {"os.tcp_retransmits", 5},
  };
  for (const auto& [name, slack] : band) {
    double x = a->sum.count(name) ? a->sum.at(name) : 0;
    double y = b->sum.count(name) ? b->sum.at(name) : 0;
    EXPECT_LE(std::max(x, y), 2 * std::min(x, y) + slack)
        << name << ": " << x << " vs " << y << "\n" << describe_metrics(*a) << "\n" << describe_metrics(*b);
  }
}

}  // namespace
}  // namespace strata::test
