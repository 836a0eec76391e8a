#include <algorithm>
#include <cmath>
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

bool whole(double v) { return std::fabs(v - std::round(v)) <= kWholeSampleTolerance * std::max(1.0, std::fabs(v)); }

// Each line's weighed value as a whole number. Folded COUNT is an integer to the tools that read it:
// speedscope's importer matches /^(.*) (\d+)$/ and skips any other line without a word, inferno
// truncates fractions. Samples weighed by a lower rate's period have fractions (a 49 Hz sample is
// 99/49 = 2.02 samples at 99 Hz), so they are rounded by largest remainder: the lines' sum is the
// rounded total, each line is within 1 of its weight, and a line with a weight is never 0 (its
// stack would vanish from the graph). An error under one sample at the profile's rate, below what
// sampling resolves.
std::vector<uint64_t> whole_values(const std::vector<double>& v) {
  std::vector<uint64_t> out(v.size());
  if (std::all_of(v.begin(), v.end(), whole)) {
    for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<uint64_t>(std::llround(v[i]));
    return out;
  }
  double total = 0;
  uint64_t floors = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    total += v[i];
    out[i] = static_cast<uint64_t>(std::floor(v[i]));
    floors += out[i];
  }
  const uint64_t want = static_cast<uint64_t>(std::llround(total));
  std::vector<size_t> order(v.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  // Largest fraction first; ties by line order (the lines are sorted), so the output is stable.
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return v[a] - std::floor(v[a]) > v[b] - std::floor(v[b]); });
  for (size_t k = 0; k < order.size() && floors < want; ++k, ++floors) ++out[order[k]];
  for (size_t i = 0; i < v.size(); ++i)
    if (out[i] == 0 && v[i] > 0) out[i] = 1;
  return out;
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
  std::vector<double> values;
  values.reserve(lines.size());
  for (const auto& [stack, value] : lines) values.push_back(value);
  const std::vector<uint64_t> counts = whole_values(values);
  size_t i = 0;
  for (const auto& [stack, value] : lines) out << stack << ' ' << counts[i++] << '\n';
}

}  // namespace strata::report
