// The CLI's contract for bad input: a one-line reason, exit 1, nothing written or damaged.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "store/store.h"
#include "tests/support/net.h"
#include "tests/support/run.h"

namespace strata::test {
namespace {

void expect_one_line_error(const RunResult& r, int code, const std::string& needle) {
  EXPECT_EQ(r.exit_code, code) << describe(r);
  EXPECT_NE(r.err.find(needle), std::string::npos) << describe(r);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "expected one line:\n" << r.err;
}

TEST(Cli, RecordOfAMissingPidExitsOne) {
  TempDir d;
  auto r = run(strata_bin() + " record -o " + d.file("x.db") + " -p 3999999");
  expect_one_line_error(r, 1, "no such process: 3999999");
  EXPECT_TRUE(slurp(d.file("x.db")).empty()) << "no store is created on bad input";
}

TEST(Cli, RecordOfAMissingCommandExitsOne) {
  TempDir d;
  auto r = run(strata_bin() + " record -o " + d.file("x.db") + " -- /nonexistent/cmd --flag");
  expect_one_line_error(r, 1, "command not found");
  r = run(strata_bin() + " record -o " + d.file("x.db") + " -- no-such-command-strata");
  expect_one_line_error(r, 1, "no-such-command-strata");
}

TEST(Cli, CorruptOrForeignStoreExitsOneAndIsLeftUntouched) {
  TempDir d;
  run("head -c 4096 /dev/urandom > " + d.file("junk.db") + "; printf 'SQLite format 3\\0garbage' > " +
      d.file("trunc.db") + "; sqlite3 " + d.file("other.db") + " 'CREATE TABLE t(x); INSERT INTO t VALUES(1)'");
  for (const char* name : {"junk.db", "trunc.db", "other.db"}) {
    std::string path = d.file(name);
    std::string before = slurp(path);
    ASSERT_FALSE(before.empty()) << name;
    auto rep = run(strata_bin() + " report " + path);
    expect_one_line_error(rep, 1, "not a strata store");
    auto rec = run(strata_bin() + " record -o " + path + " -- /bin/true");
    expect_one_line_error(rec, 1, "not a strata store");
    EXPECT_EQ(slurp(path), before) << name << " was modified";
  }
}

TEST(Cli, UsageErrorsExitOne) {
  expect_one_line_error(run(strata_bin() + " record"), 1, "either -p");
  expect_one_line_error(run(strata_bin() + " record -F 100000 -- /bin/true"), 1, "out of range");
  expect_one_line_error(run(strata_bin() + " record -p abc"), 1, "not a number");
  expect_one_line_error(run(strata_bin() + " record --duration -3 -p 1"), 1, "positive number");
  expect_one_line_error(run(strata_bin() + " frobnicate"), 1, "unknown command");
  expect_one_line_error(run(strata_bin() + " report"), 1, "which store");
  expect_one_line_error(run(strata_bin() + " report /nonexistent.db"), 1, "no such file");
  expect_one_line_error(run(strata_bin() + " record --unwind-tables-mb 0.01 -- /bin/true"), 1, "size in MiB");
  expect_one_line_error(run(strata_bin() + " record --unwind-tables-mb 1x -- /bin/true"), 1, "size in MiB");
  expect_one_line_error(run(strata_bin() + " agent -o x.db --spool-max-mb -1"), 1, "size in MiB");
  expect_one_line_error(run(strata_bin() + " agent -o x.db --unwind-tables-mb nan"), 1, "size in MiB");
  expect_one_line_error(run(strata_bin() + " record --budget -1 -- /bin/true"), 1, "percentage");
  expect_one_line_error(run(strata_bin() + " agent -o x.db --budget 0.2x"), 1, "percentage");
}

TEST(Cli, SecondServeOnATakenPortExitsTwo) {
  TempDir d;
  const std::string listen = "127.0.0.1:" + std::to_string(free_port());
  // The first collector, in the background; its pid and log in the temp dir.
  run("cd " + d.path() + " && (" + strata_bin() + " serve --diagnose-every 0 --listen " + listen +
      " --store sqlite:first.db >first.log 2>&1 & echo $! >first.pid)");
  const pid_t first = std::stoi(slurp(d.file("first.pid")));
  // Waits for "serving on" (up to a minute on a loaded machine); no time is asserted.
  for (int i = 0; i < 600 && slurp(d.file("first.log")).find("serving on") == std::string::npos; ++i) usleep(100000);
  ASSERT_NE(slurp(d.file("first.log")).find("serving on"), std::string::npos) << slurp(d.file("first.log"));
  // The second must refuse at once; `timeout` only ends a regression that would serve forever.
  auto r = run("cd " + d.path() + " && timeout 30 " + strata_bin() + " serve --diagnose-every 0 --listen " + listen +
               " --store sqlite:second.db");
  kill(first, SIGTERM);
  expect_one_line_error(r, 2, "address in use");
  EXPECT_FALSE(std::filesystem::exists(d.file("second.db"))) << "a collector that cannot start leaves no store";
  EXPECT_TRUE(std::filesystem::exists(d.file("first.db")));
}

TEST(Cli, ServeRefusesAStoreSchemeItDoesNotSpeak) {
  TempDir d;
  auto r = run("cd " + d.path() + " && " + strata_bin() + " serve --store mysql:foo --listen 127.0.0.1:1");
  expect_one_line_error(r, 1, "unknown store 'mysql:'");
  EXPECT_TRUE(std::filesystem::is_empty(d.path())) << "nothing created";
}

// `strata serve` on sqlite:DB in `d`, in the background (its log: serve.log there), waited for until
// it serves (up to a minute on a loaded machine; no time is asserted): its pid and host:port, or
// pid -1 when it never served.
std::pair<pid_t, std::string> serve_in(const TempDir& d, const std::string& db) {
  const std::string listen = "127.0.0.1:" + std::to_string(free_port());
  run("cd " + d.path() + " && (" + strata_bin() + " serve --diagnose-every 0 --listen " + listen + " --store sqlite:" + db +
      " >serve.log 2>&1 & echo $! >serve.pid)");
  const pid_t pid = std::stoi(slurp(d.file("serve.pid")));
  for (int i = 0; i < 600 && slurp(d.file("serve.log")).find("serving on") == std::string::npos; ++i) usleep(100000);
  if (slurp(d.file("serve.log")).find("serving on") != std::string::npos) return {pid, listen};
  kill(pid, SIGTERM);
  return {-1, listen};
}

// A store of a 4-rank job (pids 100..103, ranks 0..3), each rank with a stack of its own
// (work_rank<R>) and an OS metric, as strata record would write it. `second_job`: and a job-2 of
// four ranks on node-2 with the same pids (comm train2, functions other_rank<R>), as a collector
// holds two jobs.
void write_four_rank_store(const std::string& path, bool second_job = false) {
  auto st = store::Store::open_sqlite(path, store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  store::Store& s = **st;
  ASSERT_TRUE(s.begin());
  for (int job = 1; job <= (second_job ? 2 : 1); ++job) {
  const std::string node = "node-" + std::to_string(job);
  auto rec = s.begin_recording({node, "job", 1000, 99, 10});
  ASSERT_TRUE(rec) << rec.error().message;
  std::vector<store::StackCount> counts;
  std::vector<store::Metric> metrics;
  for (int r = 0; r < 4; ++r) {
    store::ProcessInfo p;
    p.pid = 100 + static_cast<uint32_t>(r);
    p.node = node;
    p.comm = job == 1 ? "train" : "train2";
    p.command = "train.py";
    p.job = "job-" + std::to_string(job);
    p.rank = r;
    p.world_size = 4;
    ASSERT_TRUE(s.put_process(*rec, p));
    // Frames are one row per (build id, module, offset): each function its own offset.
    Frame leaf, root;
    leaf.kind = root.kind = FrameKind::kNative;
    leaf.build_id = root.build_id = "abcd";
    leaf.module = root.module = "/usr/bin/train";
    leaf.offset = 0x1000 + 0x100 * static_cast<uint64_t>(r);
    leaf.function = (job == 1 ? "work_rank" : "other_rank") + std::to_string(r);
    if (job == 2) leaf.offset += 0x10000;
    root.offset = 0x10;
    root.function = "main";
    auto id = s.intern_stack({leaf, root});
    ASSERT_TRUE(id) << id.error().message;
    counts.push_back({p.pid, p.pid, p.comm, *id, 10u + static_cast<uint64_t>(r)});
    metrics.push_back({p.pid, "os.involuntary_switches", "", 5.0 + r});
  }
  ASSERT_TRUE(s.put_window(*rec, 1000, 2000, store::CountKind::kOnCpu, counts));
  ASSERT_TRUE(s.put_metrics(*rec, 1000, 2000, metrics));
  ASSERT_TRUE(s.end_recording(*rec, 2000));
  }
  ASSERT_TRUE(s.commit());
}

// `--rank R` keeps rank R's rows and nothing else; a filter that matches nothing is an error.
void expect_rank_filter(const std::string& source) {
  for (const char* format : {"--format folded", "--format=folded", "-f folded"}) {
    auto r = run(strata_bin() + " report " + source + " --rank 2 " + format);
    ASSERT_EQ(r.exit_code, 0) << format << " " << describe(r);
    EXPECT_EQ(r.out, "main;work_rank2 12\n") << format;
  }
  auto text = run(strata_bin() + " report " + source + " --rank=2");
  ASSERT_EQ(text.exit_code, 0) << describe(text);
  EXPECT_NE(text.out.find("rank 2"), std::string::npos) << text.out;
  for (const char* other : {"rank 0", "rank 1", "rank 3", "pid     100", "pid     101", "pid     103", "work_rank1"})
    EXPECT_EQ(text.out.find(other), std::string::npos) << other << " in\n" << text.out;
  expect_one_line_error(run(strata_bin() + " report " + source + " --rank 7"), 1, "no process of rank 7");
  expect_one_line_error(run(strata_bin() + " report " + source + " --pid 999 --format folded"), 1, "no process 999");
  expect_one_line_error(run(strata_bin() + " report " + source + " --rank 1 --pid 100"), 1,
                        "no process 100 of rank 1");
}

// Issue 19: `strata report` says where the cost budget reduced fidelity (node, ranks, when, what),
// in the text report and beside an exported profile (stderr), and weighs the samples by their period.
TEST(Cli, ReportSaysWhereFidelityWasReduced) {
  TempDir d;
  {
    auto st = store::Store::open_sqlite(d.file("f.db"), store::Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    auto& s = **st;
    ASSERT_TRUE(s.begin());
    constexpr uint64_t kS = 1'000'000'000ull;
    const uint64_t t0 = 1'764'614'400 * kS;  // 2025-12-01 18:40:00 UTC
    auto rec = s.begin_recording({"node-1", "train.py", t0, 99, 10});
    ASSERT_TRUE(rec);
    store::ProcessInfo p;
    p.pid = 100;
    p.node = "node-1";
    p.comm = "train";
    p.rank = 0;
    ASSERT_TRUE(s.put_process(*rec, p));
    Frame f;
    f.kind = FrameKind::kNative;
    f.build_id = "abcd";
    f.module = "/usr/bin/train";
    f.offset = 0x1000;
    f.function = "work";
    auto id = s.intern_stack({f});
    ASSERT_TRUE(id);
    ASSERT_TRUE(s.put_window(*rec, t0, t0 + 10 * kS, store::CountKind::kOnCpu, {{100, 100, "train", *id, 990}},
                             {99, store::kUnwindingCfi}));
    ASSERT_TRUE(s.put_window(*rec, t0 + 10 * kS, t0 + 20 * kS, store::CountKind::kOnCpu, {{100, 100, "train", *id, 240}},
                             {24, store::kUnwindingFramePointers}));
    ASSERT_TRUE(s.end_recording(*rec, t0 + 20 * kS));
    ASSERT_TRUE(s.commit());
  }
  const std::string line = "node-1 (rank 0), 2025-12-01 18:40:10 - 18:40:20 UTC, 1 window: 24 Hz instead of 99 Hz; "
                           "frame pointers only (CFI unwinding off)";
  auto text = run(strata_bin() + " report " + d.file("f.db"));
  ASSERT_EQ(text.exit_code, 0) << describe(text);
  EXPECT_NE(text.out.find("reduced fidelity: the agent's cost budget"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("  " + line + "\n"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("1230 samples in total, taken at several rates; columns are samples at 99 Hz (1980)"),
            std::string::npos) << text.out;
  auto folded = run(strata_bin() + " report " + d.file("f.db") + " --format folded");
  ASSERT_EQ(folded.exit_code, 0) << describe(folded);
  EXPECT_EQ(folded.out, "work 1980\n") << "two windows of 10 s of CPU each, in samples at 99 Hz";
  EXPECT_NE(folded.err.find("strata:   " + line), std::string::npos) << folded.err;
}

TEST(Cli, ReportRankFilterOnAFile) {
  TempDir d;
  write_four_rank_store(d.file("job.db"));
  expect_rank_filter(d.file("job.db"));
  // One rank's timeline: its process's thread tracks and OS counters, no other's (read per process).
  for (const char* filter : {"--rank 2", "--pid 102"}) {
    auto r = run(strata_bin() + " report " + d.file("job.db") + " " + filter + " --format chrome-trace -o " + d.file("t.json"));
    ASSERT_EQ(r.exit_code, 0) << filter << " " << describe(r);
    const std::string trace = slurp(d.file("t.json"));
    EXPECT_NE(trace.find("\"on-CPU train (102)\""), std::string::npos) << filter << "\n" << trace;
    EXPECT_NE(trace.find("involuntary_switches"), std::string::npos) << filter << "\n" << trace;
    for (const char* other : {"(100)", "(101)", "(103)"}) EXPECT_EQ(trace.find(other), std::string::npos) << other;
  }
  auto r = run(strata_bin() + " report " + d.file("job.db") + " --format chrome-trace -o " + d.file("all.json"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::string all = slurp(d.file("all.json"));
  for (const char* each : {"(100)", "(101)", "(102)", "(103)"}) EXPECT_NE(all.find(each), std::string::npos) << each;
}

// A span (--from/--to, --last): the chrome trace holds the steps inside it, not the file's whole
// history; --last counts back from the file's latest step; a span that cannot be read is refused
// with its reason (exit 1).
// Issue 16: `--job J` keeps job J's processes: rank R of another job (here with the same pids, on
// another node) is another process. Its profile, its text report and its chrome trace; a job the
// store does not hold is an error that lists the jobs it does.
void expect_job_filter(const std::string& source) {
  auto both = run(strata_bin() + " report " + source + " --rank 2 --format folded");
  ASSERT_EQ(both.exit_code, 0) << describe(both);
  EXPECT_EQ(both.out, "main;other_rank2 12\nmain;work_rank2 12\n") << "rank 2 of each job";
  for (auto [job, line] : {std::pair{"job-1", "main;work_rank2 12\n"}, std::pair{"job-2", "main;other_rank2 12\n"}}) {
    auto r = run(strata_bin() + " report " + source + " --job " + job + " --rank 2 --format folded");
    ASSERT_EQ(r.exit_code, 0) << job << " " << describe(r);
    EXPECT_EQ(r.out, line) << job;
  }
  auto whole = run(strata_bin() + " report " + source + " --job job-2 --format folded");
  ASSERT_EQ(whole.exit_code, 0) << describe(whole);
  EXPECT_EQ(whole.out.find("work_rank"), std::string::npos) << whole.out;
  for (int r = 0; r < 4; ++r) EXPECT_NE(whole.out.find("other_rank" + std::to_string(r)), std::string::npos) << whole.out;
  auto text = run(strata_bin() + " report " + source + " --job job-2");
  ASSERT_EQ(text.exit_code, 0) << describe(text);
  EXPECT_NE(text.out.find("other_rank1"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("work_rank1"), std::string::npos) << text.out;
  TempDir d;
  auto trace = run(strata_bin() + " report " + source + " --job job-2 --rank 2 --format chrome-trace -o " + d.file("t.json"));
  ASSERT_EQ(trace.exit_code, 0) << describe(trace);
  const std::string t = slurp(d.file("t.json"));
  EXPECT_NE(t.find("\"on-CPU train2 (102)\""), std::string::npos) << t;
  EXPECT_EQ(t.find("\"on-CPU train (102)\""), std::string::npos) << t;
  expect_one_line_error(run(strata_bin() + " report " + source + " --job nope --format folded"), 1,
                        "no job 'nope' in " + source.substr(source.find_last_of(" ") + 1) + " (its jobs: job-1, job-2)");
  expect_one_line_error(run(strata_bin() + " report " + source + " --job job-1 --rank 7"), 1, "no process of rank 7 in job 'job-1'");
}

TEST(Cli, ReportJobFilterOnAFileAndAServer) {
  TempDir d;
  write_four_rank_store(d.file("jobs.db"), true);
  expect_job_filter(d.file("jobs.db"));
  const auto [server, listen] = serve_in(d, "jobs.db");
  ASSERT_GT(server, 0) << slurp(d.file("serve.log"));
  expect_job_filter("--server http://" + listen);
  kill(server, SIGTERM);
}

TEST(Cli, ReportReadsTheSpanItIsGiven) {
  TempDir d;
  const std::string db = std::string(STRATA_SOURCE_DIR) + "/tests/data/diagnose/host-hotspot.db";
  std::vector<store::StepRecord> mine;
  {
    auto s = store::Store::open_sqlite(db, store::Store::Mode::kReadOnly);
    ASSERT_TRUE(s) << s.error().message;
    auto steps = (*s)->steps();
    ASSERT_TRUE(steps);
    auto procs = (*s)->processes();
    ASSERT_TRUE(procs);
    uint32_t pid = 0;
    for (const auto& p : *procs)
      if (p.rank == 3) pid = p.pid;
    for (const auto& x : *steps)
      if (x.pid == pid) mine.push_back(x);
  }
  std::sort(mine.begin(), mine.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
  ASSERT_GE(mine.size(), 20u);
  auto steps_in = [&](const std::string& span) -> size_t {
    auto r = run(strata_bin() + " report " + db + " --rank 3 " + span + " --format chrome-trace -o " + d.file("t.json"));
    EXPECT_EQ(r.exit_code, 0) << span << " " << describe(r);
    const std::string trace = slurp(d.file("t.json"));
    size_t n = 0;
    for (size_t at = 0; (at = trace.find("\"cat\":\"step\"", at)) != std::string::npos; ++at) ++n;
    return n;
  };
  const size_t k = mine.size() / 2;
  // Back-to-back steps: the span from one's start to the third's end holds those three.
  EXPECT_EQ(steps_in("--from " + std::to_string(mine[k].start_ns) + " --to " + std::to_string(mine[k + 2].end_ns)), 3u);
  EXPECT_EQ(steps_in(""), mine.size());
  EXPECT_EQ(steps_in("--last 1h"), mine.size());
  // The latest second: the steps that end in it, fewer than the run's.
  const size_t latest = steps_in("--last 1s");
  EXPECT_GT(latest, 0u);
  EXPECT_LT(latest, mine.size());
  for (const char* bad : {"--last 10x", "--last 0s", "--last 1m --from 5", "--from 9 --to 3", "--from soon"}) {
    auto r = run(strata_bin() + " report " + db + " --rank 3 " + bad + " --format chrome-trace -o " + d.file("bad.json"));
    EXPECT_EQ(r.exit_code, 1) << bad << " " << describe(r);
    EXPECT_NE(r.err.find("report: "), std::string::npos) << bad << " " << describe(r);
  }
}

TEST(Cli, ReportRankFilterAgainstAServer) {
  TempDir d;
  write_four_rank_store(d.file("job.db"));
  const auto [server, listen] = serve_in(d, "job.db");
  ASSERT_GT(server, 0) << slurp(d.file("serve.log"));
  expect_rank_filter("--server http://" + listen);
  kill(server, SIGTERM);
}

// Every family on serve's /metrics has HELP and TYPE; counters end in _total; the build and
// request-duration families are there.
TEST(Cli, ServeMetricsFollowPrometheusConventions) {
  TempDir d;
  const auto [server, listen] = serve_in(d, "m.db");
  ASSERT_GT(server, 0) << slurp(d.file("serve.log"));
  const std::string get = "python3 -c 'import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' ";
  run(get + "http://" + listen + "/api/v1/jobs");
  auto page = run(get + "http://" + listen + "/metrics");
  kill(server, SIGTERM);
  ASSERT_EQ(page.exit_code, 0) << describe(page);
  std::map<std::string, std::string> type;  // family -> TYPE
  std::set<std::string> help, sampled;
  std::istringstream in(page.out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream w(line);
    std::string a, b, c;
    w >> a >> b >> c;
    if (a == "#" && b == "HELP") help.insert(c);
    else if (a == "#" && b == "TYPE") type[c] = line.substr(line.rfind(' ') + 1);
    else if (!a.empty()) sampled.insert(a.substr(0, a.find('{')));
  }
  for (const auto& [family, t] : type) {
    EXPECT_TRUE(help.count(family)) << family << " has no HELP";
    if (t == "counter") {
      EXPECT_TRUE(family.size() > 6 && family.substr(family.size() - 6) == "_total") << family;
    }
  }
  for (const auto& name : sampled) {
    std::string family = name;
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string sfx = suffix;
      if (!type.count(family) && family.size() > sfx.size() && family.substr(family.size() - sfx.size()) == sfx)
        family = family.substr(0, family.size() - sfx.size());
    }
    EXPECT_TRUE(type.count(family)) << name << " has no TYPE";
  }
  EXPECT_EQ(type["strata_build_info"], "gauge");
  EXPECT_EQ(type["strata_serve_request_duration_seconds"], "histogram");
  EXPECT_EQ(type["strata_serve_diagnosis_duration_seconds"], "histogram");
  EXPECT_EQ(type["strata_serve_round_duration_seconds"], "histogram");
  EXPECT_NE(page.out.find("strata_serve_request_duration_seconds_count{route=\"jobs\"} 1"), std::string::npos)
      << page.out;
}

TEST(Cli, HelpAnswers) {
  for (const char* cmd : {" --help", " record --help", " report --help", " diagnose --help", " agent --help",
                          " serve --help", " drilldown --help", " report -h"}) {
    auto r = run(strata_bin() + cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("usage: strata"), std::string::npos) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("Exit codes"), std::string::npos) << cmd << "\n" << r.out;
  }
  auto top = run(strata_bin() + " --help");
  EXPECT_NE(top.out.find("chrome-trace"), std::string::npos) << top.out;
  auto report = run(strata_bin() + " report --help");
  for (const char* flag : {"--rank", "--pid", "--tid", "--kind", "--format", "--server", "--token-file", "-o"})
    EXPECT_NE(report.out.find(flag), std::string::npos) << flag << "\n" << report.out;
}

TEST(Cli, OptionsTakeTheEqualsForm) {
  expect_one_line_error(run(strata_bin() + " record --duration=-3 -p 1"), 1, "positive number");
  expect_one_line_error(run(strata_bin() + " report --format=svg x.db"), 1, "unknown format 'svg'");
  expect_one_line_error(run(strata_bin() + " report --bogus x.db"), 1, "--bogus");
  expect_one_line_error(run(strata_bin() + " serve --listen"), 1, "--listen");
}

}  // namespace
}  // namespace strata::test
