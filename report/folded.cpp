#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "report/exporters.h"

namespace strata::report {

namespace {

// Sums of weighed samples are whole when every sample had the profile's period, and when the
// windows' time adds up to whole samples at the profile's rate (240 at 24 Hz = 990 at 99 Hz); the
// periods are whole nanoseconds (1e9/24 rounds down), which leaves such sums off by a few parts in
// 10^8. A relative error below this is read as whole.
constexpr double kWholeSampleTolerance = 1e-6;

// ';' separates frames and '\n' separates lines in folded input; neither may appear in a name.
std::string sanitize(std::string s) {
  for (char& c : s) {
    if (c == ';') {
      c = ':';
    } else if (c == '\n' || c == '\r') {
      c = ' ';
    }
  }
  return s;
}

// "frame;frame;...;leaf", root first, from a leaf-first stack.
std::string folded_stack(const Stack& stack) {
  if (stack.empty()) return "[no stack]";
  std::string line;
  for (auto it = stack.rbegin(); it != stack.rend(); ++it) {
    if (!line.empty()) line += ';';
    line += folded_frame_name(*it);
  }
  return line;
}

// A line's value: whole samples as an integer (every profile of one rate); samples weighed by a
// lower rate's period have fractions, written with two decimals (flamegraph.pl reads them).
std::string folded_value(double v) {
  const double whole = std::round(v);
  char b[48];
  if (std::fabs(v - whole) <= kWholeSampleTolerance * std::max(1.0, std::fabs(v))) {
    std::snprintf(b, sizeof b, "%.0f", whole);
  } else {
    std::snprintf(b, sizeof b, "%.2f", v);
  }
  return b;
}

}  // namespace

std::string folded_frame_name(const Frame& f) {
  std::string name = f.display_name();
  switch (f.kind) {
    case FrameKind::kKernel:
      name += "_[k]";
      break;
    case FrameKind::kPython:
      if (!f.file.empty()) {
        name += " (" + f.file;
        if (f.line > 0) name += ":" + std::to_string(f.line);
        name += ")";
      }
      break;
    case FrameKind::kNative:
    case FrameKind::kCuda:
      break;
  }
  return sanitize(std::move(name));
}

void write_folded(const Profile& p, std::ostream& out, bool by_thread) {
  // Many samples share a stack (one per thread and window); name each stack once.
  std::vector<std::optional<std::string>> stack_text(p.stacks.size());
  std::map<std::string, double> lines;  // sorted: the output does not depend on sample order

  for (const auto& s : p.samples) {
    if (s.count == 0) continue;
    std::string line;
    if (by_thread) {
      const std::string comm = s.comm.empty() ? "[unknown]" : s.comm;
      line = sanitize(comm + "-" + std::to_string(s.pid) + "/" + std::to_string(s.tid)) + ";";
    }
    if (s.stack_index < p.stacks.size()) {
      auto& cached = stack_text[s.stack_index];
      if (!cached) cached = folded_stack(p.stacks[s.stack_index]);
      line += *cached;
    } else {
      line += folded_stack(Stack{});
    }
    lines[line] += p.weighted(s);
  }
  for (const auto& [stack, value] : lines) out << stack << ' ' << folded_value(value) << '\n';
}

}  // namespace strata::report
