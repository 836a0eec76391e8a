// The collector's pages' processes (server::JobProcesses) are read from the store once per change:
// a second request with nothing written reads nothing, a write (this connection's or another
// process's) or a read inside a transaction reads again. Reads counted through a wrapper.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "server/web_api.h"
#include "store/store.h"
#include "tests/support/forwarding_reader.h"
#include "tests/support/run.h"

namespace strata {
namespace {

using test::TempDir;

// Forwards every read to a store and counts the reads of the processes table.
class CountingReader : public test::ForwardingReader {
 public:
  using ForwardingReader::ForwardingReader;
  int process_reads = 0;

  Result<std::vector<store::ProcessInfo>> processes(std::optional<int64_t> rec) override {
    ++process_reads;
    return ForwardingReader::processes(rec);
  }
};

store::ProcessInfo proc(uint32_t pid, uint32_t ppid, const std::string& comm) {
  store::ProcessInfo p;
  p.pid = pid;
  p.ppid = ppid;
  p.start_ns = 1000 + pid;
  p.node = "node-1";
  p.comm = comm;
  p.command = comm;
  return p;
}

// Two processes under one parent that step, with no RANK in their environment: the pages show them
// as ranks 0 and 1 of "launcher-100" (what processes_with_ranks infers, which reads the steps too).
void write_job(store::Store& s, int64_t& rec) {
  ASSERT_TRUE(s.begin());
  auto r = s.begin_recording({"node-1", "train", 1000, 99, 10});
  ASSERT_TRUE(r) << r.error().message;
  rec = *r;
  ASSERT_TRUE(s.put_process(rec, proc(100, 1, "launcher")));
  std::vector<store::StepRecord> steps;
  for (uint32_t pid : {101u, 102u}) {
    ASSERT_TRUE(s.put_process(rec, proc(pid, 100, "python3")));
    for (uint64_t k = 1; k <= 3; ++k) {
      store::StepRecord st;
      st.pid = pid;
      st.step = k;
      st.start_ns = 2'000'000'000 * k;
      st.end_ns = st.start_ns + 1'000'000'000;
      steps.push_back(st);
    }
  }
  ASSERT_TRUE(s.put_steps(rec, steps));
  ASSERT_TRUE(s.commit());
}

int rank_of(const std::vector<store::ProcessInfo>& procs, uint32_t pid) {
  for (const auto& p : procs)
    if (p.pid == pid) return p.rank;
  return -2;  // not there
}

TEST(JobProcesses, ReadAgainOnlyAfterAWrite) {
  TempDir dir;
  auto s = store::Store::open_sqlite(dir.file("s.db"), store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(s) << s.error().message;
  int64_t rec = 0;
  write_job(**s, rec);
  CountingReader counting(**s);
  server::JobProcesses cache(counting);

  auto first = cache.get();
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(counting.process_reads, 1);
  EXPECT_EQ(rank_of(*first, 101), 0);
  EXPECT_EQ(rank_of(*first, 102), 1);
  // Nothing written since: the same processes, not read again.
  auto second = cache.get();
  ASSERT_TRUE(second) << second.error().message;
  EXPECT_EQ(counting.process_reads, 1);
  EXPECT_EQ(cache.reads(), 1u);
  EXPECT_EQ(second->size(), first->size());
  EXPECT_EQ(rank_of(*second, 102), 1);

  // A write through this connection: read again, and the new process is there.
  ASSERT_TRUE((*s)->begin());
  ASSERT_TRUE((*s)->put_process(rec, proc(200, 1, "logrotate")));
  // Inside the transaction the store cannot say (it may roll back): read every time.
  ASSERT_TRUE(cache.get());
  ASSERT_TRUE(cache.get());
  EXPECT_EQ(counting.process_reads, 3);
  ASSERT_TRUE((*s)->commit());
  auto third = cache.get();
  ASSERT_TRUE(third) << third.error().message;
  EXPECT_EQ(counting.process_reads, 4);
  EXPECT_EQ(rank_of(*third, 200), -1);
  ASSERT_TRUE(cache.get());
  EXPECT_EQ(counting.process_reads, 4);

  // A write by another connection (another process writing the file): read again.
  {
    auto other = store::Store::open_sqlite(dir.file("s.db"), store::Store::Mode::kCreateOrAppend);
    ASSERT_TRUE(other) << other.error().message;
    ASSERT_TRUE((*other)->begin());
    ASSERT_TRUE((*other)->put_process(rec, proc(300, 1, "sshd")));
    ASSERT_TRUE((*other)->commit());
  }
  auto fourth = cache.get();
  ASSERT_TRUE(fourth) << fourth.error().message;
  EXPECT_EQ(counting.process_reads, 5);
  EXPECT_EQ(rank_of(*fourth, 300), -1);
  ASSERT_TRUE(cache.get());
  EXPECT_EQ(counting.process_reads, 5);
}

// A store that cannot tell a change (ClickHouse, the remote reader): every call reads.
TEST(JobProcesses, AStoreWithoutADataVersionIsReadEveryTime) {
  TempDir dir;
  auto s = store::Store::open_sqlite(dir.file("s.db"), store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(s) << s.error().message;
  int64_t rec = 0;
  write_job(**s, rec);
  struct NoVersion final : CountingReader {
    using CountingReader::CountingReader;
    Result<std::optional<uint64_t>> data_version() override { return std::optional<uint64_t>{}; }
  } counting(**s);
  server::JobProcesses cache(counting);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache.get());
  EXPECT_EQ(counting.process_reads, 3);
}

}  // namespace
}  // namespace strata
