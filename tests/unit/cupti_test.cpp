// The CUPTI timing source without a GPU: the timeline writer's files read back through the agent's
// reader (round trip, ring wrap-around), and libstrata_cupti.so's InitializeInjection in a process
// with no GPU returns quietly and leaves no file behind.
#include <dirent.h>
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "agent/gpu/cupti/timeline_writer.h"
#include "agent/gpu/cupti_env.h"
#include "agent/gpu/timeline_reader.h"
#include "tests/support/run.h"

namespace strata::agent::cupti {
namespace {

strata_timeline_record make(uint32_t kind, uint64_t i, const std::string& name) {
  strata_timeline_record r;
  std::memset(&r, 0, sizeof r);
  r.kind = kind;
  r.device = static_cast<int32_t>(i % 2);
  r.start_ns = 1000 + i * 100;
  r.end_ns = 1050 + i * 100;
  r.api_ns = 990 + i * 100;
  r.correlation_id = i + 1;
  r.stream = 0x7000 + i;
  r.bytes = kind == STRATA_TL_MEMCPY ? 4096 : 0;
  r.api_tid = 4242;
  std::strncpy(r.name, name.c_str(), STRATA_TIMELINE_NAME_LEN - 1);
  return r;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out.push_back(e->d_name);
    }
    closedir(d);
  }
  return out;
}

TEST(TimelineWriter, RecordsReadBackThroughTheAgentsReader) {
  test::TempDir d;
  std::string path = d.file("123.timeline");
  auto w = TimelineWriter::create(path, 8, 777);
  ASSERT_TRUE(w) << w.error().message;
  auto reader = open_timeline_file(path);
  ASSERT_TRUE(reader) << reader.error().message;

  (*w)->append(make(STRATA_TL_KERNEL, 0, "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n"));
  (*w)->append(make(STRATA_TL_COLLECTIVE, 1, "ncclDevKernel_AllReduce_Sum_f32_RING_LL"));
  (*w)->append(make(STRATA_TL_MEMCPY, 2, "memcpy HtoD"));
  uint64_t lost = 0;
  auto got = (*reader)->read_new(lost);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(lost, 0u);
  EXPECT_EQ(got[0].kind, static_cast<uint32_t>(STRATA_TL_KERNEL));
  EXPECT_EQ(got[0].name, "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n");
  EXPECT_EQ(got[1].kind, static_cast<uint32_t>(STRATA_TL_COLLECTIVE));
  EXPECT_EQ(got[1].name, "ncclDevKernel_AllReduce_Sum_f32_RING_LL");
  EXPECT_EQ(got[1].device, 1);
  EXPECT_EQ(got[1].start_ns, 1100u);
  EXPECT_EQ(got[1].end_ns, 1150u);
  EXPECT_EQ(got[1].api_ns, 1090u);
  EXPECT_EQ(got[1].correlation, 2u);
  EXPECT_EQ(got[1].stream, 0x7001u);
  EXPECT_EQ(got[1].api_tid, 4242);
  EXPECT_EQ(got[2].bytes, 4096u);

  // Past the ring's capacity: the reader loses the oldest records and says how many.
  for (uint64_t i = 3; i < 15; ++i) (*w)->append(make(STRATA_TL_KERNEL, i, "k" + std::to_string(i)));
  EXPECT_EQ((*w)->written(), 15u);
  got = (*reader)->read_new(lost);
  ASSERT_EQ(got.size(), 8u);
  EXPECT_EQ(lost, 4u);
  EXPECT_EQ(got.front().name, "k7");
  EXPECT_EQ(got.back().name, "k14");
  EXPECT_EQ(got.back().correlation, 15u);
}

