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

}  // namespace strata
