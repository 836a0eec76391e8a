#include "common/frame.h"

#include <cstdio>

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

std::string Frame::display_name() const {
  if (!function.empty()) return function;
  std::string base = module;
  auto slash = base.rfind('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  if (base.empty()) base = "[unknown]";
  char buf[32];
  std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(offset));
  return base + buf;
}

}  // namespace strata
