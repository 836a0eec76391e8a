// CFI parsing into compact unwind rows: a hand-made .eh_frame, this test's own binary, and hostile
// input (mutated and truncated sections must parse or fail, never crash).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "unwind/cfi.h"
#include "unwind/module_tables.h"

namespace strata::unwind {
namespace {

// CIE: version 1, "zR", code align 1, data align -8, RA = r16, FDE pointers pcrel|sdata4;
// initial rules CFA = rsp+8, RA at CFA-8.
std::vector<uint8_t> handmade_eh_frame() {
  std::vector<uint8_t> s = {
      0x14, 0, 0, 0,  // CIE length 20
      0, 0, 0, 0,     // CIE id
      1, 'z', 'R', 0, 1, 0x78, 16, 1, 0x1b,
      0x0c, 7, 8,     // def_cfa rsp 8
      0x90, 1,        // offset r16 at cfa-8
      0, 0,           // pad
  };
  // FDE at offset 24: a function at vaddr 0x1000 (the section sits at vaddr 0x400), 0x40 bytes.
  std::vector<uint8_t> fde_insns = {
      0x41,           // advance 1: after push rbp
      0x0e, 16,       // def_cfa_offset 16
      0x86, 2,        // rbp at cfa-16
      0x43,           // advance 3: after mov rsp, rbp
      0x0d, 6,        // def_cfa_register rbp
      0x50 | 0x0c,    // advance 12... (0x40 | 0x1c)
  };
  fde_insns.back() = 0x40 | 0x1c;  // advance 28
  fde_insns.insert(fde_insns.end(), {0x0c, 7, 8});  // def_cfa rsp 8 (after leave)
  uint32_t len = static_cast<uint32_t>(4 + 4 + 4 + 1 + fde_insns.size());
  size_t fde_at = s.size();
  auto put32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  put32(len);
  put32(static_cast<uint32_t>(fde_at + 4));  // back to the CIE
  int32_t pcrel = static_cast<int32_t>(0x1000 - (0x400 + s.size()));
  put32(static_cast<uint32_t>(pcrel));
  put32(0x40);
  s.push_back(0);  // augmentation data length
  s.insert(s.end(), fde_insns.begin(), fde_insns.end());
  put32(0);  // terminator
  return s;
}

TEST(Cfi, HandmadeFunctionGivesItsRows) {
  auto bytes = handmade_eh_frame();
  UnwindTable t;
  ASSERT_TRUE(parse_cfi(CfiSection{bytes, 0x400, false}, CfiLimits{}, t).ok());
  finish_table(t);
  EXPECT_EQ(t.stats.fdes, 1u);
  EXPECT_EQ(t.stats.fdes_skipped, 0u);
  ASSERT_NE(t.find(0x1000), nullptr);
  EXPECT_EQ(t.find(0x1000)->cfa_rule, CfaRule::kRsp);
  EXPECT_EQ(t.find(0x1000)->cfa_offset, 8);
  EXPECT_EQ(t.find(0x1001)->cfa_offset, 16);
  EXPECT_EQ(t.find(0x1001)->rbp_rule, RbpRule::kOffset);
  EXPECT_EQ(t.find(0x1001)->rbp_offset, -16);
  EXPECT_EQ(t.find(0x1004)->cfa_rule, CfaRule::kRbp);
  EXPECT_EQ(t.find(0x1004)->cfa_offset, 16);
  EXPECT_EQ(t.find(0x1020)->cfa_rule, CfaRule::kRsp);
  EXPECT_EQ(t.find(0x103f)->cfa_offset, 8);
  EXPECT_EQ(t.find(0x1040), nullptr) << "past the function: no rule";
  EXPECT_EQ(t.find(0xfff), nullptr);
}

__attribute__((noinline)) int probe_function(int x) { return x * 3 + 1; }

TEST(Cfi, OwnBinaryHasRowsAtItsFunctions) {
  auto m = load_module_unwind("/proc/self/exe", ModuleOptions{CfiLimits{}, /*prefer_frame_pointers=*/false});
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->method, ModuleMethod::kCfi);
  EXPECT_GT((*m)->table.rows.size(), 100u);
  EXPECT_GT((*m)->cfi_bytes, 0u);
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&probe_function), &info), 0);
  uint64_t vaddr = reinterpret_cast<uint64_t>(&probe_function) - reinterpret_cast<uint64_t>(info.dli_fbase);
  const UnwindRow* row = (*m)->table.find(vaddr);
  ASSERT_NE(row, nullptr);
  // At a function's first instruction the return address is on top of the stack.
  EXPECT_EQ(row->cfa_rule, CfaRule::kRsp);
  EXPECT_EQ(row->cfa_offset, 8);
  // strata's own code keeps frame pointers (statically linked gtest may not): some FDEs say so.
  EXPECT_GT((*m)->table.stats.fdes_with_rbp_cfa, 0u);
}

