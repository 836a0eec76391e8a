// User-space unwinding of a copied stack (perf's way): the kernel copies the top of the user
// stack and rip/rsp/rbp at the sample; the node walks it with each module's method (frame
// pointers or CFI rows). Pure: memory comes from the snapshot, modules from an AddressSpace, so
// tests replay saved stacks without root.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "unwind/module_tables.h"

namespace strata::unwind {

struct Registers {
  uint64_t ip = 0;
  uint64_t sp = 0;
  uint64_t bp = 0;
};

// The copied stack: bytes[i] is the byte at address base + i.
struct StackSnapshot {
  uint64_t base = 0;
  std::span<const uint8_t> bytes;
  bool read_u64(uint64_t addr, uint64_t& out) const;
};

// What is mapped at an address: the module's unwind info and how addresses map into it.
struct MappedModule {
  uint64_t start = 0;        // mapping start (process address)
  uint64_t file_offset = 0;  // file offset at `start`
  const ModuleUnwind* module = nullptr;
  // The ELF virtual address of a process address in this mapping, or ~0.
  uint64_t vaddr(uint64_t addr) const {
    return module ? module->vaddr_of_file_offset(addr - start + file_offset) : ~0ull;
  }
};

class AddressSpace {
 public:
  virtual ~AddressSpace() = default;
  // False when nothing executable (or nothing we can read) is mapped at addr.
  virtual bool find(uint64_t addr, MappedModule& out) = 0;
};

enum class StopReason : uint8_t {
  kEndOfStack = 0,     // reached the outermost frame: the chain is whole
  kOutsideSnapshot,    // the next frame lies beyond the copied bytes (stack deeper than the copy)
  kNoModule,           // an address outside any known module (JIT code, unmapped)
  kNoUnwindInfo,       // a module without a row for this address and without frame pointers
  kBadFrame,           // the rules gave a frame that does not move up the stack
  kMaxDepth,
};
const char* stop_reason_name(StopReason r);

struct UnwoundStack {
  std::vector<uint64_t> ips;  // leaf first; ips[0] is the sampled rip, the rest return addresses
  StopReason stop = StopReason::kEndOfStack;
  uint32_t fp_frames = 0;   // frames stepped with frame pointers
  uint32_t cfi_frames = 0;  // frames stepped with CFI rows
  void clear() {
    ips.clear();
    stop = StopReason::kEndOfStack;
    fp_frames = cfi_frames = 0;
  }
};

// Walks from `regs` through `stack`; `out` is cleared first. Never reads outside the snapshot.
void unwind_stack(const Registers& regs, const StackSnapshot& stack, AddressSpace& space, size_t max_frames,
                  UnwoundStack& out);

}  // namespace strata::unwind
