// The GPU timeline reader against files a hostile watched process or local user could leave at the
// rendezvous (abi/gpu_timeline.h): a FIFO, symbolic links (to /etc/shadow, through a directory), a
// zero or huge capacity, a file truncated or rewritten while it is read, a write index that jumps
// or goes back, records that are garbage, another user's file, a hard link. The reader must refuse
// or survive each one: no hang, no signal, no read outside the ring. An alarm turns a hang into a
// failure; a SIGBUS or SIGFPE ends the test program, which fails it.
#include "agent/gpu/timeline_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <ctime>
#include <limits>

#include "agent/gpu/cupti/timeline_writer.h"
#include "tests/support/run.h"

namespace strata::agent {
namespace {

using cupti::TimelineWriter;

// Long enough for every case here on a loaded machine; only a hang gets near it.
constexpr unsigned kHangAlarmSeconds = 60;

class TimelineReader : public ::testing::Test {
 protected:
  void SetUp() override { alarm(kHangAlarmSeconds); }
  void TearDown() override { alarm(0); }
  test::TempDir dir_;
};

strata_timeline_record rec(uint64_t i, uint32_t kind = STRATA_TL_KERNEL) {
  strata_timeline_record r;
  std::memset(&r, 0, sizeof r);
  r.kind = kind;
  r.device = 0;
  r.start_ns = 1000 + i;
  r.end_ns = 2000 + i;
  r.correlation_id = i + 1;
  std::snprintf(r.name, sizeof r.name, "k%llu", static_cast<unsigned long long>(i));
  return r;
}

// Writes a raw header (and room for `size` bytes in all) as a hostile writer could.
std::string raw_file(const std::string& path, uint32_t capacity, uint64_t size,
                     uint32_t record_size = sizeof(strata_timeline_record)) {
  strata_timeline_header h;
  std::memset(&h, 0, sizeof h);
  h.magic = STRATA_TIMELINE_MAGIC;
  h.version = STRATA_TIMELINE_VERSION;
  h.header_size = STRATA_TIMELINE_HEADER_SIZE;
  h.record_size = record_size;
  h.capacity = capacity;
  h.pid = 1;
  h.write_index = 5;
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(pwrite(fd, &h, sizeof h, 0), static_cast<ssize_t>(sizeof h));
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);  // sparse: reads as zeros
  close(fd);
  return path;
}

void poke_u64(const std::string& path, off_t off, uint64_t v) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, &v, sizeof v, off), static_cast<ssize_t>(sizeof v));
  close(fd);
}

std::string refused(const Result<std::unique_ptr<GpuTimingSource>>& r) {
  return r ? "accepted" : r.error().message;
}

TEST_F(TimelineReader, FollowsTheRingAcrossChunksAndWrapAround) {
  std::string path = dir_.file("1.timeline");
  auto w = TimelineWriter::create(path, 300, 1);
  ASSERT_TRUE(w) << w.error().message;
  auto r = open_timeline_file(path);
  ASSERT_TRUE(r) << r.error().message;
  uint64_t lost = 0, got = 0, next = 0;
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 250; ++i) (*w)->append(rec(next++));
    auto recs = (*r)->read_new(lost);
    for (const auto& x : recs) {
      EXPECT_EQ(x.correlation, ++got) << "in order, none skipped";
      EXPECT_EQ(x.name, "k" + std::to_string(got - 1)) << "each record its own name";
    }
  }
  EXPECT_EQ(got, 1000u);
  EXPECT_EQ(lost, 0u);
}

// After its writer exits the reader removes the file it read, and only that file: a new process with
// the same pid may have made its own under the name meanwhile.
TEST_F(TimelineReader, RemovesTheFileItReadAndNoOther) {
  std::string path = dir_.file("11.timeline");
  ASSERT_TRUE(TimelineWriter::create(path, 8, 1));
  auto r = open_timeline_file(path);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE((*r)->remove_file());
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the file it read is gone";
  EXPECT_FALSE((*r)->remove_file()) << "nothing left to remove";

  std::string reused = dir_.file("12.timeline");
  ASSERT_TRUE(TimelineWriter::create(reused, 8, 1));
  auto old = open_timeline_file(reused);
  ASSERT_TRUE(old) << old.error().message;
  ASSERT_EQ(unlink(reused.c_str()), 0);
  ASSERT_TRUE(TimelineWriter::create(reused, 8, 1));  // the next process with that pid
  EXPECT_FALSE((*old)->remove_file());
  EXPECT_EQ(access(reused.c_str(), F_OK), 0) << "another process's file stays";
}

