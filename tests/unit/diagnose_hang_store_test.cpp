// A hang through the store and the loader: the synthetic multi-node job of `strata-sim agents`
// (testbed/synth) with one rank's GPU stopped, written as its agents would, then loaded and
// diagnosed. The loader gives each rank its collective progress (per communicator: calls, last
// sequence number, op, completion) and its stacks after the job's last progress; the hang finding
// names the hung rank and carries that evidence. Fails if the evidence is missing or names another
// rank.
#include <gtest/gtest.h>

#include <sstream>

#include "diagnose/engine.h"
#include "diagnose/loader.h"
#include "diagnose/render.h"
#include "store/store.h"
#include "testbed/synth/job.h"
#include "tests/support/run.h"

namespace strata::diagnose {
namespace {

std::string dump(const Diagnosis& dx) {
  std::ostringstream o;
  write_text(dx, o);
  return o.str();
}

bool has_evidence(const Finding& f, std::initializer_list<std::string> parts) {
  for (const auto& e : f.evidence) {
    bool all = true;
    for (const auto& p : parts) all &= e.find(p) != std::string::npos;
    if (all) return true;
  }
  return false;
}

TEST(DiagnoseHangStore, HungRankAndItsEvidenceThroughTheLoader) {
  for (int hung : {0, 5, 7}) {
    SCOPED_TRACE("hung rank " + std::to_string(hung));
    synth::JobSpec sp;
    sp.job = "hang-job";
    sp.nodes = 2;
    sp.ranks_per_node = 4;
    sp.steps = 40;
    sp.step_ms = 1000;
    sp.fault = synth::Fault::kHang;
    sp.fault_rank = hung;
    sp.fault_start_step = 20;  // 20 s of progress, then 20 s of stall
    sp.t0_ns = 1'700'000'000'000'000'000ull;
    synth::Job job(sp);
    test::TempDir dir;
    auto st = store::Store::open_sqlite(dir.file("s.db"), store::Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(st) << st.error().message;
    store::Store& s = **st;
    for (int node = 0; node < sp.nodes; ++node) {
      synth::Job::NodeWriter w(job, s, node);
      ASSERT_TRUE(w.begin(sp.t0_ns));
      for (size_t wi = 0; wi < job.windows().size(); ++wi) {
        ASSERT_TRUE(s.begin());
        auto ws = w.window(wi);
        ASSERT_TRUE(ws) << ws.error().message;
        ASSERT_TRUE(s.commit());
      }
      ASSERT_TRUE(w.end(job.windows().back().end_ns));
    }

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
    const Finding* f = nullptr;
    for (const auto& x : dx.findings) {
      if (std::string(cause_name(x.cause)) == "hang") f = &x;
    }
    ASSERT_NE(f, nullptr) << dump(dx);
    const std::string me = "rank " + std::to_string(hung);
    EXPECT_EQ(f->rank, hung) << dump(dx);
    EXPECT_TRUE(has_evidence(*f, {me + "'s last collective: allreduce #20 on communicator synth-hang-job", "completed"}))
        << dump(dx);
    std::string others;
    for (int i = 0; i < 8; ++i) {
      if (i != hung) others += (others.empty() ? "" : ",") + std::to_string(i);
    }
    EXPECT_TRUE(has_evidence(*f, {me + " never entered allreduce #21 on communicator synth-hang-job",
                                  "ranks [" + others + "] entered and wait in"}))
        << dump(dx);
    EXPECT_TRUE(has_evidence(*f, {me + " on-CPU since the job's last progress"})) << dump(dx);
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
  synth::Job::NodeWriter w(job, **st, 0);
  ASSERT_TRUE(w.begin(sp.t0_ns));
  for (size_t wi = 0; wi < job.windows().size(); ++wi) {
    ASSERT_TRUE((*st)->begin());
    ASSERT_TRUE(w.window(wi));
    ASSERT_TRUE((*st)->commit());
  }
  ASSERT_TRUE(w.end(job.windows().back().end_ns));
  auto jw = load_job_window(**st);
  ASSERT_TRUE(jw) << jw.error().message;
  for (const auto& r : jw->ranks) {
    EXPECT_TRUE(r.stall_oncpu.empty() && r.stall_offcpu.empty()) << "rank " << r.rank;
    ASSERT_EQ(r.comms.size(), 1u);
    EXPECT_TRUE(r.comms[0].last_completed);
  }
  auto dx = diagnose(*jw);
  EXPECT_TRUE(dx.findings.empty()) << dump(dx);
}

}  // namespace
}  // namespace strata::diagnose
