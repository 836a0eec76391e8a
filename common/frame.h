// A stack frame as strata stores and reports it: normalized on the node (build id + file offset, or
// a kernel address), symbolized once per build id, anywhere.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

enum class FrameKind : uint8_t {
  kNative = 0,  // user-space machine code: build_id + file offset
  kKernel = 1,  // kernel text: address in module = "[kernel]"
  kPython = 2,  // interpreter frame: function + file + line
  kCuda = 3,    // GPU kernel (named by its host stub)
};

const char* frame_kind_name(FrameKind k);

struct Frame {
  FrameKind kind = FrameKind::kNative;
  std::string build_id;  // lowercase hex; empty when unknown
  std::string module;    // path of the mapped file, "[kernel]", or "[unknown]"
  uint64_t offset = 0;   // file offset (native), address (kernel)
  std::string function;  // demangled; empty when unresolved
  std::string file;      // source file when known
  int line = 0;

  // The name a flame graph shows: the function, else "module+0xoffset" so unknown code
  // keeps its place instead of vanishing.
  std::string display_name() const;
};

// A stack is listed leaf first, as the kernel gives it.
using Stack = std::vector<Frame>;

// Functions inlined at one machine address (from DWARF): the address is one frame of the stack as
// stored, but several as the source reads. Symbolization keeps them in the frame's function field,
// encoded, so stored stacks stay as sampled; readers expand them with expand_inlined.
struct InlinedFrame {
  std::string function;
  std::string file;
  int line = 0;
};
// `outer` is the function the address is in (the symbol); `chain` lists, leaf first, every function
// as the source has it: the innermost inlined one at the address's line, ..., then `outer` itself at
// the line of the outermost call. A chain of one frame or fewer encodes as `outer` alone.
std::string encode_inlined(const std::string& outer, const std::vector<InlinedFrame>& chain);
// Replaces every frame whose function carries an inline chain by the chain's frames (leaf first).
void expand_inlined(Stack& stack);

}  // namespace strata