TEST_F(TimelineReader, RefusesAFifoWithoutWaitingForAWriter) {
  std::string path = dir_.file("2.timeline");
  ASSERT_EQ(mkfifo(path.c_str(), 0644), 0);
  auto r = open_timeline_file(path);
  EXPECT_NE(refused(r).find("not a regular file"), std::string::npos) << refused(r);
}

TEST_F(TimelineReader, RefusesASymbolicLinkToShadowOrEvenToAGoodTimeline) {
  std::string link = dir_.file("3.timeline");
  ASSERT_EQ(symlink("/etc/shadow", link.c_str()), 0);
  auto r = open_timeline_file(link);
  EXPECT_NE(refused(r).find("symbolic link"), std::string::npos) << refused(r);

  std::string good = dir_.file("good.timeline");
  ASSERT_TRUE(TimelineWriter::create(good, 4, 1));
  ASSERT_TRUE(open_timeline_file(good));
  std::string link2 = dir_.file("4.timeline");
  ASSERT_EQ(symlink(good.c_str(), link2.c_str()), 0);
  EXPECT_FALSE(open_timeline_file(link2)) << "a link is refused whatever it points at";
}

TEST_F(TimelineReader, RefusesASymbolicLinkAnywhereOnTheDirectoryPath) {
  std::string real = dir_.file("real");
  ASSERT_EQ(mkdir(real.c_str(), 0755), 0);
  ASSERT_TRUE(TimelineWriter::create(real + "/5.timeline", 4, 1));
  ASSERT_TRUE(open_timeline_file(real + "/5.timeline"));
  ASSERT_EQ(symlink(real.c_str(), dir_.file("via").c_str()), 0);
  auto r = open_timeline_file(dir_.file("via") + "/5.timeline");
  EXPECT_NE(refused(r).find("symbolic link"), std::string::npos) << refused(r);
  EXPECT_FALSE(open_timeline_file(real + "/../real/5.timeline")) << "'..' is refused";
}

TEST_F(TimelineReader, RefusesZeroHugeAndOversizedCapacities) {
  auto zero =
      open_timeline_file(raw_file(dir_.file("6.timeline"), 0, STRATA_TIMELINE_HEADER_SIZE + 184 * 16));
  EXPECT_NE(refused(zero).find("capacity 0"), std::string::npos) << refused(zero);
  auto huge = open_timeline_file(raw_file(dir_.file("7.timeline"), std::numeric_limits<uint32_t>::max(),
                                          STRATA_TIMELINE_HEADER_SIZE + 184 * 16));
  EXPECT_NE(refused(huge).find("out of range"), std::string::npos) << refused(huge);
  // Over the limit even when the (sparse) file is as long as it claims.
  uint32_t over = kMaxTimelineCapacity + 1;
  auto big = open_timeline_file(
      raw_file(dir_.file("8.timeline"), over,
               STRATA_TIMELINE_HEADER_SIZE + uint64_t{over} * sizeof(strata_timeline_record)));
  EXPECT_NE(refused(big).find("out of range"), std::string::npos) << refused(big);
  // A capacity the file is too short for.
  auto shorter =
      open_timeline_file(raw_file(dir_.file("9.timeline"), 1000, STRATA_TIMELINE_HEADER_SIZE + 184 * 10));
  EXPECT_NE(refused(shorter).find("shorter"), std::string::npos) << refused(shorter);
  auto bad_record =
      open_timeline_file(raw_file(dir_.file("10.timeline"), 4, STRATA_TIMELINE_HEADER_SIZE + 184 * 4, 8));
  EXPECT_FALSE(bad_record);
  auto tiny = open_timeline_file(raw_file(dir_.file("11.timeline"), 4, 100));
  EXPECT_FALSE(tiny);
  // The largest allowed capacity is accepted and read without trouble (sparse: all slots empty).
  auto max = open_timeline_file(raw_file(
      dir_.file("12.timeline"), kMaxTimelineCapacity,
      STRATA_TIMELINE_HEADER_SIZE + uint64_t{kMaxTimelineCapacity} * sizeof(strata_timeline_record)));
  ASSERT_TRUE(max) << refused(max);
  uint64_t lost = 0;
  EXPECT_TRUE((*max)->read_new(lost).empty());
  EXPECT_EQ(lost, 5u) << "the 5 claimed records are empty slots";
}

