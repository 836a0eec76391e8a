// Peers by parallel role (diagnose/peer_groups.h): groups from communicator membership and traffic
// for pipeline/tensor/data parallel layouts, and the engine comparing a rank with its own stage only.
#include <gtest/gtest.h>

#include <sstream>

#include "diagnose/cause.h"
#include "diagnose/engine.h"
#include "diagnose/peer_groups.h"
#include "diagnose/render.h"
#include "diagnose/synthetic.h"

namespace strata::diagnose {
namespace {

// A job laid out as strata-sim's --pp/--tp (Megatron's order: TP position fastest, then the DP
// replica, then the stage), with the communicators torch would make and what it does on them.
struct Layout {
  int pp = 1, tp = 1, dp = 1;
  bool world_allreduce = true;  // the world's communicator carries a collective across stages
  bool pairwise_p2p = false;    // torch's per-pair 2-rank communicators for send/recv
  bool split = false;           // groups made by ncclCommSplit: positions not recorded (-1)
  size_t n() const { return static_cast<size_t>(pp * tp * dp); }
  size_t rank(int p, int d, int t) const { return static_cast<size_t>((p * dp + d) * tp + t); }
};

struct Recorded {
  std::vector<CommMembership> members;
  CommTraffic traffic;
};

Recorded record(const Layout& l) {
  Recorded out;
  auto add = [&](const std::string& id, const std::vector<size_t>& ranks) {
    const bool unknown = l.split && id != "world";
    for (size_t i = 0; i < ranks.size(); ++i)
      out.members.push_back({ranks[i], id, unknown ? -1 : static_cast<int>(i), unknown ? 0 : static_cast<int>(ranks.size())});
  };
  std::vector<size_t> world;
  for (size_t g = 0; g < l.n(); ++g) world.push_back(g);
  add("world", world);
  if (l.world_allreduce) out.traffic.collective_comms.push_back("world");
  for (int p = 0; p < l.pp; ++p) {
    for (int d = 0; d < l.dp; ++d) {
      std::vector<size_t> tp;
      for (int t = 0; t < l.tp; ++t) tp.push_back(l.rank(p, d, t));
      if (l.tp > 1) {
        std::string id = "tp" + std::to_string(p) + "." + std::to_string(d);
        add(id, tp);
        out.traffic.collective_comms.push_back(id);
      }
    }
    for (int t = 0; t < l.tp && l.dp > 1; ++t) {
      std::vector<size_t> dp;
      for (int d = 0; d < l.dp; ++d) dp.push_back(l.rank(p, d, t));
      std::string id = "dp" + std::to_string(p) + "." + std::to_string(t);
      add(id, dp);
      out.traffic.collective_comms.push_back(id);
    }
  }
  for (int d = 0; d < l.dp && l.pp > 1; ++d) {
    for (int t = 0; t < l.tp; ++t) {
      if (l.pairwise_p2p) {
        for (int p = 0; p + 1 < l.pp; ++p) {
          std::string id = "p2p" + std::to_string(d) + "." + std::to_string(t) + "." + std::to_string(p);
          size_t lo = l.rank(p, d, t), hi = l.rank(p + 1, d, t);
          add(id, {lo, hi});
          out.traffic.p2p.push_back({lo, id, 1});
          out.traffic.p2p.push_back({hi, id, 0});
        }
        continue;
      }
      std::vector<size_t> pp;
      for (int p = 0; p < l.pp; ++p) pp.push_back(l.rank(p, d, t));
      std::string id = "pp" + std::to_string(d) + "." + std::to_string(t);
      add(id, pp);
      for (int p = 0; p < l.pp; ++p) {
        if (p + 1 < l.pp) out.traffic.p2p.push_back({pp[static_cast<size_t>(p)], id, p + 1});  // send
        if (p > 0) out.traffic.p2p.push_back({pp[static_cast<size_t>(p)], id, p - 1});         // recv
      }
    }
  }
  return out;
}

std::vector<int> groups(const Layout& l) {
  auto r = record(l);
  return peer_groups(l.n(), r.members, r.traffic);
}

TEST(PeerGroups, PipelineTwoByTensorTwo) {
  // Stage 0 = ranks 0,1 (TP siblings), stage 1 = ranks 2,3; the world's all-reduce spans stages
  // and says nothing about roles.
  EXPECT_EQ(groups({.pp = 2, .tp = 2}), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(groups({.pp = 2, .tp = 2, .world_allreduce = false}), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(groups({.pp = 2, .tp = 2, .pairwise_p2p = true}), (std::vector<int>{0, 0, 1, 1}));
}

TEST(PeerGroups, SplitCommunicatorsArePlacedInRankOrder) {
  // ncclCommSplit does not say a member's position: members are placed in rank order, which is
  // what the p2p peers' positions are resolved against.
  EXPECT_EQ(groups({.pp = 2, .tp = 2, .split = true}), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(groups({.pp = 4, .split = true}), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(groups({.pp = 2, .tp = 2, .dp = 2, .split = true}), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
}

TEST(PeerGroups, PipelineOnlyLeavesEveryStageAlone) {
  EXPECT_EQ(groups({.pp = 4}), (std::vector<int>{0, 1, 2, 3}));
  // Per-pair communicators: the middle stages hold the same multiset of roles (position 1 of one
  // pair, 0 of the next), yet do different work; they stay apart.
  EXPECT_EQ(groups({.pp = 4, .pairwise_p2p = true}), (std::vector<int>{0, 1, 2, 3}));
}

TEST(PeerGroups, ReplicasAndShardsOfAStageArePeers) {
  // pp=2 x dp=2 x tp=2: a stage's four ranks (two replicas of two shards) do the same work.
  EXPECT_EQ(groups({.pp = 2, .tp = 2, .dp = 2}), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(groups({.pp = 2, .dp = 3}), (std::vector<int>{0, 0, 0, 1, 1, 1}));
}

TEST(PeerGroups, WithoutPipelineEveryRankIsAPeer) {
  EXPECT_TRUE(groups({.dp = 8}).empty());          // data parallel only
  EXPECT_TRUE(groups({.tp = 2, .dp = 2}).empty());  // no point-to-point traffic
  EXPECT_TRUE(peer_groups(4, {}, {}).empty());      // nothing recorded (gloo, attached late)
  // Point-to-point calls on a communicator whose membership was never recorded: no roles known.
  CommTraffic t;
  t.p2p.push_back({0, "unknown", 1});
  EXPECT_TRUE(peer_groups(4, {}, t).empty());
}

// The engine on a made-up 2-stage x 2-TP job whose stage 1 computes kStageMs more per step by
// design (its stage 0 waits that much longer for it).
constexpr double kStageMs = 30;

JobWindow pipeline_job(std::vector<PlantedFault> faults, unsigned seed, bool grouped, size_t ranks = 4) {
  SyntheticSpec spec;
  spec.ranks = ranks;
  spec.seed = seed;
  spec.faults = std::move(faults);
  JobWindow job = make_synthetic_job(spec);
  for (size_t i = ranks / 2; i < ranks; ++i) {
    auto& r = job.ranks[i];
    double grow = (r.now.device_compute_ms + kStageMs) / r.now.device_compute_ms;
    for (auto& k : r.kernels) k.ms_per_step *= grow;
    r.now.device_compute_ms += kStageMs;
    r.now.wait_ms -= kStageMs;
    r.base.device_compute_ms += kStageMs;
    r.base.wait_ms -= kStageMs;
  }
  if (grouped) {
    for (size_t i = 0; i < ranks; ++i) job.peer_group.push_back(i < ranks / 2 ? 0 : 1);
  }
  return job;
}

TEST(DiagnosePeers, HealthyPipelineHasNoFindingWhenStagesAreComparedApart) {
  size_t flagged_without_roles = 0;
  for (unsigned seed = 1; seed <= 20; ++seed) {
    auto dx = diagnose(pipeline_job({}, seed, true));
    EXPECT_TRUE(dx.findings.empty()) << "seed " << seed << "\n" << text_of(dx);
    flagged_without_roles += diagnose(pipeline_job({}, seed, false)).findings.empty() ? 0 : 1;
  }
  // The same jobs compared rank against every rank blame stage 1's design: what the groups fix.
  EXPECT_GT(flagged_without_roles, 0u);
}

TEST(DiagnosePeers, FaultOnOneRankOfOneStageIsFound) {
  for (size_t culprit : {0u, 3u}) {
    for (unsigned seed = 1; seed <= 10; ++seed) {
      auto dx = diagnose(pipeline_job({{static_cast<int>(culprit), "gpu-slow", 40}}, seed, true));
      ASSERT_FALSE(dx.findings.empty()) << "seed " << seed << "\n" << text_of(dx);
      EXPECT_EQ(dx.findings.front().rank, static_cast<int>(culprit)) << text_of(dx);
      EXPECT_EQ(std::string(cause_name(dx.findings.front().cause)), "gpu-slow") << text_of(dx);
      EXPECT_EQ(dx.findings.size(), 1u) << text_of(dx);
    }
  }
}

TEST(DiagnosePeers, LargeStagesUseTheirOwnMedian) {
  // Two stages of 100 ranks (beyond the small-group comparison): healthy has no finding, a slow
  // GPU in either stage is found alone.
  for (unsigned seed = 1; seed <= 5; ++seed) {
    auto healthy = diagnose(pipeline_job({}, seed, true, 200));
    EXPECT_TRUE(healthy.findings.empty()) << text_of(healthy);
    for (int culprit : {7, 150}) {
      auto dx = diagnose(pipeline_job({{culprit, "gpu-slow", 40}}, seed, true, 200));
      ASSERT_FALSE(dx.findings.empty()) << text_of(dx);
      EXPECT_EQ(dx.findings.front().rank, culprit) << text_of(dx);
      EXPECT_EQ(dx.findings.size(), 1u) << text_of(dx);
    }
  }
}

}  // namespace
}  // namespace strata::diagnose
