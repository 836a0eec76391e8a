// Issue 15 item 3, without root: a frame-pointer chain is cut at the first return address that is
// not code (valid_frame_chain, and the normalizer applying it to the kernel's walk); a process's
// maps are read again at a bounded rate for its whole life, not 64 times; a process recognized as
// CPython forgets it when it execs another image (or when its maps show one).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "agent/normalizer.h"
#include "agent/proc_maps.h"
#include "unwind/module_tables.h"

namespace strata::agent {
namespace {

// A PyTorch rank's layout in small: the interpreter, libgloo (no frame pointers), the heap, an
// anonymous read-write region, libc.
const char* kMaps =
    "555555554000-555555560000 r-xp 00001000 fd:01 11 /usr/bin/python3.11\n"
    "7f0000000000-7f0000100000 r-xp 00010000 fd:01 12 /usr/lib/x86_64-linux-gnu/libgloo.so.0\n"
    "7f0000100000-7f0000110000 r--p 00110000 fd:01 12 /usr/lib/x86_64-linux-gnu/libgloo.so.0\n"
    "7f1000000000-7f1000200000 rw-p 00000000 00:00 0 [heap]\n"
    "7f2000000000-7f2000100000 r-xp 00028000 fd:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6\n";

TEST(FrameChain, CutAtTheFirstReturnAddressThatIsNotCode) {
  auto maps = parse_proc_maps(kMaps);
  ASSERT_EQ(maps.size(), 5u);
  // gloo's event loop keeps `this` (a heap address) in rbp: the kernel's walk reads heap words.
  std::vector<uint64_t> chain = {0x7f0000000100, 0x7f0000000200, 0x7f1000000040};
  for (int i = 0; i < 124; ++i) chain.push_back(0x7f1000000040);
  EXPECT_EQ(valid_frame_chain(maps, chain.data(), chain.size()), 2u) << "cut before the heap address";
  // A return address into read-only data of a module (a vtable) is not code either.
  std::vector<uint64_t> rodata = {0x7f0000000100, 0x7f0000100010, 0x7f2000000100};
  EXPECT_EQ(valid_frame_chain(maps, rodata.data(), rodata.size()), 1u);
  // A return address in no mapping at all.
  std::vector<uint64_t> nowhere = {0x7f2000000100, 0x7f2000000200, 0x1234, 0x555555554100};
  EXPECT_EQ(valid_frame_chain(maps, nowhere.data(), nowhere.size()), 2u);
  // Every return address in code: kept whole.
  std::vector<uint64_t> whole = {0x7f2000000100, 0x7f0000000200, 0x555555554100};
  EXPECT_EQ(valid_frame_chain(maps, whole.data(), whole.size()), 3u);
  // The return address is looked up one byte back (the call): one just past a module's code is in
  // that module, one at the very start of a mapping is in what lies before it.
  std::vector<uint64_t> edge = {0x7f2000000100, 0x7f0000100000};
  EXPECT_EQ(valid_frame_chain(maps, edge.data(), edge.size()), 2u);
  std::vector<uint64_t> edge2 = {0x7f2000000100, 0x7f1000200000 + 1};
  EXPECT_EQ(valid_frame_chain(maps, edge2.data(), edge2.size()), 1u);
  // The leaf is where the thread was: kept even outside code (JIT in an anonymous mapping the
  // kernel lists without x is not ours to judge), but nothing after it.
  std::vector<uint64_t> leaf = {0x7f1000000040, 0x7f2000000100};
  EXPECT_EQ(valid_frame_chain(maps, leaf.data(), leaf.size()), 1u);
  // A zero ends the chain.
  std::vector<uint64_t> zero = {0x7f2000000100, 0};
  EXPECT_EQ(valid_frame_chain(maps, zero.data(), zero.size()), 1u);
  EXPECT_EQ(valid_frame_chain(maps, nullptr, 0), 0u);
}

TEST(MapsReread, BoundedByRateNotByLifetime) {
  MapsRereadLimiter lim;
  constexpr uint64_t dt = MapsRereadLimiter::kMapsRereadIntervalNs;
  uint64_t now = 5 * dt;
  // Far more than the old lifetime cap of 64: a long-lived process whose heap keeps growing.
  constexpr uint64_t burst = MapsRereadLimiter::kMapsRereadBurst;
  for (int i = 0; i < 1000; ++i, now += dt) EXPECT_TRUE(lim.allow(7, now)) << "re-read " << i;
  // A burst (a library and its dependencies) at one instant: up to the burst, then refused.
  for (uint64_t i = 0; i < burst; ++i) EXPECT_TRUE(lim.allow(7, now)) << "burst " << i;
  EXPECT_FALSE(lim.allow(7, now)) << "past the burst";
  EXPECT_FALSE(lim.allow(7, now + dt / 2)) << "the bucket refills at one re-read per interval";
  EXPECT_TRUE(lim.allow(7, now + dt)) << "one interval later: one more";
  EXPECT_FALSE(lim.allow(7, now + dt));
  EXPECT_TRUE(lim.allow(8, now)) << "each process has its own rate";
  lim.forget(7);
  EXPECT_TRUE(lim.allow(7, now + dt)) << "a forgotten (exec'd, exited) process starts afresh";
  EXPECT_EQ(lim.rereads(), 1000u + burst + 3);
  EXPECT_EQ(lim.refused(), 3u);
}

// A process whose re-reads keep finding nothing new (garbage addresses in its stacks) is read ever
// more rarely, up to the cap; a re-read that finds code brings the fast rate back.
TEST(MapsReread, BacksOffWhileNothingNewIsFound) {
  MapsRereadLimiter lim;
  constexpr uint64_t dt = MapsRereadLimiter::kMapsRereadIntervalNs;
  constexpr uint64_t cap = MapsRereadLimiter::kMapsRereadMaxIntervalNs;
  uint64_t now = 0;
  int reads = 0;
  // Asked every 10 ms for 10 minutes, nothing new ever found.
  for (; now < 600 * 1'000'000'000ull; now += 10'000'000) {
    if (lim.allow(3, now)) {
      ++reads;
      lim.note(3, false);
    }
  }
  EXPECT_EQ(lim.interval_ns(3), cap);
  // Doubling from 200 ms reaches 30 s within ~8 re-reads (plus the first burst); then one per 30 s.
  EXPECT_LT(reads, 8 + 8 + 600 / 30 + 2) << "the fixed rate would have been 3000";
  EXPECT_GT(reads, 600 / 30 - 2) << "still read: a library loaded late gets named";
  lim.note(3, true);
  EXPECT_EQ(lim.interval_ns(3), dt) << "new code found: the fast rate again";
  EXPECT_EQ(lim.interval_ns(4), dt) << "other processes keep theirs";
}

// The normalizer applies the check to the kernel's walk (a sample without a stack copy, as the
// frame-pointer mode and a stepped-down budget give): a heap address repeated 127 times becomes
// the two frames before it.
__attribute__((noinline)) uint64_t code_address() { return reinterpret_cast<uint64_t>(&code_address); }

TEST(FrameChain, NormalizerCutsTheKernelWalk) {
  Normalizer n;
  uint32_t pid = static_cast<uint32_t>(getpid());
  n.learn_process(pid);
  std::vector<int> heap(64);
  uint64_t heap_addr = reinterpret_cast<uint64_t>(heap.data());
  uint64_t code = code_address();
  uint64_t libc = reinterpret_cast<uint64_t>(&::abort) + 1;
  SampleEvent e;
  e.pid = pid;
  e.tid = pid;
  e.ustack.push_back(RawUserFrame{false, {}, code});
  e.ustack.push_back(RawUserFrame{false, {}, libc});
  for (int i = 0; i < 125; ++i) e.ustack.push_back(RawUserFrame{false, {}, heap_addr});
  UserStack out;
  n.unwind(e, out);
  ASSERT_EQ(out.native.size(), 2u);
  EXPECT_EQ(out.native[0].offset_or_ip, code);
  EXPECT_EQ(out.native[1].offset_or_ip, libc);
  EXPECT_EQ(n.unwind_counters().fp_chains_cut, 1u);
  EXPECT_EQ(n.unwind_counters().fp_frames_cut, 125u);
  // A chain all in code is left alone.
  e.ustack.resize(2);
  n.unwind(e, out);
  EXPECT_EQ(out.native.size(), 2u);
  EXPECT_EQ(n.unwind_counters().fp_chains_cut, 1u);
}

// The adaptive mode: the kernel is told, per process, which executable mappings belong to modules
// that keep frame pointers (STRATA_KCFI_NO_MODULE: the walk may stand alone there) -- only modules
// the node has read; the rest ask for a stack copy. Reading modules (a copy's walk) sends it again.
__attribute__((noinline)) void snapshot_here(SampleEvent& e) {
  uint64_t ip, sp, bp;
  asm volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(ip), "=r"(sp), "=r"(bp));
  e.has_regs = true;
  e.ip = ip;
  e.sp = sp;
  e.bp = bp;
  e.stack_base = sp;
  uint64_t top = sp + 16384;
  auto maps = read_proc_maps(static_cast<uint32_t>(getpid()));
  if (maps) {
    for (const auto& m : *maps)
      if (sp >= m.start && sp < m.end) top = std::min(top, m.end);
  }
  e.stack.resize(top - sp);
  const volatile uint8_t* p = reinterpret_cast<const volatile uint8_t*>(sp);
  for (size_t i = 0; i < e.stack.size(); ++i) e.stack[i] = p[i];
}

TEST(AdaptiveUnwind, TheKernelLearnsWhichModulesKeepFramePointers) {
  Normalizer n;
  std::vector<strata_proc_mappings> pushed;
  n.set_kernel_unwind(KernelUnwindHooks{nullptr,
                                        [&](uint32_t, const strata_proc_mappings* m) {
                                          if (m) pushed.push_back(*m);
                                          return true;
                                        },
                                        /*tables=*/false});
  uint32_t pid = static_cast<uint32_t>(getpid());
  n.learn_process(pid);
  ASSERT_EQ(pushed.size(), 1u);
  ASSERT_GT(pushed[0].n, 0u);
  for (uint32_t i = 0; i < pushed[0].n; ++i)
    EXPECT_EQ(pushed[0].m[i].module_id, STRATA_KCFI_NO_TABLE) << "nothing read yet: every module asks for a copy";
  SampleEvent e;
  e.pid = pid;
  e.tid = pid;
  snapshot_here(e);
  UserStack out;
  n.unwind(e, out);
  EXPECT_GT(out.native.size(), 2u);
  ASSERT_EQ(pushed.size(), 2u) << "the walk read modules: the list goes to the kernel again";
  // Each mapping's decision is the module's own (its .eh_frame), for the modules the walk read.
  auto maps = read_proc_maps(pid);
  ASSERT_TRUE(maps);
  const auto& pm = pushed[1];
  size_t fp = 0, copy = 0;
  for (uint32_t i = 0; i < pm.n; ++i) {
    const Mapping* m = find_mapping(*maps, pm.m[i].start);
    ASSERT_NE(m, nullptr);
    if (pm.m[i].module_id == STRATA_KCFI_NO_MODULE) {
      auto mod = unwind::load_module_unwind(m->path);
      ASSERT_TRUE(mod) << m->path;
      EXPECT_EQ((*mod)->method, unwind::ModuleMethod::kFramePointer) << m->path;
      fp++;
    } else {
      EXPECT_EQ(pm.m[i].module_id, STRATA_KCFI_NO_TABLE);
      copy++;
    }
  }
  // The walk went through libc (no frame pointers on Debian) at least: it must ask for a copy.
  const Mapping* libc = find_mapping(*maps, reinterpret_cast<uint64_t>(&::abort));
  ASSERT_NE(libc, nullptr);
  for (uint32_t i = 0; i < pm.n; ++i) {
    if (pm.m[i].start <= libc->start && libc->start < pm.m[i].end) {
      auto mod = unwind::load_module_unwind(libc->path);
      ASSERT_TRUE(mod);
      EXPECT_EQ(pm.m[i].module_id == STRATA_KCFI_NO_MODULE, (*mod)->method == unwind::ModuleMethod::kFramePointer);
    }
  }
  EXPECT_EQ(fp + copy, pm.n);
}

std::string exe_of(pid_t pid) {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).string();
}