TEST_F(TimelineReader, SurvivesTruncationWhileReading) {
  std::string path = dir_.file("13.timeline");
  auto w = TimelineWriter::create(path, 64, 1);
  ASSERT_TRUE(w);
  auto r = open_timeline_file(path);
  ASSERT_TRUE(r);
  for (int i = 0; i < 10; ++i) (*w)->append(rec(i));
  // Cut after two records: a shared map would fault on the third (SIGBUS); pread comes back short.
  ASSERT_EQ(truncate(path.c_str(), STRATA_TIMELINE_HEADER_SIZE + 2 * sizeof(strata_timeline_record)), 0);
  uint64_t lost = 0;
  auto got = (*r)->read_new(lost);
  EXPECT_LE(got.size(), 2u);
  EXPECT_EQ(got.size() + lost, 10u) << "each record either read or counted lost";
  // Cut inside the header: the write index itself is gone.
  ASSERT_EQ(truncate(path.c_str(), 16), 0);
  EXPECT_TRUE((*r)->read_new(lost).empty());
  ASSERT_EQ(truncate(path.c_str(), 0), 0);
  EXPECT_TRUE((*r)->read_new(lost).empty());
}

TEST_F(TimelineReader, NeverTrustsTheHeaderASecondTime) {
  std::string path = dir_.file("14.timeline");
  auto w = TimelineWriter::create(path, 8, 1);
  ASSERT_TRUE(w);
  auto r = open_timeline_file(path);
  ASSERT_TRUE(r);
  for (int i = 0; i < 5; ++i) (*w)->append(rec(i));
  // After the checks passed: capacity 0 (a division by zero if re-read) and record size 0. (The
  // writer divides by its own header's capacity, so the records are written first.)
  poke_u64(path, offsetof(strata_timeline_header, record_size), 0);  // record_size = capacity = 0
  uint64_t lost = 0;
  EXPECT_EQ((*r)->read_new(lost).size(), 5u) << "read with the capacity checked at open";
  EXPECT_EQ(lost, 0u);
}

TEST_F(TimelineReader, AWriteIndexThatJumpsOrGoesBackIsHarmless) {
  std::string path = dir_.file("15.timeline");
  auto w = TimelineWriter::create(path, 16, 1);
  ASSERT_TRUE(w);
  auto r = open_timeline_file(path);
  ASSERT_TRUE(r);
  for (int i = 0; i < 3; ++i) (*w)->append(rec(i));
  uint64_t lost = 0;
  EXPECT_EQ((*r)->read_new(lost).size(), 3u);
  poke_u64(path, offsetof(strata_timeline_header, write_index), std::numeric_limits<uint64_t>::max() - 5);
  auto got = (*r)->read_new(lost);
  EXPECT_TRUE(got.empty()) << "no slot holds those record numbers";
  EXPECT_GT(lost, 1'000'000'000u) << "the jump is counted lost, not walked";
  poke_u64(path, offsetof(strata_timeline_header, write_index), 2);
  EXPECT_TRUE((*r)->read_new(lost).empty());
}

TEST_F(TimelineReader, DropsRecordsThatAreNotDeviceWork) {
  std::string path = dir_.file("16.timeline");
  auto w = TimelineWriter::create(path, 16, 1);
  ASSERT_TRUE(w);
  auto r = open_timeline_file(path);
  ASSERT_TRUE(r);
  (*w)->append(rec(0));
  (*w)->append(rec(1, 99));  // unknown kind
  auto neg = rec(2);
  neg.device = -7;
  (*w)->append(neg);
  auto far = rec(3);
  far.device = kMaxTimelineDevice;
  (*w)->append(far);
  auto noname = rec(4);
  std::memset(noname.name, 'x', sizeof noname.name);  // the writer terminates it; a raw write need not
  (*w)->append(noname);
  uint64_t lost = 0;
  auto got = (*r)->read_new(lost);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].correlation, 1u);
  EXPECT_EQ(got[0].name, "k0");
  EXPECT_EQ(got[1].name, std::string(STRATA_TIMELINE_NAME_LEN - 1, 'x'))
      << "the names of the records refused are skipped";
  EXPECT_EQ(lost, 3u);
}

