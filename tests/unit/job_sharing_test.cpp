// How collectors that share a store split its jobs (server/job_sharing.h): every job has one owner
// among the live collectors, the split is even, and when a collector leaves only its jobs move.
// The store side (heartbeats, notes) runs against real ClickHouse shards in
// tests/cluster/sharded_clickhouse_test.py.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include "server/job_sharing.h"

namespace strata::server {
namespace {

std::vector<std::string> jobs(int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back("job-" + std::to_string(i));
  return out;
}

TEST(JobSharing, EveryJobHasOneOwnerAmongTheLive) {
  const std::vector<std::string> live = {"a:7878", "b:7878", "c:7878"};
  for (const auto& j : jobs(100)) {
    auto o = JobSharing::owner(j, live);
    EXPECT_TRUE(o == "a:7878" || o == "b:7878" || o == "c:7878") << o;
    EXPECT_EQ(JobSharing::owner(j, live), o) << "the same answer every time";
  }
  EXPECT_EQ(JobSharing::owner("job", {}), "");
  EXPECT_EQ(JobSharing::owner("job", {"only"}), "only");
}

TEST(JobSharing, TheSplitIsEven) {
  const std::vector<std::string> live = {"a:7878", "b:7878", "c:7878", "d:7878"};
  std::map<std::string, int> per;
  for (const auto& j : jobs(4000)) per[JobSharing::owner(j, live)]++;
  ASSERT_EQ(per.size(), 4u);
  // 1,000 each expected; a binomial's standard deviation here is ~27, so 800 is over 7 of them.
  for (const auto& [c, n] : per) EXPECT_GT(n, 800) << c;
}

TEST(JobSharing, WhenACollectorLeavesOnlyItsJobsMove) {
  const std::vector<std::string> before = {"a:7878", "b:7878", "c:7878"};
  const std::vector<std::string> after = {"a:7878", "c:7878"};
  int moved = 0;
  for (const auto& j : jobs(1000)) {
    auto was = JobSharing::owner(j, before), now = JobSharing::owner(j, after);
    if (was != "b:7878") {
      EXPECT_EQ(now, was) << j << " moved though its collector stayed";
    } else {
      ++moved;
      EXPECT_NE(now, "b:7878");
    }
  }
  EXPECT_GT(moved, 0);
}

}  // namespace
}  // namespace strata::server
