// Files a process maps are read as the mapped file, never as whatever its path names now: the
// device and inode of the maps line are checked (open_mapped_file), and the build-id and unwind
// caches are keyed by the file, so two containers' different builds of one path keep their own.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "agent/normalizer.h"
#include "agent/proc_maps.h"
#include "symbolize/symbolizer.h"
#include "tests/support/run.h"

namespace strata::agent {
namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

const Mapping* mapping_of(const std::vector<Mapping>& maps, const void* p) {
  return find_mapping(maps, reinterpret_cast<uint64_t>(p));
}

TEST(ProcMaps, ReadsDeviceAndInode) {
  auto maps = parse_proc_maps(
      "7f00-7f10 r-xp 00001000 fd:01 1234 /usr/lib/x.so\n"
      "8000-9000 rw-p 00000000 00:00 0 \n"
      "zz-9000 r-xp 00000000 00:00 0 /bad/range\n"
      "9000-a000 r-xp 00000000 q:1 5 /bad/dev\n");
  ASSERT_EQ(maps.size(), 2u) << "lines with a bad range or device are skipped";
  EXPECT_EQ(maps[0].dev, makedev(0xfd, 0x01));
  EXPECT_EQ(maps[0].inode, 1234u);
  EXPECT_EQ(maps[0].file_offset, 0x1000u);
  EXPECT_EQ(maps[0].path, "/usr/lib/x.so");
}

TEST(MappedFile, OpensTheFileTheMappingShows) {
  test::TempDir d;
  std::string path = d.file("data");
  write_file(path, std::string(8192, 'a'));
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  void* p = mmap(nullptr, 8192, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  auto maps = read_proc_maps(static_cast<uint32_t>(getpid()));
  ASSERT_TRUE(maps);
  const Mapping* m = mapping_of(*maps, p);
  ASSERT_NE(m, nullptr);
  auto f = open_mapped_file(static_cast<uint32_t>(getpid()), *m);
  ASSERT_TRUE(f) << f.error().message;
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(f->identity().ino, st.st_ino);
  EXPECT_EQ(f->identity().dev, st.st_dev);
  EXPECT_EQ(f->identity().size, 8192u);
  struct stat via {};
  ASSERT_EQ(stat(f->path().c_str(), &via), 0) << "path() opens the same file";
  EXPECT_EQ(via.st_ino, st.st_ino);

  // The path now names another file (as a link out of a container, or a file renamed over it,
  // would): that file is not taken for the mapped one.
  std::string other = d.file("other");
  write_file(other, "not the mapped file");
  Mapping swapped = *m;
  swapped.path = other;
  swapped.start = swapped.end = 0;  // no /proc/PID/map_files entry to fall back on
  auto g = open_mapped_file(static_cast<uint32_t>(getpid()), swapped);
  EXPECT_FALSE(g) << "opened a file with inode " << (g ? g->identity().ino : 0);
  // Where map_files can be read (CAP_SYS_ADMIN), it gives the mapped file itself, never the other.
  Mapping via_map_files = *m;
  via_map_files.path = other;
  if (auto h = open_mapped_file(static_cast<uint32_t>(getpid()), via_map_files)) {
    EXPECT_EQ(h->identity().ino, st.st_ino);
  }
  // A FIFO at the path does not hold the open.
  std::string fifo = d.file("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  Mapping at_fifo = swapped;
  at_fifo.path = fifo;
  EXPECT_FALSE(open_mapped_file(static_cast<uint32_t>(getpid()), at_fifo));
  munmap(p, 8192);
}

// A child in its own mount namespace maps `file` at the path `at`; returns its pid (killed by the
// caller) once the mapping exists, or -1.
pid_t map_in_namespace(const std::string& file, const std::string& at) {
  int ready[2];
  if (pipe(ready) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount(file.c_str(), at.c_str(), nullptr, MS_BIND, nullptr) != 0)
      _exit(1);
    int fd = open(at.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || mmap(nullptr, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) _exit(2);
    char c = 'y';
    if (write(ready[1], &c, 1) != 1) _exit(3);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char c = 0;
  bool ok = pid > 0 && read(ready[0], &c, 1) == 1;
  close(ready[0]);
  if (!ok && pid > 0) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

// The build id of the frame at the start of `file`'s mapping in process `pid`, as the normalizer
// names it.
std::string frame_build_id(Normalizer& n, pid_t pid, const std::string& at) {
  auto maps = read_proc_maps(static_cast<uint32_t>(pid));
  if (!maps) return "no maps";
  for (const auto& m : *maps) {
    if (m.path != at) continue;
    SampleEvent e;
    e.pid = static_cast<uint32_t>(pid);
    UserStack user;
    RawUserFrame f;
    f.offset_or_ip = m.start + 16;
    user.native.push_back(f);
    Stack out;
    n.normalize(e, user, out);
    return out.empty() ? "no frame" : out[0].build_id;
  }
  return "no mapping";
}

TEST(MappedFile, TwoBuildsOfOnePathKeepTheirOwnBuildIds) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a mount namespace per 'container'";
  test::TempDir d;
  std::string at = d.file("libsame.so");  // the one path both "containers" map
  write_file(at, "");
  auto id_true = symbolize::read_build_id("/bin/true");
  auto id_false = symbolize::read_build_id("/bin/false");
  ASSERT_TRUE(id_true && id_false);
  ASSERT_NE(*id_true, *id_false);
  pid_t a = map_in_namespace("/bin/true", at);
  pid_t b = map_in_namespace("/bin/false", at);
  ASSERT_GT(a, 0);
  ASSERT_GT(b, 0);
  Normalizer n;
  n.learn_process(static_cast<uint32_t>(a));
  n.learn_process(static_cast<uint32_t>(b));
  EXPECT_EQ(frame_build_id(n, a, at), *id_true);
  EXPECT_EQ(frame_build_id(n, b, at), *id_false) << "one path, two files: not one cache entry";
  for (pid_t p : {a, b}) {
    kill(p, SIGKILL);
    waitpid(p, nullptr, 0);
  }
}

}  // namespace
}  // namespace strata::agent
