// The snapshot unwinder on this very process: a chain of functions built without frame pointers
// (-fomit-frame-pointer on this file) captures its registers and copies its stack, and the
// unwinder must find every caller, in order, down to the program's entry. No root needed.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "unwind/stack_unwinder.h"

namespace strata::unwind {
namespace {

struct Capture {
  Registers regs;
  uint64_t base = 0;
  std::vector<uint8_t> stack;
};

struct Map {
  uint64_t start, end, offset;
  std::string path;
};

std::vector<Map> self_maps() {
  std::vector<Map> maps;
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string range, perms, off, dev, inode, path;
    ss >> range >> perms >> off >> dev >> inode;
    std::getline(ss >> std::ws, path);
    auto dash = range.find('-');
    Map m{std::stoull(range.substr(0, dash), nullptr, 16), std::stoull(range.substr(dash + 1), nullptr, 16),
          std::stoull(off, nullptr, 16), path};
    if (perms.find('x') != std::string::npos || path == "[stack]") maps.push_back(m);
  }
  return maps;
}

class SelfSpace : public AddressSpace {
 public:
  SelfSpace() : maps_(self_maps()), cache_(256u << 20) {}
  bool find(uint64_t addr, MappedModule& out) override {
    for (const auto& m : maps_) {
      if (addr < m.start || addr >= m.end || m.path.empty() || m.path[0] != '/') continue;
      auto mod = cache_.get(m.path, m.path);
      if (!mod) return false;
      held_.push_back(mod);
      out.start = m.start;
      out.file_offset = m.offset;
      out.module = mod.get();
      return true;
    }
    return false;
  }
  const std::vector<Map>& maps() const { return maps_; }

 private:
  std::vector<Map> maps_;
  ModuleCache cache_;
  std::vector<std::shared_ptr<const ModuleUnwind>> held_;
};

Capture* g_capture;

// The stack is copied as the kernel copies it: raw bytes, redzones and dead frames included. ASan
// would call that an overflow, so this one copy is not instrumented (a plain loop: memcpy is
// intercepted whatever the attribute says).
__attribute__((no_sanitize("address"), noinline)) void copy_raw_stack(uint8_t* dst, uint64_t src, size_t n) {
  const volatile uint8_t* p = reinterpret_cast<const volatile uint8_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = p[i];
}

extern "C" __attribute__((noinline)) void take_snapshot() {
  Capture& c = *g_capture;
  uint64_t ip, sp, bp;
  asm volatile("lea 0(%%rip), %0\n\tmov %%rsp, %1\n\tmov %%rbp, %2" : "=r"(ip), "=r"(sp), "=r"(bp));
  c.regs = {ip, sp, bp};
  c.base = sp;
  // Up to the stack's top: the main thread's [stack] mapping.
  uint64_t top = sp + 64 * 1024;
  for (const auto& m : self_maps()) {
    if (sp >= m.start && sp < m.end) top = std::min(top, m.end);
  }
  c.stack.resize(top - sp);
  copy_raw_stack(c.stack.data(), sp, c.stack.size());
  asm volatile("" ::: "memory");
}

volatile int g_sink;
extern "C" void take_snapshot_adapter(int);
#define LINK(name, next)                                        \
  extern "C" __attribute__((noinline)) void name(int depth) {   \
    char pad[24 + (depth & 7)];                                 \
    std::memset(pad, depth, sizeof pad);                        \
    next(depth + 1);                                            \
    g_sink = g_sink + pad[depth & 7];                           \
  }
LINK(chain_06, take_snapshot_adapter)
LINK(chain_05, chain_06)
LINK(chain_04, chain_05)
LINK(chain_03, chain_04)
LINK(chain_02, chain_03)
LINK(chain_01, chain_02)

extern "C" __attribute__((noinline)) void take_snapshot_adapter(int) {
  take_snapshot();
  g_sink = g_sink + 1;
}

int compare(const void* a, const void* b) {
  static bool once = false;
  if (!once) {
    once = true;
    chain_01(0);  // from inside glibc's qsort: its frames have CFI only
  }
  return *static_cast<const int*>(a) - *static_cast<const int*>(b);
}

std::string name_of(uint64_t ip) {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(ip - 1), &info) == 0 || !info.dli_sname) return "?";
  return info.dli_sname;
}

TEST(StackUnwinder, WalksAChainWithoutFramePointersThroughQsort) {
#if defined(__SANITIZE_ADDRESS__)
  // ASan replaces qsort with its interceptor: the chain would not pass through glibc's CFI.
  GTEST_SKIP() << "qsort is ASan's interceptor in this build";
#endif
  Capture cap;
  g_capture = &cap;
  int values[] = {3, 1, 2};
  qsort(values, 3, sizeof(int), compare);
  ASSERT_FALSE(cap.stack.empty());
  SelfSpace space;
  UnwoundStack out;
  unwind_stack(cap.regs, StackSnapshot{cap.base, cap.stack}, space, 128, out);
  std::vector<std::string> names;
  for (size_t i = 1; i < out.ips.size(); ++i) names.push_back(name_of(out.ips[i]));
  std::string all;
  for (const auto& n : names) all += n + " ";
  const std::vector<std::string> want = {"take_snapshot_adapter", "chain_06", "chain_05", "chain_04",
                                         "chain_03", "chain_02", "chain_01"};
  ASSERT_GE(names.size(), want.size()) << all;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(names[i], want[i]) << all;
  // Then glibc's qsort internals, the test body, gtest, main, __libc_start_main: to the end.
  EXPECT_NE(all.find("qsort"), std::string::npos) << all;
  EXPECT_EQ(out.stop, StopReason::kEndOfStack) << stop_reason_name(out.stop) << ": " << all;
  EXPECT_GT(out.cfi_frames, 0u);
}

TEST(StackUnwinder, StopsAtTheEndOfATruncatedSnapshot) {
  Capture cap;
  g_capture = &cap;
  chain_01(0);
  SelfSpace space;
  UnwoundStack out;
  std::span<const uint8_t> part(cap.stack.data(), 64);
  unwind_stack(cap.regs, StackSnapshot{cap.base, part}, space, 128, out);
  EXPECT_EQ(out.stop, StopReason::kOutsideSnapshot);
  EXPECT_LE(out.ips.size(), 4u);
}

TEST(StackUnwinder, GarbageStackNeverCrashes) {
  SelfSpace space;
  std::vector<uint8_t> junk(8192);
  uint64_t seed = 7;
  for (int round = 0; round < 200; ++round) {
    for (auto& b : junk) b = static_cast<uint8_t>((seed = seed * 6364136223846793005ull + 1) >> 56);
    // Plant plausible return addresses into our own text.
    for (size_t i = 0; i + 8 <= junk.size(); i += 64) {
      uint64_t v = reinterpret_cast<uint64_t>(&compare) + (seed >> 40) % 4096;
      std::memcpy(junk.data() + i, &v, 8);
    }
    UnwoundStack out;
    Registers r{reinterpret_cast<uint64_t>(&compare) + 5, 0x10000, 0x10000 + (seed >> 50)};
    unwind_stack(r, StackSnapshot{0x10000, junk}, space, 64, out);
    EXPECT_LE(out.ips.size(), 64u);
  }
}

}  // namespace
}  // namespace strata::unwind