TEST_F(TimelineReader, RefusesAWritableDirectoryThatIsNotSticky) {
  std::string d = dir_.file("open");
  ASSERT_EQ(mkdir(d.c_str(), 0700), 0);
  ASSERT_TRUE(TimelineWriter::create(d + "/17.timeline", 4, 1));
  ASSERT_EQ(chmod(d.c_str(), 0777), 0);
  auto r = open_timeline_file(d + "/17.timeline");
  EXPECT_NE(refused(r).find("not sticky"), std::string::npos) << refused(r);
  ASSERT_EQ(chmod(d.c_str(), 01777), 0);
  EXPECT_TRUE(open_timeline_file(d + "/17.timeline")) << "sticky, like /run/strata/timeline";
}

TEST_F(TimelineReader, RefusesAHardLinkedFile) {
  std::string a = dir_.file("18.timeline");
  ASSERT_TRUE(TimelineWriter::create(a, 4, 1));
  ASSERT_EQ(link(a.c_str(), dir_.file("19.timeline").c_str()), 0);
  auto r = open_timeline_file(dir_.file("19.timeline"));
  EXPECT_NE(refused(r).find("links"), std::string::npos) << refused(r);
}

TEST_F(TimelineReader, RefusesAFileOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file to another uid";
  constexpr uid_t kStranger = 4242;
  std::string path = dir_.file("20.timeline");
  ASSERT_TRUE(TimelineWriter::create(path, 4, 1));
  ASSERT_EQ(chown(path.c_str(), kStranger, kStranger), 0);
  auto r = open_timeline_file(path, /*owner=*/1000);
  EXPECT_NE(refused(r).find("owned by uid 4242"), std::string::npos) << refused(r);
  EXPECT_TRUE(open_timeline_file(path, kStranger)) << "the target's own file is fine";
}

TEST_F(TimelineReader, TellsARefusedFileFromAMissingOne) {
  auto missing = open_timeline_file(dir_.file("21.timeline"));
  ASSERT_FALSE(missing);
  EXPECT_FALSE(timeline_refused(missing.error())) << missing.error().message;
  ASSERT_EQ(mkfifo(dir_.file("22.timeline").c_str(), 0644), 0);
  ASSERT_EQ(symlink("/etc/shadow", dir_.file("23.timeline").c_str()), 0);
  raw_file(dir_.file("24.timeline"), 0, STRATA_TIMELINE_HEADER_SIZE + 184);
  raw_file(dir_.file("25.timeline"), 4, 100);
  for (const char* name : {"22.timeline", "23.timeline", "24.timeline", "25.timeline"}) {
    auto r = open_timeline_file(dir_.file(name));
    ASSERT_FALSE(r) << name;
    EXPECT_TRUE(timeline_refused(r.error())) << name << ": " << r.error().message;
  }
}

TEST_F(TimelineReader, FindsATargetsFileByItsOwnPidAndUid) {
  auto t = timeline_target_of(static_cast<uint32_t>(getpid()));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->uid, getuid());
  EXPECT_TRUE(t->host_root);
  std::string name = std::to_string(t->ns_pid) + ".timeline";
  // TimelineWriter puts getpid() in the header: the pid the reader expects; made now, after the
  // process started.
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  auto w = TimelineWriter::create(dir_.file(name), 4,
                                  static_cast<uint64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec);
  ASSERT_TRUE(w);
  (*w)->append(rec(0));
  auto r = open_timeline_for(*t, dir_.path());
  ASSERT_TRUE(r) << refused(r);
  uint64_t lost = 0;
  EXPECT_EQ((*r)->read_new(lost).size(), 1u);
  EXPECT_FALSE(open_timeline_for(*t, "relative/dir")) << "the directory must be absolute";

  // A file older than the process is an earlier process's (the pid was reused): refused.
  TimelineTarget later = *t;
  later.started_mono_ns = t->started_mono_ns + 3'600'000'000'000;  // "started" in an hour
  auto stale = open_timeline_for(later, dir_.path());
  EXPECT_NE(refused(stale).find("earlier process"), std::string::npos) << refused(stale);
  EXPECT_GT(t->started_mono_ns, 0);

  // Another process's name on this process's file: the header names the writer, so refused.
  TimelineTarget other = *t;
  other.ns_pid = t->ns_pid + 1;
  ASSERT_EQ(rename(dir_.file(name).c_str(), dir_.file(std::to_string(other.ns_pid) + ".timeline").c_str()),
            0);
  auto r2 = open_timeline_for(other, dir_.path());
  EXPECT_NE(refused(r2).find("written by pid"), std::string::npos) << refused(r2);
}

}  // namespace
}  // namespace strata::agent