TEST(Cfi, GlibcWithoutFramePointersUsesCfi) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&qsort), &info), 0);
  auto m = load_module_unwind(info.dli_fname);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->method, ModuleMethod::kCfi) << info.dli_fname;
  // Compact: well under the section's own size per row.
  EXPECT_LT((*m)->table.memory_bytes(), (*m)->cfi_bytes * 3);
}

std::vector<uint8_t> own_image() {
  // A real ELF file, damaged below: headers, section table and CFI all get hit.
  std::ifstream in("/proc/self/exe", std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

TEST(Cfi, HostileInputNeverCrashes) {
  auto base = handmade_eh_frame();
  std::mt19937 rng(1234);
  for (int round = 0; round < 20000; ++round) {
    auto bytes = base;
    int flips = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < flips; ++i) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    UnwindTable t;
    CfiLimits limits;
    limits.max_rows = 1000;
    (void)parse_cfi(CfiSection{bytes, rng() % 2 ? 0x400ull : 0xffffffffff000000ull, (rng() % 3) == 0}, limits, t);
    finish_table(t);
    EXPECT_LE(t.rows.size(), 1000u + 2);
  }
  std::vector<uint8_t> junk(4096);
  for (auto& b : junk) b = static_cast<uint8_t>(rng());
  UnwindTable t;
  (void)parse_cfi(CfiSection{junk, 0, false}, CfiLimits{}, t);
  (void)parse_cfi(CfiSection{junk, 0, true}, CfiLimits{}, t);
}

TEST(Cfi, HostileElfNeverCrashes) {
  auto image = own_image();
  ASSERT_GT(image.size(), 4096u);
  std::mt19937 rng(99);
  for (int round = 0; round < 300; ++round) {
    auto bytes = image;
    for (int i = 0; i < 64; ++i) bytes[rng() % std::min<size_t>(bytes.size(), 8192)] = static_cast<uint8_t>(rng());
    for (int i = 0; i < 64; ++i) bytes[rng() % bytes.size()] = static_cast<uint8_t>(rng());
    (void)load_module_unwind_image(bytes, "mutated");
  }
}

TEST(ModuleCache, StaysInsideItsBudget) {
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&qsort), &info), 0);
  ModuleCache small(64 * 1024, ModuleOptions{CfiLimits{}, false});
  auto libc = small.get("libc", info.dli_fname);
  ASSERT_NE(libc, nullptr);
  EXPECT_LE(small.memory_bytes(), 64u * 1024);
  auto self = small.get("self", "/proc/self/exe");
  EXPECT_LE(small.memory_bytes(), 64u * 1024);
  EXPECT_EQ(small.get("missing", "/nonexistent"), nullptr);
  EXPECT_GE(small.builds(), 3u);
  // libc's rows alone are more than the budget: it was cut to fit, and pushed out by the others.
  EXPECT_LE(libc->memory_bytes(), 64u * 1024);
  EXPECT_GE(small.evictions(), 1u);
  EXPECT_LE(small.peak_bytes(), 64u * 1024);
  // Asked again: rebuilt, and the cache still inside its budget.
  uint64_t builds = small.builds();
  ASSERT_NE(small.get("libc", info.dli_fname), nullptr);
  EXPECT_EQ(small.builds(), builds + 1);
  EXPECT_LE(small.peak_bytes(), 64u * 1024);
}

}  // namespace
}  // namespace strata::unwind
