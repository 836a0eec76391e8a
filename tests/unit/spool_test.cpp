// The agent's on-disk spool: its files never hold more than the cap; the oldest batches are
// dropped first, but never the one being sent (it would count as dropped and as delivered).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <dirent.h>

#include <string>
#include <vector>

#include "agent/shipper/spool.h"
#include "tests/support/run.h"

namespace strata::agent::shipper {
namespace {

uint64_t bytes_on_disk(const std::string& dir) {
  uint64_t total = 0;
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    struct stat st {};
    if (e->d_name[0] != '.' && stat((dir + "/" + e->d_name).c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
  }
  closedir(d);
  return total;
}

TEST(Spool, StaysUnderItsCapAndKeepsTheBatchBeingSent) {
  test::TempDir tmp;
  const std::string dir = tmp.file("spool");
  auto spool = Spool::open(dir, 1000);
  ASSERT_TRUE(spool) << spool.error().message;
  std::vector<uint64_t> dropped;
  for (int i = 0; i < 4; ++i) ASSERT_EQ(*spool->push(std::string(300, 'a'), dropped), static_cast<uint64_t>(i + 1));
  EXPECT_EQ(dropped, std::vector<uint64_t>{1});  // 4 x 300 > 1000: the oldest went
  EXPECT_EQ(spool->bytes(), 900u);

  auto sending = spool->checkout();  // batch 2 is on its way to the collector
  ASSERT_TRUE(sending);
  EXPECT_EQ(sending->seq, 2u);
  dropped.clear();
  ASSERT_EQ(*spool->push(std::string(300, 'b'), dropped), 5u);
  EXPECT_EQ(dropped, std::vector<uint64_t>{3}) << "the batch being sent is passed over";
  dropped.clear();
  ASSERT_EQ(*spool->push(std::string(600, 'c'), dropped), 6u);
  EXPECT_EQ(dropped, (std::vector<uint64_t>{4, 5}));
  EXPECT_LE(spool->bytes(), 1000u);
  EXPECT_LE(bytes_on_disk(dir), 1000u);
  // Only the batch being sent is left to drop: the new one cannot be kept.
  dropped.clear();
  EXPECT_EQ(*spool->push(std::string(800, 'd'), dropped), 0u);
  EXPECT_EQ(dropped, std::vector<uint64_t>{6});
  EXPECT_EQ(spool->count(), 1u);
  EXPECT_EQ(spool->oldest()->seq, 2u);
  EXPECT_EQ(spool->dropped(), 6u);  // 1, 3, 4, 5, 6 and the one that did not fit
  EXPECT_LE(bytes_on_disk(dir), 1000u);

  spool->remove(*sending);  // delivered
  EXPECT_EQ(spool->count(), 0u);
  EXPECT_EQ(bytes_on_disk(dir), 0u);
  // Released (a failed send), a batch is the oldest again, and may be dropped like any other.
  dropped.clear();
  ASSERT_EQ(*spool->push(std::string(800, 'e'), dropped), 7u);
  ASSERT_EQ(spool->checkout()->seq, 7u);
  spool->release();
  ASSERT_EQ(*spool->push(std::string(800, 'f'), dropped), 8u);
  EXPECT_EQ(dropped, std::vector<uint64_t>{7});
  EXPECT_LE(bytes_on_disk(dir), 1000u);
}

TEST(Spool, ABatchLargerThanTheSpoolIsDroppedAlone) {
  test::TempDir tmp;
  auto spool = Spool::open(tmp.file("spool"), 100);
  ASSERT_TRUE(spool);
  std::vector<uint64_t> dropped;
  ASSERT_EQ(*spool->push(std::string(60, 'a'), dropped), 1u);
  EXPECT_EQ(*spool->push(std::string(200, 'b'), dropped), 0u);
  EXPECT_TRUE(dropped.empty()) << "the batches already there stay";
  EXPECT_EQ(spool->bytes(), 60u);
  EXPECT_EQ(spool->dropped(), 1u);
}

// A disk that will not take a batch (full, read-only, failing) costs that batch, counted; the
// spool goes on with the next one. Here the batch's temporary file cannot be created: a directory
// stands in its place.
TEST(Spool, ABatchTheDiskWillNotTakeIsDroppedAndCounted) {
  test::TempDir tmp;
  auto spool = Spool::open(tmp.file("spool"), 1000);
  ASSERT_TRUE(spool);
  std::vector<uint64_t> dropped;
  ASSERT_EQ(*spool->push(std::string(10, 'a'), dropped), 1u);
  ASSERT_EQ(mkdir((tmp.file("spool") + "/0000000000000002.batch.tmp").c_str(), 0700), 0);
  auto r = spool->push(std::string(10, 'b'), dropped);
  ASSERT_TRUE(r) << "a write failure is not an error of the agent";
  EXPECT_EQ(*r, 0u);
  EXPECT_EQ(spool->dropped(), 1u);
  EXPECT_EQ(spool->write_failures(), 1u);
  EXPECT_EQ(spool->count(), 1u);
  EXPECT_EQ(*spool->push(std::string(10, 'c'), dropped), 3u) << "the next batch is spooled again";
  EXPECT_EQ(spool->count(), 2u);
}

}  // namespace
}  // namespace strata::agent::shipper
