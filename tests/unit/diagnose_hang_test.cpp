// A hang's evidence (diagnose/engine.cpp's find_hang) on made-up jobs (diagnose/synthetic.h): the
// finding names the hung rank and carries its last collective (op, communicator, sequence number),
// which ranks never entered the call the job stopped in, and the hung rank's stacks in the stall.
// And the hardware findings cite the Xid the driver reported (gpu.xid).
#include <gtest/gtest.h>

#include <sstream>

#include "diagnose/engine.h"
#include "diagnose/render.h"
#include "diagnose/synthetic.h"

namespace strata::diagnose {
namespace {

// The piece of evidence that contains every one of `parts`, or "" when none does.
std::string evidence_with(const Finding& f, std::initializer_list<std::string> parts) {
  for (const auto& e : f.evidence) {
    bool all = true;
    for (const auto& p : parts) all &= e.find(p) != std::string::npos;
    if (all) return e;
  }
  return "";
}

const Finding* hang_of(const Diagnosis& dx) {
  for (const auto& f : dx.findings) {
    if (std::string(cause_name(f.cause)) == "hang") return &f;
  }
  return nullptr;
}

struct Shape {
  size_t ranks;
  int hung;
  unsigned seed;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (size_t n : {4u, 8u, 16u}) {
    for (int hung : {0, static_cast<int>(n / 2) - 1, static_cast<int>(n) - 1}) {
      for (unsigned seed : {1u, 7u}) out.push_back({n, hung, seed});
    }
  }
  return out;
}

// The GPU of one rank stopped: every rank entered the next all-reduce, none completed it, the hung
// rank's GPU finished its work first; every host waits for its stream.
TEST(DiagnoseHang, GpuHangCarriesTheLastCollectiveAndTheStacks) {
  for (const Shape& sh : shapes()) {
    SCOPED_TRACE(std::to_string(sh.ranks) + " ranks, hung " + std::to_string(sh.hung) + ", seed " + std::to_string(sh.seed));
    SyntheticSpec spec;
    spec.ranks = sh.ranks;
    spec.seed = sh.seed;
    spec.faults = {{sh.hung, "hang", 40}};
    auto dx = diagnose(make_synthetic_job(spec));
    const Finding* f = hang_of(dx);
    ASSERT_NE(f, nullptr) << text_of(dx);
    const std::string me = "rank " + std::to_string(sh.hung);
    EXPECT_EQ(f->rank, sh.hung) << text_of(dx);
    EXPECT_EQ(f->layer, "gpu") << text_of(dx);
    EXPECT_NE(evidence_with(*f, {me + "'s last collective: allreduce #1201 on communicator synthetic-comm",
                                 "entered and never completed"}),
              "")
        << text_of(dx);
    EXPECT_NE(evidence_with(*f, {"all " + std::to_string(sh.ranks) + " ranks of communicator synthetic-comm entered allreduce #1201",
                                 "none completed it"}),
              "")
        << text_of(dx);
    EXPECT_NE(evidence_with(*f, {me + " off-CPU", "cudaStreamSynchronize;futex()", "30.0 s"}), "") << text_of(dx);
    EXPECT_NE(evidence_with(*f, {me + " ran no sampled on-CPU code"}), "") << text_of(dx);
  }
}

// A host-side hang without a device timeline: the hung rank never entered the all-reduce its peers
// wait in. Every rank's last progress is the same instant, so only the collective's sequence
// numbers single it out; its stacks say where it is stuck.
TEST(DiagnoseHang, HostHangNamesTheRankThatNeverEnteredTheCollective) {
  for (const Shape& sh : shapes()) {
    SCOPED_TRACE(std::to_string(sh.ranks) + " ranks, hung " + std::to_string(sh.hung) + ", seed " + std::to_string(sh.seed));
    SyntheticSpec spec;
    spec.ranks = sh.ranks;
    spec.seed = sh.seed;
    PlantedFault pf{sh.hung, "hang", 40};
    pf.on_host = true;
    spec.faults = {pf};
    auto dx = diagnose(make_synthetic_job(spec));
    const Finding* f = hang_of(dx);
    ASSERT_NE(f, nullptr) << text_of(dx);
    const std::string me = "rank " + std::to_string(sh.hung);
    EXPECT_EQ(f->rank, sh.hung) << text_of(dx);
    EXPECT_EQ(f->layer, "comm") << text_of(dx);
    EXPECT_GE(f->confidence, 0.8) << text_of(dx);
    EXPECT_NE(evidence_with(*f, {me + "'s last collective: allreduce #1200 on communicator synthetic-comm", "completed"}), "")
        << text_of(dx);
    std::vector<int> others;
    for (int i = 0; i < static_cast<int>(sh.ranks); ++i) {
      if (i != sh.hung) others.push_back(i);
    }
    std::string list;
    for (size_t i = 0; i < others.size(); ++i) list += (i ? "," : "") + std::to_string(others[i]);
    EXPECT_NE(evidence_with(*f, {me + " never entered allreduce #1201 on communicator synthetic-comm",
                                 "its last call there is #1200", "ranks [" + list + "] entered and wait in"}),
              "")
        << text_of(dx);
    EXPECT_NE(evidence_with(*f, {me + " on-CPU", "load_batch;decode_sample", "24.0 s"}), "") << text_of(dx);
    EXPECT_NE(evidence_with(*f, {me + " off-CPU", "queue_get;futex()"}), "") << text_of(dx);
  }
}

// Two ranks that never entered it, of eight: both are listed; the culprit is one of them.
TEST(DiagnoseHang, EveryRankThatNeverEnteredIsListed) {
  SyntheticSpec spec;
  PlantedFault pf{5, "hang", 40};
  pf.on_host = true;
  spec.faults = {pf};
  JobWindow job = make_synthetic_job(spec);
  job.ranks[2].comms.front() = job.ranks[5].comms.front();  // rank 2 stopped at the same call
  auto dx = diagnose(job);
  const Finding* f = hang_of(dx);
  ASSERT_NE(f, nullptr) << text_of(dx);
  ASSERT_TRUE(f->rank == 2 || f->rank == 5) << text_of(dx);
  int other = f->rank == 2 ? 5 : 2;
  EXPECT_NE(evidence_with(*f, {"never entered allreduce #1201", "ranks [0,1,3,4,6,7] entered and wait in",
                               "ranks [" + std::to_string(other) + "] never entered it either"}),
            "")
      << text_of(dx);
}

// Without collective records nothing shows a rank inside a collective, and a job without progress
// is no hang by that alone (a checkpoint idles the GPUs too). Hosts that have waited in a CUDA
// synchronize for longer than the hang bound (the agent saw it in flight) wait for device work
// that does not finish: a hang; the finding says no collective was recorded, and still names the
// rank from the device timeline.
TEST(DiagnoseHang, WithoutCollectivesTheFindingSaysSo) {
  SyntheticSpec spec;
  spec.faults = {{3, "hang", 40}};
  JobWindow job = make_synthetic_job(spec);
  for (auto& r : job.ranks) {
    r.comms.clear();
    r.stall_oncpu.clear();
    r.stall_offcpu.clear();
  }
  auto dx = diagnose(job);
  EXPECT_EQ(hang_of(dx), nullptr) << text_of(dx);
  for (auto& r : job.ranks)
    r.in_flight.push_back({"cuda", "cudaStreamSynchronize", "", 0, job.end_ns + 20'000'000, job.observed_until_ns});
  dx = diagnose(job);
  const Finding* f = hang_of(dx);
  ASSERT_NE(f, nullptr) << text_of(dx);
  EXPECT_EQ(f->rank, 3) << text_of(dx);
  EXPECT_NE(evidence_with(*f, {"no collective call of rank 3 was recorded"}), "") << text_of(dx);
  EXPECT_NE(evidence_with(*f, {"no stacks of rank 3 were recorded in the stall"}), "") << text_of(dx);
}

// A finished job's teardown (the measured false hang: a DDP job's 150 steps done, every rank
// completed allreduce #150, then 14 s of teardown on a loaded machine): every rank completed its
// last call and runs on for 30 s without a collective, alive. Outside every collective: no hang,
// and (30 s is far below kStalledOutsideNoteS) no note either.
TEST(DiagnoseHang, TeardownAfterTheLastCallIsNoHang) {
  for (bool gloo : {false, true}) {
    SCOPED_TRACE(gloo ? "gloo (no communicator id)" : "nccl");
    SyntheticSpec spec;
    PlantedFault pf{1, "hang", 40};
    pf.on_host = true;
    spec.faults = {pf};
    JobWindow job = make_synthetic_job(spec);
    for (auto& r : job.ranks) {
      r.comms.front() = job.ranks[1].comms.front();  // every rank completed #1200, its last call
      if (gloo) r.comms.front().comm.clear();
      r.stall_oncpu = {{job.names.id("main;destroy_process_group;~ProcessGroupGloo;join"), 5'000}};
      r.stall_offcpu = {{job.names.id("main;_shutdown;futex()"), 25'000}};
    }
    if (gloo) job.communicator.clear();
    ASSERT_GE(job.observed_until_ns - job.end_ns, 15'000'000'000u);
    auto dx = diagnose(job);
    EXPECT_EQ(hang_of(dx), nullptr) << text_of(dx);
    EXPECT_TRUE(dx.findings.empty()) << text_of(dx);
    EXPECT_EQ(dx.note, "") << text_of(dx);
  }
}

// A checkpoint mid-job: every rank completed its calls and writes its shard for a minute, on-CPU
// in its own code. No rank is inside a collective: no hang. Only a stall past the named bound
// (kStalledOutsideNoteS, 10 min) gets a note, never a finding, with where the threads are.
TEST(DiagnoseHang, CheckpointStallMidJobIsNoHang) {
  SyntheticSpec spec;
  JobWindow job = make_synthetic_job(spec);
  const NameId save = job.names.id("main;train;save_checkpoint;torch.save;_write;write");
  for (auto& r : job.ranks) {
    ASSERT_TRUE(r.comms.front().last_completed);
    r.stall_oncpu = {{save, 55'000}};
  }
  job.observed_until_ns = job.end_ns + 60'000'000'000;  // a minute without a collective
  auto dx = diagnose(job);
  EXPECT_EQ(hang_of(dx), nullptr) << text_of(dx);
  EXPECT_TRUE(dx.findings.empty()) << text_of(dx);
  EXPECT_EQ(dx.note, "") << text_of(dx);

  job.observed_until_ns = job.end_ns + 700'000'000'000;  // past 10 min: worth a note
  dx = diagnose(job);
  EXPECT_EQ(hang_of(dx), nullptr) << text_of(dx);
  EXPECT_TRUE(dx.findings.empty()) << text_of(dx);
  EXPECT_NE(dx.note.find("no collective for 700 s while 8 of 8 rank processes are alive, none inside a collective"),
            std::string::npos)
      << text_of(dx);
  EXPECT_NE(dx.note.find("not hung in a collective"), std::string::npos) << text_of(dx);
  EXPECT_NE(dx.note.find("rank 0 runs ...;save_checkpoint;torch.save;_write;write"), std::string::npos) << text_of(dx);

  // The same minute with the ranks waiting inside the next all-reduce: that is a hang.
  job.observed_until_ns = job.end_ns + 60'000'000'000;
  for (auto& r : job.ranks) {
    CommProgress& p = r.comms.front();
    p.last_seq += 1;
    p.last_completed = false;
    p.in_flight = true;
    p.last_enter_ns = job.end_ns + 1'000'000;
  }
  dx = diagnose(job);
  ASSERT_NE(hang_of(dx), nullptr) << text_of(dx);
  EXPECT_EQ(dx.note, "") << text_of(dx);
}

// gloo: calls are recorded when they return and carry no communicator id. The ranks that entered
// the next all-reduce are seen inside it by the agent (in flight at the latest window); the hung
// rank is inside no collective: it never entered it, and it is the culprit.
TEST(DiagnoseHang, GlooHangSeenInFlightNamesTheRankOutside) {
  for (int hung : {0, 3, 7}) {
    SCOPED_TRACE("hung " + std::to_string(hung));
    SyntheticSpec spec;
    PlantedFault pf{hung, "hang", 40};
    pf.on_host = true;
    spec.faults = {pf};
    JobWindow job = make_synthetic_job(spec);
    job.communicator.clear();
    for (auto& r : job.ranks) {
      CommProgress& p = r.comms.front();
      p.comm.clear();
      if (r.rank != hung) {
        p.in_flight = true;  // gloo: entered, never returned, seen in flight
        r.in_flight.push_back({"gloo", "allreduce", "", p.last_seq, p.last_enter_ns, job.observed_until_ns});
      }
    }
    auto dx = diagnose(job);
    const Finding* f = hang_of(dx);
    ASSERT_NE(f, nullptr) << text_of(dx);
    const std::string me = "rank " + std::to_string(hung);
    EXPECT_EQ(f->rank, hung) << text_of(dx);
    EXPECT_EQ(f->layer, "comm") << text_of(dx);
    EXPECT_GE(f->confidence, 0.7) << text_of(dx);
    EXPECT_NE(evidence_with(*f, {"no collective completed for 30.0 s", "7 of 8 ranks are inside a collective, the longest for 30.0 s"}), "")
        << text_of(dx);
    EXPECT_NE(evidence_with(*f, {"(the longest: allreduce #1201", "ranks [" + std::to_string(hung) +
                                 "] are inside none: they never entered it"}),
              "")
        << text_of(dx);
    EXPECT_NE(evidence_with(*f, {me + " on-CPU", "load_batch;decode_sample"}), "") << text_of(dx);
    // Its own last call completed; a peer's is the one still inside.
    EXPECT_NE(evidence_with(*f, {me + "'s last collective: allreduce #1200", "completed"}), "") << text_of(dx);
  }
}

// NCCL without a device timeline: completion is not observable. A rank counts as inside its last
// call only when its host has waited in a CUDA synchronize since it entered the call (the agent
// saw the synchronize in flight); without that, nothing says the job is inside a collective.
TEST(DiagnoseHang, WithoutCompletionTheHostWaitingInASynchronizeIsTheEvidence) {
  SyntheticSpec spec;
  spec.faults = {{2, "hang", 40}};
  JobWindow job = make_synthetic_job(spec);
  for (auto& r : job.ranks) {
    r.comms.front().completed = 0;  // no device timeline: no call was ever seen completing
    r.last_device_ns = 0;
  }
  auto dx = diagnose(job);
  EXPECT_EQ(hang_of(dx), nullptr) << text_of(dx);
  for (auto& r : job.ranks) {
    r.in_flight.push_back({"cuda", "cudaStreamSynchronize", "", 0, r.comms.front().last_enter_ns + 2'000'000, job.observed_until_ns});
  }
  dx = diagnose(job);
  ASSERT_NE(hang_of(dx), nullptr) << text_of(dx);
  EXPECT_NE(evidence_with(*hang_of(dx), {"8 of 8 ranks are inside a collective"}), "") << text_of(dx);
}

// A hang that a watchdog ended: every rank ran on inside the collective for longer than the hang
// threshold, then exited (NCCL's watchdog aborts the process). Still a hang, on the same rank.
TEST(DiagnoseHang, HangEndedByAWatchdogIsStillAHang) {
  SyntheticSpec spec;
  spec.faults = {{4, "hang", 40}};
  JobWindow job = make_synthetic_job(spec);
  for (auto& r : job.ranks) {
    r.alive = false;
    r.last_seen_ns = job.end_ns + 20'000'000'000;  // seen 20 s into the stall, gone since
  }
  auto dx = diagnose(job);
  const Finding* f = hang_of(dx);
  ASSERT_NE(f, nullptr) << text_of(dx);
  EXPECT_EQ(f->rank, 4) << text_of(dx);
  EXPECT_NE(evidence_with(*f, {"8 of 8 rank processes ran on for 10 s or more without progress, then exited",
                               "8 of 8 ranks are inside a collective, the longest for 30.0 s"}),
            "")
      << text_of(dx);
}

// ... but a job that ended normally (every call completed) and whose ranks took long to exit (a
// final checkpoint), or one where completion cannot be seen, is no hang once its ranks are gone.
TEST(DiagnoseHang, ExitedRanksWithoutAStuckCollectiveAreNoHang) {
  {
    JobWindow job = make_synthetic_job(SyntheticSpec{});
    job.observed_until_ns = job.end_ns + 30'000'000'000;
    for (auto& r : job.ranks) {
      r.alive = false;
      r.last_seen_ns = job.end_ns + 20'000'000'000;
    }
    auto dx = diagnose(job);
    EXPECT_EQ(hang_of(dx), nullptr) << text_of(dx);
  }
  {
    SyntheticSpec spec;
    spec.faults = {{4, "hang", 40}};
    JobWindow job = make_synthetic_job(spec);
    for (auto& r : job.ranks) {
      r.alive = false;
      r.last_seen_ns = job.end_ns + 20'000'000'000;
      r.comms.front().completed = 0;  // no device timeline for NCCL: completion is never seen
    }
    auto dx = diagnose(job);
    EXPECT_EQ(hang_of(dx), nullptr) << text_of(dx);
  }
  {
    // Gone before the threshold: they exited, they were not stuck for hang_s.
    SyntheticSpec spec;
    spec.faults = {{4, "hang", 40}};
    JobWindow job = make_synthetic_job(spec);
    for (auto& r : job.ranks) {
      r.alive = false;
      r.last_seen_ns = job.end_ns + 5'000'000'000;
    }
    auto dx = diagnose(job);
    EXPECT_EQ(hang_of(dx), nullptr) << text_of(dx);
  }
}

// A healthy job's collectives and (absent) stall stacks make no finding.
TEST(DiagnoseHang, HealthyJobWithCollectivesHasNoFinding) {
  for (unsigned seed = 1; seed <= 10; ++seed) {
    SyntheticSpec spec;
    spec.seed = seed;
    auto dx = diagnose(make_synthetic_job(spec));
    EXPECT_TRUE(dx.findings.empty()) << text_of(dx);
  }
}

// The hardware findings cite the driver's Xid when one was reported (gpu.xid), and an Xid alone
// (the counters not read, or not yet climbed) is the cause's evidence.
TEST(DiagnoseHang, HardwareFindingsCiteTheXid) {
  {
    SyntheticSpec spec;
    spec.faults = {{3, "gpu-lost", 40}};
    auto dx = diagnose(make_synthetic_job(spec));
    ASSERT_EQ(dx.findings.size(), 1u) << text_of(dx);
    const Finding& f = dx.findings[0];
    EXPECT_EQ(std::string(cause_name(f.cause)), "gpu-lost") << text_of(dx);
    EXPECT_EQ(f.rank, 3);
    EXPECT_NE(evidence_with(f, {"Xid 79", "rank 3's GPU 3", "gpu.xid"}), "") << text_of(dx);
    // The hang it causes brings its collective and stacks along.
    EXPECT_NE(evidence_with(f, {"the job hangs"}), "") << text_of(dx);
    EXPECT_NE(evidence_with(f, {"rank 3's last collective: allreduce #1201"}), "") << text_of(dx);
  }
  {
    SyntheticSpec spec;
    spec.faults = {{2, "gpu-memory-errors", 40}};
    auto dx = diagnose(make_synthetic_job(spec));
    ASSERT_EQ(dx.findings.size(), 1u) << text_of(dx);
    EXPECT_NE(evidence_with(dx.findings[0], {"Xid 48", "double-bit ECC", "rank 2's GPU 2", "gpu.xid"}), "") << text_of(dx);
  }
  struct Alone {
    unsigned xid;
    const char* cause;
  };
  for (Alone a : {Alone{79, "gpu-lost"}, Alone{48, "gpu-memory-errors"}, Alone{94, "gpu-memory-errors"},
                  Alone{74, "nvlink-degraded"}}) {
    SCOPED_TRACE(a.xid);
    JobWindow job = make_synthetic_job(SyntheticSpec{});
    job.ranks[6].gpu.xids = {a.xid};
    auto dx = diagnose(job);
    ASSERT_EQ(dx.findings.size(), 1u) << text_of(dx);
    EXPECT_EQ(dx.findings[0].rank, 6) << text_of(dx);
    EXPECT_EQ(std::string(cause_name(dx.findings[0].cause)), a.cause) << text_of(dx);
    EXPECT_NE(evidence_with(dx.findings[0], {"Xid " + std::to_string(a.xid), "gpu.xid"}), "") << text_of(dx);
  }
  // An Xid no rule knows (13: a graphics engine exception, the application's) is no hardware finding.
  JobWindow job = make_synthetic_job(SyntheticSpec{});
  job.ranks[6].gpu.xids = {13};
  auto dx = diagnose(job);
  EXPECT_TRUE(dx.findings.empty()) << text_of(dx);
}

}  // namespace
}  // namespace strata::diagnose