TEST(TimelineWriter, LongNamesStayTerminatedAndTheFileReplacesAnOldOne) {
  test::TempDir d;
  std::string path = d.file("9.timeline");
  {
    auto old = TimelineWriter::create(path, 4, 1);
    ASSERT_TRUE(old);
    (*old)->append(make(STRATA_TL_KERNEL, 0, "old"));
  }
  auto w = TimelineWriter::create(path, 4, 2);  // a recycled pid starts over
  ASSERT_TRUE(w) << w.error().message;
  strata_timeline_record r = make(STRATA_TL_KERNEL, 0, "");
  std::memset(r.name, 'x', sizeof r.name);  // no terminator at all
  (*w)->append(r);
  auto reader = open_timeline_file(path);
  ASSERT_TRUE(reader) << reader.error().message;
  uint64_t lost = 0;
  auto got = (*reader)->read_new(lost);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].name, std::string(STRATA_TIMELINE_NAME_LEN - 1, 'x'));
  EXPECT_EQ(files_in(d.path()), std::vector<std::string>{"9.timeline"}) << "no temporary left behind";
}

TEST(TimelineWriter, DefaultPathFollowsTheEnvironment) {
  test::TempDir d;
  std::string dir = d.file("timelines");
  setenv("STRATA_TIMELINE_DIR", dir.c_str(), 1);
  EXPECT_EQ(TimelineWriter::default_path(4711), dir + "/4711.timeline");
  struct stat st {};
  EXPECT_EQ(stat(dir.c_str(), &st), 0) << "the directory is created";
  unsetenv("STRATA_TIMELINE_DIR");
}

// InitializeInjection in a child process (so a crash would fail the test, not end it), with the
// timeline directory pointing at a fresh temp dir.
TEST(CuptiInjection, IdleAndHarmlessWithoutAGpu) {
  const char* build = std::getenv("STRATA_BUILD");
  std::string lib = std::string(build ? build : "build") + "/lib/libstrata_cupti.so";
  ASSERT_EQ(access(lib.c_str(), R_OK), 0) << lib << " not built";
  test::TempDir d;
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    setenv("STRATA_TIMELINE_DIR", d.path().c_str(), 1);
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) _exit(10);
    auto init = reinterpret_cast<int (*)()>(dlsym(h, "InitializeInjection"));
    if (!init) _exit(11);
    int r1 = init();
    int r2 = init();  // a second call is answered, not redone
    if (r1 != r2 || (r1 != 0 && r1 != 1)) _exit(12);
    bool gpu = access("/dev/nvidia0", F_OK) == 0;
    if (!gpu && r1 != 0) _exit(13);
    std::exit(0);  // runs the library's exit handler, as a real process end would
  }
  int status = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      FAIL() << "InitializeInjection hung";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(WIFEXITED(status)) << "the child crashed (signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: dlopen, 11: no symbol, 12: inconsistent, 13: tracing without a GPU";
  // No GPU work happened, so nothing may be written; whatever exists must be a valid timeline.
  for (const auto& f : files_in(d.path())) {
    EXPECT_TRUE(open_timeline_file(d.path() + "/" + f)) << "garbage file " << f;
  }
  if (access("/dev/nvidia0", F_OK) != 0) {
    EXPECT_TRUE(files_in(d.path()).empty());
  }
}

// The recorder's way in: the tests live in <build>/tests, the library in <build>/lib, as strata
// itself in <build>/bin.
TEST(CuptiInjection, EnvironmentForTheRecordedCommand) {
  std::string lib = cupti_injection_library_path();
  ASSERT_EQ(access(lib.c_str(), R_OK), 0) << lib;
  unsetenv("CUDA_INJECTION64_PATH");
  unsetenv("STRATA_CUPTI");
  setenv("STRATA_TIMELINE_DIR", "/tmp/tl-x", 1);
  EXPECT_EQ(cupti_injection_env(),
            (std::vector<std::string>{"CUDA_INJECTION64_PATH=" + lib, "STRATA_TIMELINE_DIR=/tmp/tl-x"}));
  unsetenv("STRATA_TIMELINE_DIR");
  EXPECT_EQ(cupti_injection_env().at(1), "STRATA_TIMELINE_DIR=/run/strata/timeline");
  setenv("CUDA_INJECTION64_PATH", "/opt/other.so", 1);
  EXPECT_TRUE(cupti_injection_env().empty()) << "the user's injection library wins";
  unsetenv("CUDA_INJECTION64_PATH");
  setenv("STRATA_CUPTI", "0", 1);
  EXPECT_TRUE(cupti_injection_env().empty());
  unsetenv("STRATA_CUPTI");
}

}  // namespace
}  // namespace strata::agent::cupti
