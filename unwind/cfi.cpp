#include "unwind/cfi.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>

namespace strata::unwind {
namespace {

// x86-64 DWARF register numbers.
constexpr uint64_t kRegRbp = 6;
constexpr uint64_t kRegRsp = 7;
constexpr uint64_t kRegRa = 16;

// A reader that never goes past its end: every read reports failure through ok().
class Reader {
 public:
  Reader(std::span<const uint8_t> bytes, size_t pos = 0) : bytes_(bytes), pos_(pos) {
    if (pos_ > bytes_.size()) {  // a start past the end (an offset from hostile input) reads nothing
      pos_ = bytes_.size();
      ok_ = false;
    }
  }
  bool ok() const { return ok_; }
  size_t pos() const { return pos_; }
  size_t size() const { return bytes_.size(); }
  bool at_end() const { return pos_ >= bytes_.size(); }
  void seek(size_t pos) {
    if (pos > bytes_.size()) ok_ = false;
    else pos_ = pos;
  }

  template <typename T>
  T fixed() {
    T v{};
    if (!ok_ || bytes_.size() - pos_ < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  uint64_t uleb() {
    uint64_t v = 0;
    for (unsigned shift = 0;; shift += 7) {
      uint8_t b = fixed<uint8_t>();
      if (!ok_) return 0;
      if (shift < 64) v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
      if (shift > 70) {  // longer than any real LEB128
        ok_ = false;
        return 0;
      }
    }
  }
  int64_t sleb() {
    uint64_t v = 0;
    unsigned shift = 0;
    uint8_t b = 0;
    do {
      b = fixed<uint8_t>();
      if (!ok_) return 0;
      if (shift < 64) v |= static_cast<uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if (shift > 77) {
        ok_ = false;
        return 0;
      }
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40)) v |= ~0ull << shift;
    return static_cast<int64_t>(v);
  }
  std::string cstring() {
    std::string s;
    while (true) {
      char c = static_cast<char>(fixed<uint8_t>());
      if (!ok_ || c == 0) return s;
      if (s.size() > 16) {  // augmentation strings are a few letters
        ok_ = false;
        return s;
      }
      s.push_back(c);
    }
  }
  std::span<const uint8_t> bytes(size_t n) {
    if (!ok_ || bytes_.size() - pos_ < n) {
      ok_ = false;
      return {};
    }
    auto s = bytes_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  bool ok_ = true;
};

// DW_EH_PE_* pointer encodings (.eh_frame); .debug_frame uses plain 8-byte addresses.
constexpr uint8_t kPeOmit = 0xff;

std::optional<uint64_t> read_encoded(Reader& r, uint8_t enc, uint64_t section_vaddr, bool apply_rel) {
  if (enc == kPeOmit) return std::nullopt;
  uint64_t field_vaddr = section_vaddr + r.pos();
  uint64_t v = 0;
  switch (enc & 0x0f) {
    case 0x00: v = r.fixed<uint64_t>(); break;
    case 0x01: v = r.uleb(); break;
    case 0x02: v = r.fixed<uint16_t>(); break;
    case 0x03: v = r.fixed<uint32_t>(); break;
    case 0x04: v = r.fixed<uint64_t>(); break;
    case 0x09: v = static_cast<uint64_t>(r.sleb()); break;
    case 0x0a: v = static_cast<uint64_t>(static_cast<int64_t>(r.fixed<int16_t>())); break;
    case 0x0b: v = static_cast<uint64_t>(static_cast<int64_t>(r.fixed<int32_t>())); break;
    case 0x0c: v = r.fixed<uint64_t>(); break;
    default: return std::nullopt;
  }
  if (!r.ok()) return std::nullopt;
  if (!apply_rel) return v;
  switch (enc & 0x70) {
    case 0x00: break;
    case 0x10: v += field_vaddr; break;  // pcrel: the only relative form compilers emit in FDEs
    default: return std::nullopt;        // textrel/datarel/funcrel: not used for FDE addresses
  }
  return v;
}

struct Cie {
  uint64_t code_align = 1;
  int64_t data_align = -8;
  uint64_t ra_reg = kRegRa;
  uint8_t fde_encoding = 0;  // absptr
  bool has_augmentation_data = false;
  bool signal_frame = false;
  std::span<const uint8_t> initial_instructions;
};

// The register state the CFA program tracks: only what an x86-64 unwinder needs.
struct State {
  uint64_t cfa_reg = kRegRsp;
  int64_t cfa_offset = 8;
  enum class Cfa : uint8_t { kReg, kPlt, kOther } cfa = Cfa::kReg;
  RbpRule rbp = RbpRule::kSame;
  int64_t rbp_offset = 0;
  bool ra_undefined = false;
  bool ra_ok = true;  // the return address sits at CFA-8, as the ABI says
};

// The expression GCC and clang emit for .plt entries: rsp + 8 + ((rip & 15) >= 11) << 3.
bool is_plt_expression(std::span<const uint8_t> e) {
  static constexpr std::array<uint8_t, 11> kPlt11 = {0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22};
  static constexpr std::array<uint8_t, 11> kPlt10 = {0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3a, 0x2a, 0x33, 0x24, 0x22};
  return std::equal(e.begin(), e.end(), kPlt11.begin(), kPlt11.end()) ||
         std::equal(e.begin(), e.end(), kPlt10.begin(), kPlt10.end());
}

UnwindRow to_row(uint64_t pc, const State& s) {
  UnwindRow row;
  row.pc = static_cast<uint32_t>(pc);
  if (s.ra_undefined) {
    row.cfa_rule = CfaRule::kEndOfStack;
    return row;
  }
  if (!s.ra_ok) return row;  // kInvalid
  if (s.cfa == State::Cfa::kPlt) {
    row.cfa_rule = CfaRule::kPltExpr;
  } else if (s.cfa == State::Cfa::kReg && (s.cfa_reg == kRegRsp || s.cfa_reg == kRegRbp) &&
             s.cfa_offset >= std::numeric_limits<int32_t>::min() && s.cfa_offset <= std::numeric_limits<int32_t>::max()) {
    row.cfa_rule = s.cfa_reg == kRegRsp ? CfaRule::kRsp : CfaRule::kRbp;
    row.cfa_offset = static_cast<int32_t>(s.cfa_offset);
  } else {
    return row;  // kInvalid: a CFA we cannot compute
  }
  row.rbp_rule = s.rbp;
  if (s.rbp == RbpRule::kOffset) {
    if (s.rbp_offset < std::numeric_limits<int16_t>::min() || s.rbp_offset > std::numeric_limits<int16_t>::max()) {
      row.rbp_rule = RbpRule::kUnknown;
    } else {
      row.rbp_offset = static_cast<int16_t>(s.rbp_offset);
    }
  }
  return row;
}

class FdeRunner {
 public:
  FdeRunner(const Cie& cie, const CfiLimits& limits, std::vector<UnwindRow>& out)
      : cie_(cie), limits_(limits), out_(out) {}

  // Runs the CIE's initial instructions, then the FDE's; appends rows for [begin, end).
  bool run(uint64_t begin, uint64_t end, std::span<const uint8_t> fde_insns, bool& used_rbp_cfa) {
    loc_ = begin;
    end_ = end;
    if (!exec(cie_.initial_instructions, /*initial=*/true)) return false;
    initial_ = state_;
    size_t first = out_.size();
    if (!exec(fde_insns, /*initial=*/false)) {
      out_.resize(first);
      return false;
    }
    emit();
    UnwindRow gap;
    gap.pc = static_cast<uint32_t>(end);
    out_.push_back(gap);
    used_rbp_cfa = used_rbp_cfa_;
    return true;
  }

 private:
  void emit() {
    if (loc_ >= end_) return;
    UnwindRow row = to_row(loc_, state_);
    if (!out_.empty() && out_.back().pc == row.pc && rows_emitted_) {
      out_.back() = row;  // several rules changed at one address: the last wins
    } else {
      out_.push_back(row);
    }
    rows_emitted_ = true;
  }
  bool advance(uint64_t delta) {
    emit();
    uint64_t step = delta * cie_.code_align;
    if (step > end_ - std::min(loc_, end_)) step = end_ - std::min(loc_, end_);
    loc_ += step;
    return out_.size() < limits_.max_rows;
  }
  // factored * data_align, both from the file: saturated instead of overflowing (undefined
  // behaviour), so a hostile value becomes an offset that to_row() rejects as out of range.
  int64_t scaled(int64_t factored) const {
    int64_t out = 0;
    if (__builtin_mul_overflow(factored, cie_.data_align, &out))
      return (factored < 0) != (cie_.data_align < 0) ? std::numeric_limits<int64_t>::min()
                                                     : std::numeric_limits<int64_t>::max();
    return out;
  }
  void set_reg_offset(uint64_t reg, int64_t factored) {
    int64_t off = scaled(factored);
    if (reg == kRegRbp) {
      state_.rbp = RbpRule::kOffset;
      state_.rbp_offset = off;
    } else if (reg == cie_.ra_reg) {
      state_.ra_ok = off == -8;
      state_.ra_undefined = false;
    }
  }
  void set_reg_unknown(uint64_t reg) {
    if (reg == kRegRbp) state_.rbp = RbpRule::kUnknown;
    else if (reg == cie_.ra_reg) state_.ra_ok = false;
  }
  void restore_reg(uint64_t reg) {
    if (reg == kRegRbp) {
      state_.rbp = initial_.rbp;
      state_.rbp_offset = initial_.rbp_offset;
    } else if (reg == cie_.ra_reg) {
      state_.ra_ok = initial_.ra_ok;
      state_.ra_undefined = initial_.ra_undefined;
    }
  }
  void def_cfa_reg(uint64_t reg) {
    state_.cfa = State::Cfa::kReg;
    state_.cfa_reg = reg;
    if (reg == kRegRbp) used_rbp_cfa_ = true;
  }

  bool exec(std::span<const uint8_t> insns, bool initial) {
    Reader r(insns);
    size_t count = 0;
    std::vector<State> stack;
    while (!r.at_end()) {
      if (++count > limits_.max_instructions_per_fde) return false;
      uint8_t op = r.fixed<uint8_t>();
      uint8_t low = op & 0x3f;
      switch (op >> 6) {
        case 1:  // DW_CFA_advance_loc
          if (initial || !advance(low)) return false;
          continue;
        case 2:  // DW_CFA_offset
          set_reg_offset(low, static_cast<int64_t>(r.uleb()));
          continue;
        case 3:  // DW_CFA_restore
          restore_reg(low);
          continue;
        default: break;
      }
      switch (op) {
        case 0x00: break;  // nop
        case 0x01:         // set_loc: only in odd hand-written CFI
          return false;
        case 0x02: if (initial || !advance(r.fixed<uint8_t>())) return false; break;
        case 0x03: if (initial || !advance(r.fixed<uint16_t>())) return false; break;
        case 0x04: if (initial || !advance(r.fixed<uint32_t>())) return false; break;
        case 0x05: {  // offset_extended
          uint64_t reg = r.uleb();
          set_reg_offset(reg, static_cast<int64_t>(r.uleb()));
          break;
        }
        case 0x06: restore_reg(r.uleb()); break;  // restore_extended
        case 0x07: {                              // undefined
          uint64_t reg = r.uleb();
          if (reg == cie_.ra_reg) state_.ra_undefined = true;
          else if (reg == kRegRbp) state_.rbp = RbpRule::kUnknown;
          break;
        }
        case 0x08: {  // same_value
          uint64_t reg = r.uleb();
          if (reg == kRegRbp) state_.rbp = RbpRule::kSame;
          break;
        }
        case 0x09: {  // register: rbp kept in another register; we do not track those
          uint64_t reg = r.uleb();
          r.uleb();
          set_reg_unknown(reg);
          break;
        }
        case 0x0a:  // remember_state
          if (stack.size() >= 16) return false;
          stack.push_back(state_);
          break;
        case 0x0b:  // restore_state
          if (stack.empty()) return false;
          state_ = stack.back();
          stack.pop_back();
          break;
        case 0x0c: {  // def_cfa
          uint64_t reg = r.uleb();
          def_cfa_reg(reg);
          state_.cfa_offset = static_cast<int64_t>(r.uleb());
          break;
        }
        case 0x0d: def_cfa_reg(r.uleb()); break;  // def_cfa_register
        case 0x0e:                                  // def_cfa_offset
          state_.cfa_offset = static_cast<int64_t>(r.uleb());
          break;
        case 0x0f: {  // def_cfa_expression
          uint64_t len = r.uleb();
          auto expr = r.bytes(static_cast<size_t>(std::min<uint64_t>(len, r.size())));
          state_.cfa = is_plt_expression(expr) ? State::Cfa::kPlt : State::Cfa::kOther;
          break;
        }
        case 0x10: {  // expression
          uint64_t reg = r.uleb();
          uint64_t len = r.uleb();
          r.bytes(static_cast<size_t>(std::min<uint64_t>(len, r.size())));
          set_reg_unknown(reg);
          break;
        }
        case 0x11: {  // offset_extended_sf
          uint64_t reg = r.uleb();
          set_reg_offset(reg, r.sleb());
          break;
        }
        case 0x12: {  // def_cfa_sf
          uint64_t reg = r.uleb();
          def_cfa_reg(reg);
          state_.cfa_offset = scaled(r.sleb());
          break;
        }
        case 0x13: state_.cfa_offset = scaled(r.sleb()); break;  // def_cfa_offset_sf
        case 0x14:                                                          // val_offset
        case 0x15: {                                                        // val_offset_sf
          uint64_t reg = r.uleb();
          if (op == 0x14) r.uleb();
          else r.sleb();
          set_reg_unknown(reg);
          break;
        }
        case 0x16: {  // val_expression
          uint64_t reg = r.uleb();
          uint64_t len = r.uleb();
          r.bytes(static_cast<size_t>(std::min<uint64_t>(len, r.size())));
          set_reg_unknown(reg);
          break;
        }
        case 0x2e: r.uleb(); break;  // GNU_args_size: no effect on the CFA
        case 0x2f: {                 // GNU_negative_offset_extended
          uint64_t reg = r.uleb();
          set_reg_offset(reg, -static_cast<int64_t>(r.uleb()));
          break;
        }
        default: return false;  // unknown opcode: its operand length is unknown too
      }
      if (!r.ok()) return false;
    }
    return r.ok();
  }

  const Cie& cie_;
  const CfiLimits& limits_;
  std::vector<UnwindRow>& out_;
  State state_;
  State initial_;
  uint64_t loc_ = 0;
  uint64_t end_ = 0;
  bool rows_emitted_ = false;
  bool used_rbp_cfa_ = false;
};

std::optional<Cie> parse_cie(std::span<const uint8_t> section, size_t start, size_t end, bool debug_frame,
                             uint64_t section_vaddr) {
  Reader r(section.first(end), start);
  Cie cie;
  uint8_t version = r.fixed<uint8_t>();
  if (version != 1 && version != 3 && version != 4) return std::nullopt;
  std::string aug = r.cstring();
  if (aug.find("eh") != std::string::npos) r.fixed<uint64_t>();  // old GCC's eh_ptr
  if (version >= 4) {
    uint8_t addr_size = r.fixed<uint8_t>();
    r.fixed<uint8_t>();  // segment selector size
    if (addr_size != 8) return std::nullopt;
  }
  cie.code_align = r.uleb();
  cie.data_align = r.sleb();
  cie.ra_reg = version == 1 ? r.fixed<uint8_t>() : r.uleb();
  if (cie.code_align == 0 || cie.code_align > 64) return std::nullopt;
  if (!debug_frame) cie.fde_encoding = 0;  // absptr unless 'R' says otherwise
  if (!aug.empty() && aug[0] == 'z') {
    cie.has_augmentation_data = true;
    uint64_t len = r.uleb();
    size_t data_end = r.pos() + static_cast<size_t>(std::min<uint64_t>(len, end));
    if (data_end > end) return std::nullopt;
    for (size_t i = 1; i < aug.size() && r.ok(); ++i) {
      switch (aug[i]) {
        case 'R': cie.fde_encoding = r.fixed<uint8_t>(); break;
        case 'L': r.fixed<uint8_t>(); break;
        case 'P': {
          uint8_t enc = r.fixed<uint8_t>();
          read_encoded(r, enc & 0x7f, section_vaddr, false);
          break;
        }
        case 'S': cie.signal_frame = true; break;
        default: break;  // unknown letters: the length tells where the data ends
      }
    }
    r.seek(data_end);
  } else if (!aug.empty()) {
    return std::nullopt;  // without 'z' an unknown augmentation hides the layout
  }
  if (!r.ok()) return std::nullopt;
  cie.initial_instructions = section.subspan(r.pos(), end - r.pos());
  return cie;
}

}  // namespace

Status parse_cfi(const CfiSection& section, const CfiLimits& limits, UnwindTable& table) {
  auto bytes = section.bytes;
  std::unordered_map<size_t, std::optional<Cie>> cies;
  Reader r(bytes);
  bool any = false;
  while (!r.at_end() && table.rows.size() < limits.max_rows) {
    size_t entry_start = r.pos();
    uint64_t length = r.fixed<uint32_t>();
    if (!r.ok()) break;
    bool dwarf64 = false;
    if (length == 0xffffffffu) {
      length = r.fixed<uint64_t>();
      dwarf64 = true;
    }
    if (length == 0) {
      if (!section.debug_frame) break;  // .eh_frame's terminator
      continue;
    }
    size_t id_pos = r.pos();
    if (length > bytes.size() - id_pos) break;  // runs past the section: nothing after it is trustworthy
    size_t entry_end = id_pos + static_cast<size_t>(length);
    uint64_t id = dwarf64 ? r.fixed<uint64_t>() : r.fixed<uint32_t>();
    if (!r.ok()) break;
    bool is_cie = section.debug_frame ? (id == (dwarf64 ? ~0ull : 0xffffffffull)) : id == 0;
    any = true;
    if (is_cie) {
      table.stats.cies++;
      cies[entry_start] = parse_cie(bytes, r.pos(), entry_end, section.debug_frame, section.vaddr);
      r.seek(entry_end);
      continue;
    }
    table.stats.fdes++;
    // The CIE: .eh_frame counts back from the id field, .debug_frame from the section start.
    size_t cie_pos;
    if (section.debug_frame) {
      cie_pos = static_cast<size_t>(id);
    } else {
      if (id > id_pos) {
        table.stats.fdes_skipped++;
        r.seek(entry_end);
        continue;
      }
      cie_pos = id_pos - static_cast<size_t>(id);
    }
    auto it = cies.find(cie_pos);
    if (it == cies.end()) {
      // A CIE after its FDE (legal in .debug_frame): parse it where it is.
      Reader cr(bytes, cie_pos);
      uint64_t clen = cr.fixed<uint32_t>();
      bool c64 = clen == 0xffffffffu;
      if (c64) clen = cr.fixed<uint64_t>();
      size_t cid = cr.pos();
      std::optional<Cie> cie;
      if (cr.ok() && clen <= bytes.size() - cid && clen >= (c64 ? 8u : 4u)) {
        cie = parse_cie(bytes, cid + (c64 ? 8 : 4), cid + static_cast<size_t>(clen), section.debug_frame,
                        section.vaddr);
      }
      it = cies.emplace(cie_pos, cie).first;
    }
    if (!it->second) {
      table.stats.fdes_skipped++;
      r.seek(entry_end);
      continue;
    }
    const Cie& cie = *it->second;
    Reader fr(bytes.first(entry_end), r.pos());
    uint8_t enc = section.debug_frame ? 0 : cie.fde_encoding;
    auto begin = read_encoded(fr, enc, section.vaddr, true);
    auto range = read_encoded(fr, enc & 0x0f, section.vaddr, false);
    if (cie.has_augmentation_data) {
      uint64_t len = fr.uleb();
      fr.seek(fr.pos() + static_cast<size_t>(std::min<uint64_t>(len, bytes.size())));
    }
    r.seek(entry_end);
    if (!begin || !range || !fr.ok() || *range == 0 || cie.signal_frame || *begin >= (1ull << 32) ||
        *range > (1ull << 32) - *begin) {
      table.stats.fdes_skipped++;
      continue;
    }
    FdeRunner runner(cie, limits, table.rows);
    bool rbp_cfa = false;
    if (!runner.run(*begin, *begin + *range, bytes.subspan(fr.pos(), entry_end - fr.pos()), rbp_cfa)) {
      table.stats.fdes_skipped++;
      continue;
    }
    if (rbp_cfa) table.stats.fdes_with_rbp_cfa++;
  }
  if (!any && !bytes.empty()) return Error{"no call frame entries in the section"};
  return {};
}

void finish_table(UnwindTable& table) {
  auto& rows = table.rows;
  // Where one function's end meets the next one's start, the start wins.
  std::stable_sort(rows.begin(), rows.end(), [](const UnwindRow& a, const UnwindRow& b) {
    if (a.pc != b.pc) return a.pc < b.pc;
    return (a.cfa_rule == CfaRule::kInvalid) < (b.cfa_rule == CfaRule::kInvalid);
  });
  std::vector<UnwindRow> out;
  out.reserve(rows.size());
  for (const auto& row : rows) {
    if (!out.empty() && out.back().pc == row.pc) continue;
    if (!out.empty()) {
      UnwindRow prev = out.back();
      prev.pc = row.pc;
      if (prev == row) continue;  // same rule as the row before: no new row needed
    }
    out.push_back(row);
  }
  out.shrink_to_fit();
  rows = std::move(out);
}

bool UnwindTable::keeps_frame_pointers() const {
  size_t counted = stats.fdes - stats.fdes_skipped;
  // Nearly all: one frameless function in the chain makes a frame-pointer walk skip its caller or
  // read garbage, while CFI is always right. Startup code (crt) keeps a few without.
  return counted >= 32 && stats.fdes_with_rbp_cfa * 100 >= counted * 97;
}

const UnwindRow* UnwindTable::find(uint64_t vaddr) const {
  if (vaddr >= (1ull << 32) || rows.empty()) return nullptr;
  auto pc = static_cast<uint32_t>(vaddr);
  auto it = std::upper_bound(rows.begin(), rows.end(), pc, [](uint32_t v, const UnwindRow& r) { return v < r.pc; });
  if (it == rows.begin()) return nullptr;
  --it;
  return it->cfa_rule == CfaRule::kInvalid ? nullptr : &*it;
}

}  // namespace strata::unwind
