#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "report/exporters.h"

namespace strata::report {

namespace {

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
  std::map<std::string, uint64_t> lines;  // sorted: the output does not depend on sample order

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
    lines[line] += s.count;
  }
  for (const auto& [stack, count] : lines) out << stack << ' ' << count << '\n';
}

}  // namespace strata::report
