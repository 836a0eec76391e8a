// The agent's memory stays bounded: 64 processes and 100k distinct stacks of synthetic samples go
// through the real normalizer and the SQLite store, in windows closed at kMaxWindowStacks as the
// recorder and the agent close them; the process's peak RSS must stay under the agent's cap.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/capture.h"
#include "agent/events.h"
#include "agent/limits.h"
#include "agent/normalizer.h"
#include "agent/pipeline.h"
#include "store/store.h"

namespace strata::agent {
namespace {

// Peak and current resident memory of this process (kB), from /proc/self/status.
uint64_t status_kb(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1));
  }
  return 0;
}

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;  // ASan's shadow memory and quarantine make RSS meaningless
#else
constexpr bool kSanitized = false;
#endif

// A sample as the kernel would deliver it for a process that is gone (pids above pid_max): the
// normalizer cannot read its mappings, as with short-lived processes, and must stay bounded anyway.
SampleEvent synthetic_sample(uint32_t process, uint32_t stack_index, std::mt19937_64& rng) {
  SampleEvent e;
  e.pid = 5'000'000 + process;
  e.tid = e.pid + stack_index % 4;
  e.comm = "rank" + std::to_string(process);
  // Shared leaves and roots, distinct middles: like real training stacks.
  for (int i = 0; i < 12; ++i) e.kstack.push_back(0xffffffff81000000ull + (i < 6 ? i : stack_index * 64 + i) * 16);
  for (int i = 0; i < 24; ++i) {
    RawUserFrame f;
    f.has_build_id = true;
    uint32_t module = (i + stack_index) % 40;  // 40 libraries
    for (size_t b = 0; b < f.build_id.size(); ++b) f.build_id[b] = static_cast<uint8_t>(module * 7 + b + 1);
    f.offset_or_ip = 0x1000 + (i < 8 ? static_cast<uint64_t>(i) * 0x40 : (stack_index * 131 + i) * 0x10 + rng() % 8);
    e.ustack.push_back(f);
  }
  return e;
}

TEST(AgentMemory, HundredThousandStacksOfSixtyFourProcesses) {
  constexpr uint32_t kProcesses = 64;
  constexpr uint32_t kStacks = 100'000;
  char path[] = "/tmp/strata-memory-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::remove(path);
  auto st = store::Store::open_sqlite(path, store::Store::Mode::kCreateOrAppend);
  ASSERT_TRUE(st) << st.error().message;
  auto& store = **st;
  auto rec = store.begin_recording(store::RecordingInfo{});
  ASSERT_TRUE(rec);

  const uint64_t rss_before_kb = status_kb("VmRSS");
  Normalizer normalizer;
  std::mt19937_64 rng(1);
  std::vector<Stack> window;  // as the recorder's window: distinct normalized stacks
  std::vector<store::StackCount> counts;
  UserStack user;
  uint64_t windows = 0;
  auto flush = [&] {
    ASSERT_TRUE(store.begin());
    for (size_t i = 0; i < window.size(); ++i) {
      auto id = store.intern_stack(window[i], user.method);
      ASSERT_TRUE(id) << id.error().message;
      counts[i].stack_id = *id;
    }
    ASSERT_TRUE(store.put_window(*rec, windows, windows + 1, store::CountKind::kOnCpu, counts));
    ASSERT_TRUE(store.commit());
    window.clear();
    counts.clear();
    ++windows;
  };
  for (uint32_t s = 0; s < kStacks; ++s) {
    SampleEvent e = synthetic_sample(s % kProcesses, s, rng);
    normalizer.unwind(e, user);
    Stack stack;
    normalizer.normalize(e, user, stack);
    ASSERT_EQ(stack.size(), e.kstack.size() + e.ustack.size());
    window.push_back(std::move(stack));
    counts.push_back(store::StackCount{e.pid, e.tid, e.comm, 0, 1});
    if (window.size() >= kMaxWindowStacks) flush();
  }
  flush();
  for (uint32_t p = 0; p < kProcesses; ++p) normalizer.forget_process(5'000'000 + p);

  const uint64_t peak_kb = status_kb("VmHWM");
  std::printf("windows %llu, RSS before %llu kB, peak %llu kB (cap %llu kB)\n",
              static_cast<unsigned long long>(windows), static_cast<unsigned long long>(rss_before_kb),
              static_cast<unsigned long long>(peak_kb),
              static_cast<unsigned long long>(kDefaultMemoryCapBytes / 1024));
  EXPECT_GE(windows, kStacks / kMaxWindowStacks);
  if (!kSanitized) {
    EXPECT_LT(peak_kb * 1024, kDefaultMemoryCapBytes);
  }
  std::remove(path);
  std::remove((std::string(path) + "-wal").c_str());
  std::remove((std::string(path) + "-shm").c_str());
}

// A node's processes come and go for months, each mapping files of its own (new images, .so files
// compiled at run time): the normalizer's caches keyed by file stay bounded, and a live process's
// files are kept. Processes and their files come from a replayed capture: no root, no real files.
std::array<uint8_t, 20> fake_build_id(uint32_t file) {
  std::array<uint8_t, 20> id{};
  for (size_t b = 0; b < id.size(); ++b) id[b] = static_cast<uint8_t>((file >> (8 * (b % 4))) + b + 1);
  id[19] = 0xaa;  // no zero padding to trim
  return id;
}

