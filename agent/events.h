// Events as the agent's pipeline sees them, decoded from the kernel's layout (abi/) or made up by
// tests. Everything above the live sources consumes these, so it runs without root.
#pragma once

#include <array>
#include <cstring>
#include <cstdint>
#include <string>
#include <vector>

namespace strata::agent {

// A user frame as the kernel normalized it: build id + file offset, or a raw address when the
// build id could not be read at sample time (page not resident, mmap lock contended).
struct RawUserFrame {
  bool has_build_id = false;
  std::array<uint8_t, 20> build_id{};
  uint64_t offset_or_ip = 0;
};

// A Python frame as the kernel read it: code object address, instruction index, entry flag
// (STRATA_PY_FRAME_ENTRY: the first frame one C-level call of the eval loop ran).
struct RawPythonFrame {
  uint64_t code = 0;
  uint32_t lasti = 0;
  uint32_t flags = 0;
};

// User frames as the BPF programs send them: raw addresses, leaf first; a zero ends the stack.
inline void append_user_ips(const uint8_t* p, unsigned n, std::vector<RawUserFrame>& out) {
  for (unsigned i = 0; i < n; ++i, p += sizeof(uint64_t)) {
    uint64_t ip;
    std::memcpy(&ip, p, sizeof ip);
    if (ip == 0) break;
    out.push_back(RawUserFrame{false, {}, ip});
  }
}

struct SampleEvent {
  uint32_t pid = 0;
  uint32_t tid = 0;
  uint32_t cpu = 0;
  uint64_t ts_ns = 0;  // CLOCK_MONOTONIC
  std::string comm;    // thread name
  std::vector<uint64_t> kstack;       // leaf first
  std::vector<RawUserFrame> ustack;   // leaf first (the kernel's frame-pointer walk)
  // The stack snapshot for unwinding on the node: user rip/rsp/rbp and the bytes from rsp up.
  bool has_regs = false;
  uint64_t ip = 0, sp = 0, bp = 0;
  uint64_t stack_base = 0;
  std::vector<uint8_t> stack;
  std::vector<RawPythonFrame> pystack;  // leaf first
  // The user stack came from the kernel's CFI walk (STRATA_USTACK_KERNEL_CFI): why it stopped
  // (enum strata_kcfi_stop) and how many frames it stepped with CFI rows / frame pointers.
  bool kernel_cfi = false;
  uint8_t kcfi_stop = 0;
  uint16_t kcfi_frames = 0, kcfi_fp_frames = 0;
};

// Puts back the return addresses that pending uretprobes replaced with the kernel's trampoline in
// a stack copy (each entry: `slot`, where it was; `ret`, what it was: struct strata_uret), so CFI
// walks go on past probed functions. Slots outside the copy are left alone.
template <class Uret>
void restore_uretprobe_returns(SampleEvent& s, const Uret* uret, unsigned n) {
  for (unsigned i = 0; i < n; ++i) {
    uint64_t slot = uret[i].slot, ret = uret[i].ret;
    if (slot < s.stack_base || slot - s.stack_base > s.stack.size() ||
        s.stack.size() - (slot - s.stack_base) < sizeof(uint64_t))
      continue;
    std::memcpy(s.stack.data() + (slot - s.stack_base), &ret, sizeof ret);
  }
}

struct ProcEvent {
  enum class Type { kFork, kExec, kExit };
  Type type = Type::kFork;
  uint32_t pid = 0;
  uint32_t ppid = 0;
  uint64_t ts_ns = 0;
  std::string comm;
};

// The seam between live sources and the rest (Falco's engines): a recorded file or a synthetic
// generator can drive the same sink.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void on_sample(const SampleEvent& e) = 0;
  virtual void on_proc(const ProcEvent& e) = 0;
};

}  // namespace strata::agent
