// A hang through the store and the loader: the synthetic multi-node job of `strata-sim agents`
// (testbed/synth) with one rank's GPU stopped, written as its agents would, then loaded and
// diagnosed. The loader gives each rank its collective progress (per communicator: calls, last
// sequence number, op, completion) and its stacks after the job's last progress; the hang finding
// names the hung rank and carries that evidence. Fails if the evidence is missing or names another
// rank.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "diagnose/engine.h"
#include "diagnose/loader.h"
#include "diagnose/render.h"
#include "store/store.h"
#include "testbed/synth/job.h"
#include "tests/support/forwarding_reader.h"
#include "tests/support/rank_process.h"
#include "tests/support/run.h"

namespace strata::diagnose {
namespace {

bool has_evidence(const Finding& f, std::initializer_list<std::string> parts) {
  for (const auto& e : f.evidence) {
    bool all = true;
    for (const auto& p : parts) all &= e.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

// Writes `job` into `s` as its agents would: per node, the recording, then one transaction a window.
// `offset_ns(node)`: how much later than the job's clock that node's agent closes its windows
// (Job::windows(offset)); none: every node on the job's clock. Only the windows that ended by
// `sent_by_ns(node)` are written (what a collector holds then); none: all. A node that sent them all
// ends its recording.
Status write_agents(const synth::Job& job, store::Store& s, const std::function<uint64_t(int)>& offset_ns = nullptr,
                    const std::function<uint64_t(int)>& sent_by = nullptr) {
  for (int node = 0; node < job.spec().nodes; ++node) {
    const uint64_t sent_by_ns = sent_by ? sent_by(node) : UINT64_MAX;
    synth::Job::NodeWriter w(job, s, node);
    if (auto st = w.begin(job.spec().t0_ns); !st) return st;
    const auto windows = job.windows(offset_ns ? offset_ns(node) : 0);
    for (const auto& win : windows) {
      if (win.end_ns > sent_by_ns) break;  // not sent yet
      if (auto st = s.begin(); !st) return st;
      if (auto st = w.window(win); !st) return st;
      if (auto st = s.commit(); !st) return st;
    }
    if (windows.back().end_ns > sent_by_ns) continue;
    if (auto st = w.end(windows.back().end_ns); !st) return st;
  }
  return {};
}

// `job` written as write_agents writes it (each node's window offset, what each had sent by) into a
// fresh store, loaded (every recording) and diagnosed; nothing where a step failed.
std::optional<Diagnosis> diagnose_sent(const synth::Job& job, const std::function<uint64_t(int)>& offset_ns,
                                       const std::function<uint64_t(int)>& sent_by) {
  test::TempDir dir;
  auto st = store::Store::open_sqlite(dir.file("s.db"), store::Store::Mode::kCreateOrAppend);
  if (!st) {
    ADD_FAILURE() << st.error().message;
    return std::nullopt;
  }
  if (auto written = write_agents(job, **st, offset_ns, sent_by); !written) {
    ADD_FAILURE() << written.error().message;
    return std::nullopt;
  }
  LoadOptions lo;
  lo.all_recordings = true;
  auto jw = load_job_window(**st, lo);
  if (!jw) {
    ADD_FAILURE() << jw.error().message;
    return std::nullopt;
  }
  return diagnose(*jw);
}

// A synthetic job of `nodes` x 4 ranks and `steps` 1 s steps whose rank `hung` hangs from step
// `start_step`.
synth::JobSpec hung_spec(int nodes, int steps, int hung, int start_step) {
  synth::JobSpec sp;
  sp.job = "hang-job";
  sp.nodes = nodes;
  sp.ranks_per_node = 4;
  sp.steps = steps;
  sp.step_ms = 1000;
  sp.fault = synth::Fault::kHang;
  sp.fault_rank = hung;
  sp.fault_start_step = start_step;
  sp.t0_ns = 1'700'000'000'000'000'000ull;
  return sp;
}

// The diagnosis's hang finding, or null.
const Finding* hang_finding(const Diagnosis& dx) {
  const Finding* f = nullptr;
  for (const auto& x : dx.findings) {
    if (x.cause == Cause::kHang) f = &x;
  }
  return f;
}

TEST(DiagnoseHangStore, HungRankAndItsEvidenceThroughTheLoader) {
  for (int hung : {0, 5, 7}) {
    SCOPED_TRACE("hung rank " + std::to_string(hung));
    synth::Job job(hung_spec(2, 40, hung, 20));  // 20 s of progress, then 20 s of stall
    test::TempDir dir;
    auto st = store::Store::open_sqlite(dir.file("s.db"), store::Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    store::Store& s = **st;
    auto written = write_agents(job, s);
    ASSERT_TRUE(written) << written.error().message;

    LoadOptions lo;
    lo.all_recordings = true;  // one recording per node's agent
    auto jw = load_job_window(s, lo);
    ASSERT_TRUE(jw) << jw.error().message;
    ASSERT_EQ(jw->ranks.size(), 8u);
    // The loader's collective progress: every rank's one communicator; the hung rank one call short.
    for (const auto& r : jw->ranks) {
      ASSERT_EQ(r.comms.size(), 1u) << "rank " << r.rank;
      EXPECT_EQ(r.comms[0].comm, "synth-hang-job");
      EXPECT_EQ(r.comms[0].last_op, "allreduce");
      EXPECT_EQ(r.comms[0].last_seq, r.rank == hung ? 20u : 21u) << "rank " << r.rank;
      EXPECT_EQ(r.comms[0].last_completed, r.rank == hung) << "rank " << r.rank;
    }
    // ... and the stall's stacks (the windows after the last progress), for every rank.
    EXPECT_FALSE(jw->ranks[static_cast<size_t>(hung)].stall_oncpu.empty());

    auto dx = diagnose(*jw);
    const Finding* f = hang_finding(dx);
    ASSERT_NE(f, nullptr) << text_of(dx);
    const std::string me = "rank " + std::to_string(hung);
    EXPECT_EQ(f->rank, hung) << text_of(dx);
    EXPECT_TRUE(has_evidence(*f, {me + "'s last collective: allreduce #20 on communicator synth-hang-job", "completed"}))
        << text_of(dx);
    std::string others;
    for (int i = 0; i < 8; ++i) {
      if (i != hung) others += (others.empty() ? "" : ",") + std::to_string(i);
    }
    EXPECT_TRUE(has_evidence(*f, {me + " never entered allreduce #21 on communicator synth-hang-job",
                                  "ranks [" + others + "] entered and wait in"}))
        << text_of(dx);
    EXPECT_TRUE(has_evidence(*f, {me + " on-CPU since the job's last progress"})) << text_of(dx);
  }
}

// Forwards every read to a store; counts the profile reads.
class ProfileReadCounter : public test::ForwardingReader {
 public:
  using ForwardingReader::ForwardingReader;
  int profile_reads = 0;

  Result<Profile> load_profile(const store::ProfileFilter& f) override {
    ++profile_reads;
    return ForwardingReader::load_profile(f);
  }
};

// A synthetic hung job of `nodes` x 4 ranks (rank 6 hung from step 20 of 40) in a fresh store.
Status write_hung_job(store::Store& s, int nodes, bool same_pids) {
  synth::JobSpec sp = hung_spec(nodes, 40, 6, 20);
  sp.same_pids = same_pids;
  return write_agents(synth::Job(sp), s);
}

// Each rank's stall stacks by name, ms per step.
std::map<int, std::map<std::string, double>> stall_stacks(const JobWindow& jw) {
  std::map<int, std::map<std::string, double>> out;
  for (const auto& r : jw.ranks) {
    auto& mine = out[r.rank];
    for (const auto& v : r.stall_oncpu) mine["on " + jw.names.name(v.name)] = v.ms_per_step;
    for (const auto& v : r.stall_offcpu) mine["off " + jw.names.name(v.name)] = v.ms_per_step;
  }
  return out;
}

// Job::windows(offset): an agent whose windows end `offset` later than the job's clock still writes
// every step once, in the window its end falls in, and its windows end at its own moments.
TEST(DiagnoseHangStore, AnAgentsOwnWindowClockCoversEveryStepOnce) {
  synth::JobSpec sp;
  sp.steps = 47;
  sp.step_ms = 1000;
  sp.window_s = 10;
  sp.t0_ns = 1'700'000'000'000'000'000ull;
  synth::Job job(sp);
  for (uint64_t offset_s : {0, 3, 7}) {
    SCOPED_TRACE("offset " + std::to_string(offset_s) + " s");
    auto ws = job.windows(offset_s * 1'000'000'000ull);
    if (offset_s == 0) {
      ASSERT_EQ(ws.size(), job.windows().size());
    }
    ASSERT_FALSE(ws.empty());
    EXPECT_EQ(ws.front().start_ns, sp.t0_ns);
    EXPECT_EQ(ws.back().end_ns, job.windows().back().end_ns);  // the job's end
    size_t next = 0;
    for (size_t i = 0; i < ws.size(); ++i) {
      EXPECT_EQ(ws[i].first_step, next) << "window " << i;
      next = ws[i].end_step;
      if (i + 1 < ws.size()) {
        EXPECT_EQ(ws[i].end_ns, sp.t0_ns + (10 * (i + 1) + offset_s) * 1'000'000'000ull) << "window " << i;
        EXPECT_EQ(ws[i + 1].start_ns, ws[i].end_ns);
      }
    }
    EXPECT_EQ(next, 47u);
  }
}

// Real agents start at different times, so each node's windows end at moments of their own: a hang
// is seen once any node's latest window is hang_s past the job's last progress, not only when the
// windows of every node are. The job's last progress at 22 s; at 36 s a collector holds the windows
// that ended by then: with every window ending at 10, 20, 30 s that is 8 s of stall (no hang yet);
// when node 1's windows end 5 s later (15, 25, 35 s), 13 s, and the hung rank is named.
TEST(DiagnoseHangStore, AHangIsSeenByTheNodeWhoseWindowEndedLatest) {
  for (uint64_t node1_offset_s : {0, 5}) {
    SCOPED_TRACE("node 1's windows " + std::to_string(node1_offset_s) + " s later");
    // Rank 2 is on node 0, whose windows end on the job's clock.
    const synth::Job job(hung_spec(2, 60, 2, 22));
    auto got = diagnose_sent(job, [&](int node) { return node == 1 ? node1_offset_s * 1'000'000'000ull : 0; },
                             [&](int) { return job.spec().t0_ns + 36'000'000'000ull; });
    ASSERT_TRUE(got);
    const Diagnosis& dx = *got;
    const Finding* f = hang_finding(dx);
    if (node1_offset_s == 0) {
      EXPECT_EQ(f, nullptr) << text_of(dx);
    } else {
      ASSERT_NE(f, nullptr) << text_of(dx);
      EXPECT_EQ(f->rank, 2) << text_of(dx);
    }
  }
}

// A node whose latest windows have not reached the store (its batch is being retried) looks, in the
// store, as if its ranks stopped first and never entered the call the others wait in. 3 nodes x 4
// ranks, the job's last progress at 22 s, the node after the late one closing its windows 5 s after
// the others (so its window of 35 s sees 13 s of stall), the collector holding what was sent by 36 s
// (by 21 s for the late node):
// - rank 2 hung, node 2 sent nothing after its window of 20 s: rank 2 is named, not a rank of the
//   late node (measured at 8,000 ranks: a late node's rank was named before the hung one);
// - rank 2 hung and its own node 0 late: no verdict yet; the diagnosis waits and says for whom.
TEST(DiagnoseHangStore, ALateNodesRanksAreNoHangCulprit) {
  struct Case {
    int hung, late_node;
  };
  for (const Case c : {Case{2, 2}, Case{2, 0}, Case{9, 1}}) {
    SCOPED_TRACE("hung rank " + std::to_string(c.hung) + ", node " + std::to_string(c.late_node) + " late");
    const synth::Job job(hung_spec(3, 60, c.hung, 22));
    const uint64_t t0 = job.spec().t0_ns;
    auto got = diagnose_sent(
        job, [&](int node) { return node == (c.late_node + 1) % 3 ? 5'000'000'000ull : 0; },
        [&](int node) { return t0 + (node == c.late_node ? 21'000'000'000ull : 36'000'000'000ull); });
    ASSERT_TRUE(got);
    const Diagnosis& dx = *got;
    const Finding* f = hang_finding(dx);
    const bool hung_is_late = c.hung / 4 == c.late_node;
    if (hung_is_late) {
      EXPECT_EQ(f, nullptr) << text_of(dx);
      EXPECT_TRUE(dx.waiting_for_data) << text_of(dx);
      EXPECT_NE(dx.note.find("rank " + std::to_string(c.hung)), std::string::npos) << dx.note;
      EXPECT_NE(dx.note.find("node-" + std::to_string(c.late_node)), std::string::npos) << dx.note;
    } else {
      ASSERT_NE(f, nullptr) << text_of(dx);
      EXPECT_EQ(f->rank, c.hung) << text_of(dx);
      EXPECT_FALSE(dx.waiting_for_data);
      std::string late;
      for (int k = 0; k < 4; ++k) late += (k ? "," : "") + std::to_string(c.late_node * 4 + k);
      EXPECT_TRUE(has_evidence(*f, {"ranks [" + late + "] have no data since the job's last progress", "not judged"}))
          << text_of(dx);
    }
  }
}

// A hang's stall stacks are read once per node and kind, whatever the node's ranks (a per-process
// read made 32,000 reads in a round at 8,000 ranks): the same load with the stall reads turned off
// reads at most two profiles (on- and off-CPU) per node fewer. And each rank still gets its own
// process's stacks where every node's ranks have the same pids (containers): the same job with
// pids of its own per rank gives every rank the same stall stacks (a read that mixed nodes up
// would give a rank its pid's samples on every node).
TEST(DiagnoseHangStore, AStallsStacksAreReadOncePerNode) {
  constexpr int kNodes = 3;
  test::TempDir dir;
  auto same = store::Store::open_sqlite(dir.file("same.db"), store::Store::Mode::kCreateOrAppend);
  auto own = store::Store::open_sqlite(dir.file("own.db"), store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(same && own);
  for (auto [st, same_pids] : {std::pair{same->get(), true}, std::pair{own->get(), false}}) {
    auto written = write_hung_job(*st, kNodes, same_pids);
    ASSERT_TRUE(written) << written.error().message;
  }
  LoadOptions lo;
  lo.all_recordings = true;
  ProfileReadCounter with(**same);
  auto jw = load_job_window(with, lo);
  ASSERT_TRUE(jw) << jw.error().message;
  ASSERT_EQ(jw->ranks.size(), 12u);
  std::set<uint32_t> pids;
  for (const auto& r : jw->ranks) pids.insert(r.pid);
  EXPECT_EQ(pids.size(), 4u) << "every node's ranks have the same pids";

  LoadOptions no_stall = lo;
  no_stall.stall_stacks_s = 1e9;  // never stalled long enough: no stall stacks read
  ProfileReadCounter without(**same);
  auto plain = load_job_window(without, no_stall);
  ASSERT_TRUE(plain) << plain.error().message;
  const int stall_reads = with.profile_reads - without.profile_reads;
  EXPECT_GT(stall_reads, 0);
  EXPECT_LE(stall_reads, 2 * kNodes) << "stall stacks read per process, not per node";
  for (const auto& [rank, stacks] : stall_stacks(*plain)) EXPECT_TRUE(stacks.empty()) << "rank " << rank;

  auto reference = load_job_window(**own, lo);
  ASSERT_TRUE(reference) << reference.error().message;
  const auto got = stall_stacks(*jw), want = stall_stacks(*reference);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [rank, stacks] : want) {
    EXPECT_FALSE(stacks.empty()) << "rank " << rank;
    ASSERT_TRUE(got.count(rank)) << "rank " << rank;
    ASSERT_EQ(got.at(rank).size(), stacks.size()) << "rank " << rank;
    for (const auto& [path, ms] : stacks) EXPECT_NEAR(got.at(rank).at(path), ms, 1e-9) << "rank " << rank << " " << path;
  }
}

// A healthy job through the same path: no stall, so no stall stacks are read, and no finding.
TEST(DiagnoseHangStore, HealthyJobReadsNoStallStacks) {
  synth::JobSpec sp;
  sp.job = "healthy-job";
  sp.nodes = 1;
  sp.ranks_per_node = 4;
  sp.steps = 30;
  sp.t0_ns = 1'700'000'000'000'000'000ull;
  synth::Job job(sp);
  test::TempDir dir;
  auto st = store::Store::open_sqlite(dir.file("s.db"), store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  auto written = write_agents(job, **st);
  ASSERT_TRUE(written) << written.error().message;
  auto jw = load_job_window(**st);
  ASSERT_TRUE(jw) << jw.error().message;
  for (const auto& r : jw->ranks) {
    EXPECT_TRUE(r.stall_oncpu.empty() && r.stall_offcpu.empty()) << "rank " << r.rank;
    ASSERT_EQ(r.comms.size(), 1u);
    EXPECT_TRUE(r.comms[0].last_completed);
  }
  auto dx = diagnose(*jw);
  EXPECT_TRUE(dx.findings.empty()) << text_of(dx);
}

// A job whose ranks have no RANK in their environment (torch.multiprocessing.spawn hands each its
// rank as an argument): the loader takes the processes that train under one parent as the job's
// ranks, numbered by start order, says so in the data notes, and the diagnosis names the slow rank
// as it does with the environment. Before, the load failed ("no recorded process has a RANK").
TEST(DiagnoseHangStore, RanksWithoutARankInTheirEnvironmentAreTheProcessesThatTrain) {
  // Writes a 4-rank job with gpu-slow on rank 2 into the store at `path`; returns its ranks' pids.
  auto write = [](const std::string& path, const std::string& name, bool rank_env) -> Result<std::vector<uint32_t>> {
    synth::JobSpec sp;
    sp.job = name;
    sp.nodes = 1;
    sp.ranks_per_node = 4;
    sp.steps = 40;
    sp.fault = synth::Fault::kGpuSlow;
    sp.fault_param = 3;  // the device 3x slower
    sp.fault_rank = 2;
    sp.fault_start_step = 20;
    sp.rank_env = rank_env;
    sp.t0_ns = 1'700'000'000'000'000'000ull;
    synth::Job job(sp);
    std::vector<uint32_t> pids;
    for (int r = 0; r < 4; ++r) pids.push_back(job.pid(r));
    auto st = store::Store::open_sqlite(path, store::Store::Mode::kCreateOrAppend);
    if (!st) return st.error();
    if (auto written = write_agents(job, **st); !written) return written.error();
    return pids;
  };
  auto load = [](const std::string& path, const std::string& job) -> Result<JobWindow> {
    auto st = store::Store::open_sqlite(path, store::Store::Mode::kReadOnly);
    if (!st) return st.error();
    LoadOptions lo;
    lo.job = job;
    lo.all_recordings = true;
    return load_job_window(**st, lo);
  };
  test::TempDir dir;
  auto pids = write(dir.file("spawned.db"), "spawned", false);
  ASSERT_TRUE(pids) << pids.error().message;
  auto spawned = load(dir.file("spawned.db"), "");
  ASSERT_TRUE(spawned) << spawned.error().message;
  ASSERT_EQ(spawned->ranks.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    EXPECT_EQ(spawned->ranks[r].rank, static_cast<int>(r));
    EXPECT_EQ(spawned->ranks[r].pid, (*pids)[r]) << "ranks are numbered in start order, then pid order";
  }
  const std::string name = "python3-" + std::to_string((*pids)[0] - 1);
  EXPECT_EQ(spawned->job, name) << "named after the launcher";
  ASSERT_FALSE(spawned->data_notes.empty());
  EXPECT_NE(spawned->data_notes[0].find("has a RANK in its environment"), std::string::npos) << spawned->data_notes[0];
  EXPECT_NE(spawned->data_notes[0].find("rank 0 = pid " + std::to_string((*pids)[0])), std::string::npos)
      << spawned->data_notes[0];
  auto dx = diagnose(*spawned);
  ASSERT_FALSE(dx.findings.empty()) << text_of(dx);
  ASSERT_TRUE(write(dir.file("env.db"), "spawned", true));
  auto with_env = load(dir.file("env.db"), "");
  ASSERT_TRUE(with_env) << with_env.error().message;
  auto dx_env = diagnose(*with_env);
  ASSERT_FALSE(dx_env.findings.empty()) << text_of(dx_env);
  EXPECT_EQ(dx.findings[0].rank, 2) << text_of(dx);
  EXPECT_EQ(dx.findings[0].rank, dx_env.findings[0].rank);
  EXPECT_EQ(dx.findings[0].cause, dx_env.findings[0].cause) << text_of(dx) << text_of(dx_env);

  // Beside a job whose ranks have a RANK (one node's agent watches both): each is a job of its own.
  ASSERT_TRUE(write(dir.file("both.db"), "launched", true));
  ASSERT_TRUE(write(dir.file("both.db"), "spawned", false));
  auto both = load(dir.file("both.db"), name);
  ASSERT_TRUE(both) << both.error().message;
  EXPECT_EQ(both->ranks.size(), 4u);
  auto launched = load(dir.file("both.db"), "launched");
  ASSERT_TRUE(launched) << launched.error().message;
  EXPECT_EQ(launched->ranks.size(), 4u);
}

// A gloo job (PyTorch DDP on the CPU) written as the agent writes it: one all-reduce per step,
// recorded when it returns (no communicator id, numbered per op), metric windows of 5 s while the
// processes live, and the calls each rank is inside at a window's end (store::kInFlightMetric).
struct GlooJob {
  static constexpr int kRanks = 4;
  static constexpr uint64_t kT0 = 1'700'000'000'000'000'000ull;
  static constexpr uint64_t kStep = 500'000'000;     // 0.5 s
  static constexpr uint64_t kWindow = 5'000'000'000;  // 5 s
  int steps = 30;        // steps every rank completes
  int hung = -1;         // this rank never enters the next all-reduce; the others wait inside it
  double tail_s = 20;    // how long the processes run on after the last step, alive
  // A long all-reduce that returned: the rank was inside it at this window's end (an older row).
  int returned_in_window = -1;
  // The latest window reports the last all-reduce in flight, which returned and was recorded too
  // (it returned between the window's end and the agent's read of the calls in flight).
  bool returned_in_last_window = false;

  uint64_t pid(int rank) const { return 4000 + static_cast<uint64_t>(rank); }
  uint64_t step_end(int k) const { return kT0 + static_cast<uint64_t>(k) * kStep; }  // step k: 1..

  void write(store::Store& s) const {
    auto rec = s.begin_recording({"n0", "strata record -- torchrun train.py", kT0, 99, 5});
    ASSERT_TRUE(rec) << rec.error().message;
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_TRUE(s.put_process(*rec, test::rank_process(static_cast<uint32_t>(pid(r)), r, kRanks, kT0 - 10'000'000'000ull)));
    }
    std::vector<store::StepRecord> steps_out;
    std::vector<store::CollectiveRecord> colls;
    for (int r = 0; r < kRanks; ++r) {
      for (int k = 1; k <= steps; ++k) {
        store::StepRecord st;
        st.pid = static_cast<uint32_t>(pid(r));
        st.step = static_cast<uint64_t>(k);
        st.start_ns = step_end(k - 1);
        st.end_ns = step_end(k);
        st.collective_ns = 100'000'000;
        steps_out.push_back(st);
        store::CollectiveRecord c;
        c.pid = st.pid;
        c.tid = st.pid + 100;
        c.library = "gloo";
        c.op = "allreduce";
        c.seq = static_cast<uint64_t>(k);
        c.enter_ns = st.end_ns - 100'000'000;
        c.exit_ns = st.end_ns;
        c.completion = "host";
        colls.push_back(c);
      }
    }
    ASSERT_TRUE(s.put_steps(*rec, steps_out));
    ASSERT_TRUE(s.put_collectives(*rec, colls));
    const uint64_t until = step_end(steps) + static_cast<uint64_t>(tail_s * 1e9);
    int wi = 0;
    for (uint64_t w = kT0; w < until; w += kWindow, ++wi) {
      std::vector<store::Metric> m;
      for (int r = 0; r < kRanks; ++r) {
        const uint32_t p = static_cast<uint32_t>(pid(r));
        m.push_back({p, "os.cpu_time_us", "", 2e6});
        const uint64_t entered = step_end(steps) + 1'000'000;  // the next all-reduce, entered
        if (hung >= 0 && r != hung && w + kWindow > entered) {
          m.push_back({p, store::kInFlightMetric,
                       store::in_flight_label({"gloo", "allreduce", "", static_cast<uint64_t>(steps + 1)}),
                       static_cast<double>(w + kWindow - entered) / 1e9});
        }
        if (wi == returned_in_window)
          m.push_back({p, store::kInFlightMetric, store::in_flight_label({"gloo", "allreduce", "", 3}), 1.5});
        if (returned_in_last_window && w + kWindow >= until)
          m.push_back({p, store::kInFlightMetric, store::in_flight_label({"gloo", "allreduce", "", static_cast<uint64_t>(steps)}),
                       static_cast<double>(w + kWindow - (step_end(steps) - 100'000'000)) / 1e9});
      }
      ASSERT_TRUE(s.put_metrics(*rec, w, w + kWindow, m));
    }
    ASSERT_TRUE(s.end_recording(*rec, until));
  }
};

Result<JobWindow> load_gloo(const GlooJob& g, test::TempDir& dir, const std::string& name) {
  auto st = store::Store::open_sqlite(dir.file(name), store::Store::Mode::kCreateOrAppend);
  if (!st) return st.error();
  g.write(**st);
  return load_job_window(**st);
}

// The measured false hang, through the store: a gloo job that completed its 30 steps (every rank's
// last call, allreduce #30, returned) and whose processes run on for 20 s (teardown), no call in
// flight. Its ranks are outside every collective: no hang, no finding.
TEST(DiagnoseHangStore, GlooTeardownAfterTheLastCallIsNoHang) {
  test::TempDir dir;
  GlooJob g;
  auto jw = load_gloo(g, dir, "teardown.db");
  ASSERT_TRUE(jw) << jw.error().message;
  ASSERT_EQ(jw->ranks.size(), 4u);
  for (const auto& r : jw->ranks) {
    EXPECT_TRUE(r.alive) << "rank " << r.rank;
    ASSERT_EQ(r.comms.size(), 1u);
    EXPECT_EQ(r.comms[0].last_seq, 30u);
    EXPECT_TRUE(r.comms[0].last_completed);
    EXPECT_FALSE(r.comms[0].in_flight);
    EXPECT_TRUE(r.in_flight.empty());
  }
  ASSERT_GE(jw->observed_until_ns - g.step_end(30), 15'000'000'000u);  // 15+ s without a collective
  auto dx = diagnose(*jw);
  EXPECT_TRUE(dx.findings.empty()) << text_of(dx);
}

// A call in flight in an older window, absent from the latest one, returned: not in flight now.
TEST(DiagnoseHangStore, OnlyTheLatestWindowSaysWhatARankIsInside) {
  test::TempDir dir;
  GlooJob g;
  g.returned_in_window = 1;
  auto jw = load_gloo(g, dir, "returned.db");
  ASSERT_TRUE(jw) << jw.error().message;
  for (const auto& r : jw->ranks) {
    EXPECT_TRUE(r.in_flight.empty()) << "rank " << r.rank;
    ASSERT_EQ(r.comms.size(), 1u) << "rank " << r.rank;
    EXPECT_FALSE(r.comms[0].in_flight) << "rank " << r.rank;
  }
  EXPECT_TRUE(diagnose(*jw).findings.empty());

  // ... and a call in flight at the latest window that was also recorded returning (the same
  // number, #30) returned: the rank is outside every collective.
  GlooJob late;
  late.returned_in_last_window = true;
  auto jl = load_gloo(late, dir, "returned-late.db");
  ASSERT_TRUE(jl) << jl.error().message;
  for (const auto& r : jl->ranks) {
    EXPECT_EQ(r.in_flight.size(), 1u) << "rank " << r.rank;
    ASSERT_EQ(r.comms.size(), 1u) << "rank " << r.rank;
    EXPECT_FALSE(r.comms[0].in_flight) << "rank " << r.rank;
    EXPECT_TRUE(r.comms[0].last_completed) << "rank " << r.rank;
  }
  EXPECT_TRUE(diagnose(*jl).findings.empty()) << text_of(diagnose(*jl));
}

// A gloo hang: rank 2 never enters allreduce #31; ranks 0, 1, 3 entered it and are inside it at
// every window's end since (in flight). The loader gives them #31 entered, not completed, in flight;
// the hang names rank 2, alive and inside no collective.
TEST(DiagnoseHangStore, GlooHangSeenInFlightThroughTheLoader) {
  test::TempDir dir;
  GlooJob g;
  g.hung = 2;
  auto jw = load_gloo(g, dir, "hang.db");
  ASSERT_TRUE(jw) << jw.error().message;
  for (const auto& r : jw->ranks) {
    ASSERT_EQ(r.comms.size(), 1u) << "rank " << r.rank;
    const CommProgress& p = r.comms[0];
    EXPECT_EQ(p.comm, "");
    EXPECT_EQ(p.last_seq, r.rank == 2 ? 30u : 31u) << "rank " << r.rank;
    EXPECT_EQ(p.last_completed, r.rank == 2) << "rank " << r.rank;
    EXPECT_EQ(p.in_flight, r.rank != 2) << "rank " << r.rank;
    if (r.rank != 2) {
      ASSERT_EQ(r.in_flight.size(), 1u);
      EXPECT_EQ(r.in_flight[0].library, "gloo");
      EXPECT_EQ(r.in_flight[0].op, "allreduce");
      EXPECT_EQ(r.in_flight[0].seq, 31u);
      // Entered 1 ms after the last step's end, as written (within the seconds' rounding).
      const int64_t off = static_cast<int64_t>(r.in_flight[0].entered_ns) - static_cast<int64_t>(g.step_end(30) + 1'000'000);
      EXPECT_LT(std::llabs(off), 1000) << off;
    }
  }
  auto dx = diagnose(*jw);
  const Finding* f = nullptr;
  for (const auto& x : dx.findings) {
    if (std::string(cause_name(x.cause)) == "hang") f = &x;
  }
  ASSERT_NE(f, nullptr) << text_of(dx);
  EXPECT_EQ(f->rank, 2) << text_of(dx);
  EXPECT_TRUE(has_evidence(*f, {"3 of 4 ranks are inside a collective"})) << text_of(dx);
  EXPECT_TRUE(has_evidence(*f, {"ranks [0,1,3] are inside a collective (the longest: allreduce #31",
                                "ranks [2] are inside none: they never entered it"}))
      << text_of(dx);
}

}  // namespace
}  // namespace strata::diagnose

namespace strata::diagnose {
namespace {

// A job without collectives (one process training alone, no torch.distributed) has no steps: the
// load says why, in words that name what steps come from, both for `strata diagnose FILE` (the
// latest stretch) and for a span. Before, it said only "no training step in the store".
TEST(DiagnoseHangStore, AStoreWithoutCollectivesSaysWhyItHasNoSteps) {
  test::TempDir dir;
  {
    auto st = store::Store::open_sqlite(dir.file("single.db"), store::Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    store::RecordingInfo info;
    info.node = "vm";
    info.command = "python3 single.py";
    info.started_ns = 1'700'000'000'000'000'000ull;
    auto rec = (*st)->begin_recording(info);
    ASSERT_TRUE(rec) << rec.error().message;
    store::ProcessInfo p;
    p.pid = 4242;
    p.node = "vm";
    p.comm = "python3";
    p.start_ns = info.started_ns;
    ASSERT_TRUE((*st)->put_process(*rec, p));
    ASSERT_TRUE((*st)->end_recording(*rec, info.started_ns + 30'000'000'000ull));
  }
  auto st = store::Store::open_sqlite(dir.file("single.db"), store::Store::Mode::kReadOnly);
  ASSERT_TRUE(st) << st.error().message;
  auto latest = load_latest_with_baseline(**st, LoadOptions{}, 60'000'000'000ull, 120'000'000'000ull);
  ASSERT_FALSE(latest);
  EXPECT_NE(latest.error().message.find("no recorded process called one"), std::string::npos) << latest.error().message;
  LoadOptions last;
  last.last_ns = 60'000'000'000ull;
  auto span = load_job_window(**st, last);
  ASSERT_FALSE(span);
  EXPECT_NE(span.error().message.find("no recorded process called one"), std::string::npos) << span.error().message;
}

}  // namespace
}  // namespace strata::diagnose