void tape_process(Capture& c, uint32_t pid, uint32_t first_file, uint32_t files) {
  ByteWriter maps;
  maps.u32(pid);
  maps.u8(1);
  maps.u32(files);
  for (uint32_t f = first_file; f < first_file + files; ++f) {
    maps.u64(0x10000000ull * (f + 1));  // start
    maps.u64(0x10000000ull * (f + 1) + 0x1000);
    maps.u64(0);    // file offset
    maps.u64(7);    // device
    maps.u64(f + 1);  // inode
    maps.u8(1);     // executable
    maps.str("/jit/f" + std::to_string(f) + ".so");
  }
  c.records.push_back({CaptureKind::kProcMaps, maps.take()});
  for (uint32_t f = first_file; f < first_file + files; ++f) {
    auto raw = fake_build_id(f);
    ByteWriter id;
    id.u32(pid);
    id.u64(7);
    id.u64(f + 1);
    id.u8(1);  // opened
    id.u64(7);
    id.u64(f + 1);
    id.u64(4096);  // size
    id.i64(1);     // mtime
    id.str(build_id_hex(raw.data(), raw.size()));
    c.records.push_back({CaptureKind::kBuildId, id.take()});
  }
}

TEST(AgentMemory, FileCachesOfManyShortLivedProcessesStayBounded) {
  constexpr uint32_t kLivePid = 1, kProcesses = 4000, kFilesEach = 4;  // 16k distinct files
  Capture c;
  tape_process(c, kLivePid, 0, 1);
  for (uint32_t p = 0; p < kProcesses; ++p) tape_process(c, 100 + p, 1 + p * kFilesEach, kFilesEach);
  Tape tape(std::move(c));
  Normalizer n;
  n.set_tape(&tape);
  n.learn_process(kLivePid);
  size_t most_files = 0, most_ids = 0;
  for (uint32_t p = 0; p < kProcesses; ++p) {
    n.learn_process(100 + p);
    n.forget_process(100 + p);
    most_files = std::max(most_files, n.known_files());
    most_ids = std::max(most_ids, n.known_build_ids());
  }
  ASSERT_FALSE(tape.error()) << *tape.error();
  EXPECT_GT(most_files, 0u);
  EXPECT_LT(most_files, 2 * kMaxKnownFiles);
  EXPECT_LT(most_ids, 2 * kMaxKnownFiles);
  EXPECT_GE(n.unwind_counters().file_cache_prunes, 1u);

  // The live process's file was kept: its frames still name it.
  SampleEvent e;
  e.pid = kLivePid;
  e.tid = kLivePid;
  RawUserFrame f;
  f.has_build_id = true;
  f.build_id = fake_build_id(0);
  f.offset_or_ip = 0x123;
  e.ustack.push_back(f);
  Stack stack;
  n.normalize(e, stack);
  ASSERT_EQ(stack.size(), 1u);
  EXPECT_EQ(stack[0].module, "/jit/f0.so");
  EXPECT_FALSE(tape.error()) << *tape.error();
}

// Sampled threads are kept per live process for the run's thread count: a rank that starts threads
// for weeks, and processes whose last sample comes after their exit, leave a bounded set.
SampleEvent thread_sample(uint32_t pid, uint32_t tid) {
  SampleEvent e;
  e.pid = pid;
  e.tid = tid;
  e.comm = "rank";
  e.kstack.push_back(0xffffffff81000000ull);
  return e;
}

TEST(AgentMemory, ThreadsOfALongRunningProcessStayBounded) {
  PipelineOptions opts;
  opts.node = "n1";
  opts.layers = {};
  std::ostringstream log;
  NodePipeline pipeline(opts, log);
  constexpr uint32_t kPid = 5'000'000;  // above pid_max: nothing of it is read from /proc
  constexpr uint32_t kThreads = 100'000;
  size_t most = 0;
  for (uint32_t t = 0; t < kThreads; ++t) {
    pipeline.on_sample(thread_sample(kPid, kPid + 1 + t));
    most = std::max(most, pipeline.threads_held());
  }
  EXPECT_GT(most, 0u);
  EXPECT_LT(most, 10'000u);
}

TEST(AgentMemory, LateSamplesOfExitedProcessesLeaveNothing) {
  PipelineOptions opts;
  opts.node = "n1";
  opts.layers = {};
  std::ostringstream log;
  NodePipeline pipeline(opts, log);
  constexpr uint32_t kProcesses = 10'000;
  for (uint32_t p = 0; p < kProcesses; ++p) {
    const uint32_t pid = 5'000'000 + p;
    ProcEvent fork;
    fork.type = ProcEvent::Type::kFork;
    fork.pid = pid;
    fork.comm = "worker";
    pipeline.on_proc(fork);
    pipeline.on_sample(thread_sample(pid, pid));
    ProcEvent exit;
    exit.type = ProcEvent::Type::kExit;
    exit.pid = pid;
    pipeline.on_proc(exit);
    SampleEvent late = thread_sample(pid, pid + 1);  // still in the ring buffer when the exit came
    RawUserFrame f;  // in a file not known: normalizing it asks to read the maps again
    f.has_build_id = true;
    f.build_id = fake_build_id(p);
    f.offset_or_ip = 0x10;
    late.ustack.push_back(f);
    pipeline.on_sample(late);
    if (pipeline.known_count() > 1000) pipeline.forget_gone_pids();  // as the daemon does
  }
  EXPECT_EQ(pipeline.live_processes(), 0u);
  EXPECT_EQ(pipeline.threads_held(), 0u);
  EXPECT_EQ(pipeline.normalizer_processes(), 0u);
}

}  // namespace
}  // namespace strata::agent
