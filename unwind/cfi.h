// DWARF call frame information (.eh_frame, .debug_frame) turned into a compact x86-64 unwind table:
// for each address range of a module, how to find the canonical frame address (CFA) and the
// caller's rbp. That is all an x86-64 unwinder needs: the return address is always at CFA-8.
// Parsing is bounded and checked: hostile input gives an Error or a shorter table, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/result.h"

namespace strata::unwind {

enum class CfaRule : uint8_t {
  kInvalid = 0,   // no CFI here (a gap between functions, or what we cannot express): stop
  kRsp = 1,       // CFA = rsp + cfa_offset
  kRbp = 2,       // CFA = rbp + cfa_offset
  kPltExpr = 3,   // the PLT's expression: CFA = rsp + 8 + ((rip & 15) >= 11 ? 8 : 0)
  kEndOfStack = 4,  // return address undefined: the outermost frame (_start, thread start)
};

enum class RbpRule : uint8_t {
  kSame = 0,     // rbp unchanged in the caller
  kOffset = 1,   // caller's rbp saved at CFA + rbp_offset
  kUnknown = 2,  // an expression or register we do not track: the caller's rbp is lost
};

// One row: applies from `pc` (ELF virtual address, below 4 GiB) up to the next row's pc.
// 12 bytes; rows repeat only where the rule changes.
struct UnwindRow {
  uint32_t pc = 0;
  int32_t cfa_offset = 0;
  int16_t rbp_offset = 0;
  CfaRule cfa_rule = CfaRule::kInvalid;
  RbpRule rbp_rule = RbpRule::kSame;

  bool operator==(const UnwindRow&) const = default;
};
static_assert(sizeof(UnwindRow) == 12, "unwind rows must stay compact");

struct CfiStats {
  size_t cies = 0;
  size_t fdes = 0;
  size_t fdes_skipped = 0;       // malformed, above 4 GiB, or with instructions we reject
  size_t fdes_with_rbp_cfa = 0;  // functions that set up a frame pointer (CFA from rbp)
};

struct UnwindTable {
  std::vector<UnwindRow> rows;  // sorted by pc
  CfiStats stats;
  // (Nearly) every function defines the CFA through rbp: the module keeps frame pointers and the
  // cheaper frame-pointer walk, which needs no rows in memory, is correct for it.
  bool keeps_frame_pointers() const;
  size_t memory_bytes() const { return rows.capacity() * sizeof(UnwindRow) + sizeof(*this); }
  // The row covering vaddr, or nullptr.
  const UnwindRow* find(uint64_t vaddr) const;
};

struct CfiSection {
  std::span<const uint8_t> bytes;
  uint64_t vaddr = 0;         // where the section is loaded (pc-relative pointers need it)
  bool debug_frame = false;   // .debug_frame: CIE id 0xffffffff, absolute addresses
};

struct CfiLimits {
  size_t max_rows = 8u << 20;            // 96 MiB at most; callers pass a smaller budget
  size_t max_instructions_per_fde = 4096;  // a real FDE has tens
};

// Appends the rows of one section's FDEs to `table` (call for .eh_frame, then .debug_frame, then
// finish_table). Fails only when the section cannot be read at all; bad FDEs are skipped and counted.
Status parse_cfi(const CfiSection& section, const CfiLimits& limits, UnwindTable& table);
// Sorts rows, drops overlaps and repeats. Call once after the last parse_cfi.
void finish_table(UnwindTable& table);

}  // namespace strata::unwind
