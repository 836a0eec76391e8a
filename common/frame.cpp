#include "common/frame.h"

#include <cstdio>
#include <cstdlib>

#include "common/parse.h"

namespace strata {

const char* frame_kind_name(FrameKind k) {
  switch (k) {
    case FrameKind::kNative: return "native";
    case FrameKind::kKernel: return "kernel";
    case FrameKind::kPython: return "python";
    case FrameKind::kCuda: return "cuda";
  }
  return "unknown";
}

namespace {
// Separators no demangled name or path contains.
constexpr char kChainMark = '\x1d';  // outer name | chain
constexpr char kFrameSep = '\x1e';   // between frames
constexpr char kFieldSep = '\x1f';   // function, file, line of one frame
}  // namespace

std::string encode_inlined(const std::string& outer, const std::vector<InlinedFrame>& chain) {
  if (chain.size() < 2) return outer;
  std::string s = outer;
  s += kChainMark;
  for (size_t i = 0; i < chain.size(); ++i) {
    if (i) s += kFrameSep;
    s += chain[i].function;
    s += kFieldSep;
    s += chain[i].file;
    s += kFieldSep;
    s += std::to_string(chain[i].line);
  }
  return s;
}

void expand_inlined(Stack& stack) {
  bool any = false;
  for (const Frame& f : stack) any = any || f.function.find(kChainMark) != std::string::npos;
  if (!any) return;
  Stack out;
  out.reserve(stack.size() + 4);
  for (Frame& f : stack) {
    auto mark = f.function.find(kChainMark);
    if (mark == std::string::npos) {
      out.push_back(std::move(f));
      continue;
    }
    std::string chain = f.function.substr(mark + 1);
    size_t start = 0;
    size_t before = out.size();
    while (start <= chain.size()) {
      size_t end = chain.find(kFrameSep, start);
      if (end == std::string::npos) end = chain.size();
      std::string one = chain.substr(start, end - start);
      size_t a = one.find(kFieldSep), b = a == std::string::npos ? a : one.find(kFieldSep, a + 1);
      if (b != std::string::npos) {
        Frame g = f;
        g.function = one.substr(0, a);
        g.file = one.substr(a + 1, b - a - 1);
        g.line = parse_int_prefix<int>(std::string_view(one).substr(b + 1)).value_or(0);
        out.push_back(std::move(g));
      }
      start = end + 1;
    }
    if (out.size() == before) {  // a malformed chain: keep the frame, named by its outer function
      f.function.resize(mark);
      out.push_back(std::move(f));
    }
  }
  stack = std::move(out);
}

std::string Frame::display_name() const {
  if (!function.empty()) {
    auto mark = function.find(kChainMark);
    return mark == std::string::npos ? function : function.substr(0, mark);
  }
  std::string base = module;
  auto slash = base.rfind('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  if (base.empty()) base = "[unknown]";
  char buf[32];
  std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(offset));
  return base + buf;
}

}  // namespace strata