// A process recognized as CPython that execs another program: its Python registration is dropped
// (else the kernel side would read the new image's memory with the old interpreter's offsets), by
// the exec event or, when that was lost, by the next look at its maps.
TEST(PythonDetection, ForgottenAfterExec) {
  const char* python = "/usr/bin/python3";
  if (access(python, X_OK) != 0) GTEST_SKIP() << "needs Debian's /usr/bin/python3";
  for (bool exec_event : {true, false}) {
    SCOPED_TRACE(exec_event ? "exec event" : "exec event lost");
    int pipefd[2];
    ASSERT_EQ(pipe(pipefd), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      dup2(pipefd[0], 0);
      close(pipefd[1]);
      // Waits for a line on stdin, then becomes /bin/sleep.
      execl(python, python, "-c", "import os,sys; sys.stdin.readline(); os.execv('/bin/sleep', ['sleep', '30'])",
            nullptr);
      _exit(127);
    }
    close(pipefd[0]);
    // Until the interpreter's image is in place (its own exec from the test's fork).
    for (int i = 0; i < 500 && exe_of(pid).find("python") == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    Normalizer n;
    std::vector<std::pair<uint32_t, bool>> calls;
    n.set_python_hook([&](uint32_t p, const strata_py_offsets* o) { calls.emplace_back(p, o != nullptr); });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its maps complete (libpython, if any)
    n.learn_process(static_cast<uint32_t>(pid));
    ASSERT_EQ(calls.size(), 1u) << "recognized as CPython";
    EXPECT_TRUE(calls[0].second);
    ASSERT_EQ(write(pipefd[1], "\n", 1), 1);
    close(pipefd[1]);
    for (int i = 0; i < 500 && exe_of(pid) != "/usr/bin/sleep" && exe_of(pid) != "/bin/sleep"; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (exec_event) n.process_exec(static_cast<uint32_t>(pid));
    n.learn_process(static_cast<uint32_t>(pid));
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    ASSERT_EQ(calls.size(), 2u) << "told once to forget the interpreter";
    EXPECT_EQ(calls[1].first, static_cast<uint32_t>(pid));
    EXPECT_FALSE(calls[1].second);
  }
}

}  // namespace
}  // namespace strata::agent
