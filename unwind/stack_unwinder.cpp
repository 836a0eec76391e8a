#include "unwind/stack_unwinder.h"

#include <cstring>

namespace strata::unwind {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::kEndOfStack: return "end-of-stack";
    case StopReason::kOutsideSnapshot: return "outside-snapshot";
    case StopReason::kNoModule: return "no-module";
    case StopReason::kNoUnwindInfo: return "no-unwind-info";
    case StopReason::kBadFrame: return "bad-frame";
    case StopReason::kMaxDepth: return "max-depth";
  }
  return "?";
}

bool StackSnapshot::read_u64(uint64_t addr, uint64_t& out) const {
  if (addr < base || addr - base > bytes.size() || bytes.size() - (addr - base) < sizeof(uint64_t)) return false;
  std::memcpy(&out, bytes.data() + (addr - base), sizeof(uint64_t));
  return true;
}

void unwind_stack(const Registers& regs, const StackSnapshot& stack, AddressSpace& space, size_t max_frames,
                  UnwoundStack& out) {
  out.clear();
  uint64_t pc = regs.ip, sp = regs.sp, bp = regs.bp;
  bool bp_known = true;
  for (size_t depth = 0;; ++depth) {
    if (depth >= max_frames) {
      out.stop = StopReason::kMaxDepth;
      return;
    }
    out.ips.push_back(pc);
    // A return address points after the call; the call itself (pc-1) is in the caller's range.
    uint64_t lookup = depth == 0 ? pc : pc - 1;
    MappedModule mm;
    if (!space.find(lookup, mm) || !mm.module) {
      out.stop = StopReason::kNoModule;
      return;
    }
    uint64_t cfa = 0, ra = 0, next_bp = bp;
    bool next_bp_known = bp_known;
    const UnwindRow* row = nullptr;
    if (mm.module->method == ModuleMethod::kCfi) row = mm.module->table.find(mm.vaddr(lookup));
    if (row) {
      switch (row->cfa_rule) {
        case CfaRule::kEndOfStack:
          out.stop = StopReason::kEndOfStack;
          return;
        case CfaRule::kRsp: cfa = sp + static_cast<int64_t>(row->cfa_offset); break;
        case CfaRule::kRbp:
          if (!bp_known) {
            out.stop = StopReason::kBadFrame;
            return;
          }
          cfa = bp + static_cast<int64_t>(row->cfa_offset);
          break;
        case CfaRule::kPltExpr: cfa = sp + 8 + ((pc & 15) >= 11 ? 8 : 0); break;
        case CfaRule::kInvalid: break;
      }
      if (!stack.read_u64(cfa - 8, ra)) {
        out.stop = StopReason::kOutsideSnapshot;
        return;
      }
      if (row->rbp_rule == RbpRule::kOffset) {
        next_bp_known = stack.read_u64(cfa + row->rbp_offset, next_bp);
      } else if (row->rbp_rule == RbpRule::kUnknown) {
        next_bp_known = false;
      }
      out.cfi_frames++;
    } else if (mm.module->method == ModuleMethod::kFramePointer) {
      // rbp points at the saved caller rbp, the return address above it.
      if (!bp_known || bp == 0) {
        out.stop = bp == 0 ? StopReason::kEndOfStack : StopReason::kBadFrame;
        return;
      }
      if (!stack.read_u64(bp + 8, ra) || !stack.read_u64(bp, next_bp)) {
        out.stop = StopReason::kOutsideSnapshot;
        return;
      }
      cfa = bp + 16;
      out.fp_frames++;
    } else {
      out.stop = StopReason::kNoUnwindInfo;
      return;
    }
    if (ra == 0) {  // thread entry points clear the return address
      out.stop = StopReason::kEndOfStack;
      return;
    }
    if (cfa <= sp && depth > 0) {  // a frame must move up; the leaf's may not have moved yet
      out.stop = StopReason::kBadFrame;
      return;
    }
    pc = ra;
    sp = cfa;
    bp = next_bp;
    bp_known = next_bp_known;
  }
}

}  // namespace strata::unwind
