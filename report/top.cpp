#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "report/exporters.h"

namespace strata::report {

namespace {

// What makes two frames the same function in the table: kind, where the code lives, and its name.
// Offsets are left out so that all samples inside one function add up.
using FunctionKey = std::tuple<FrameKind, std::string, std::string>;

FunctionKey function_key(const Frame& f) {
  // Python functions live in source files; everything else in a mapped module.
  const std::string& where = f.kind == FrameKind::kPython ? f.file : f.module;
  return {f.kind, where, f.display_name()};
}

struct Row {
  std::string name;  // as shown
  double self = 0;   // samples at the profile's period (Profile::weighted)
  double total = 0;
};

// "do_work [libfoo.so]", "vfs_read [kernel]": the module's base name tells same-named functions
// apart. Unresolved frames ("libfoo.so+0x1a2b") name their module already.
std::string row_name(const Frame& f) {
  std::string name = f.display_name();
  std::string where = f.kind == FrameKind::kPython ? f.file : f.module;
  const auto slash = where.rfind('/');
  if (slash != std::string::npos) where = where.substr(slash + 1);
  if (!f.function.empty() && !where.empty()) {
    name += where.front() == '[' ? " " + where : " [" + where + "]";  // "[kernel]" is bracketed
  }
  // Template-heavy C++ names run to hundreds of characters; the table must stay readable.
  constexpr size_t kMaxName = 120;
  if (name.size() > kMaxName) name = name.substr(0, kMaxName - 3) + "...";
  for (char& c : name) {
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  }
  return name;
}

std::string percent(double part, double whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%6.2f%%", whole == 0 ? 0.0 : 100.0 * part / whole);
  return buf;
}

// Whole samples as integers; weighed ones (a lowered rate's samples count for more) with a decimal.
// As in the folded output, a relative error below this (whole-nanosecond periods) reads as whole.
constexpr double kWholeSampleTolerance = 1e-6;
std::string amount(double v) {
  char b[48];
  if (std::fabs(v - std::round(v)) <= kWholeSampleTolerance * std::max(1.0, std::fabs(v)))
    std::snprintf(b, sizeof b, "%.0f", std::round(v));
  else std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

void write_table(const char* title, std::vector<const Row*> rows, double total, size_t limit, bool by_self,
                 std::ostream& out) {
  // Ties broken by the other column, then by name, so the table is stable.
  std::sort(rows.begin(), rows.end(), [by_self](const Row* a, const Row* b) {
    const auto ka = by_self ? std::tie(a->self, a->total) : std::tie(a->total, a->self);
    const auto kb = by_self ? std::tie(b->self, b->total) : std::tie(b->total, b->self);
    if (ka != kb) return ka > kb;
    return a->name < b->name;
  });
  out << '\n' << title << '\n';
  char head[80];
  std::snprintf(head, sizeof head, "%12s %7s %12s %7s  %s\n", "self", "self%", "total", "total%", "function");
  out << head;
  size_t shown = 0;
  for (const Row* r : rows) {
    if (shown++ == limit) break;
    if ((by_self ? r->self : r->total) == 0) break;  // the rest are zero too
    char nums[96];
    std::snprintf(nums, sizeof nums, "%12s %s %12s %s  ", amount(r->self).c_str(),
                  percent(r->self, total).c_str(), amount(r->total).c_str(),
                  percent(r->total, total).c_str());
    out << nums << r->name << '\n';
  }
}

}  // namespace

void write_top(const Profile& p, std::ostream& out, size_t limit) {
  const double total = p.weighted_total();
  const std::string unit = p.value_unit == "count" ? "samples" : p.value_unit;
  if (p.mixed_periods() && p.period_ns > 0) {
    // Windows at a lowered rate: their samples are weighed by their period, so the columns are CPU
    // time in samples at the profile's rate, not the raw sample count.
    char rate[32];
    std::snprintf(rate, sizeof rate, "%.0f Hz", 1e9 / static_cast<double>(p.period_ns));
    out << p.kind << ": " << p.total() << " " << unit << " in total, taken at several rates; columns are samples at "
        << rate << " (" << amount(total) << "): each sample weighed by its window's period\n";
  } else {
    out << p.kind << ": " << p.total() << " " << unit << " in total\n";
  }
  if (total <= 0) return;

  // Each stack's leaf function and its distinct functions, found once: samples share stacks.
  std::map<FunctionKey, Row> rows;
  struct StackFunctions {
    Row* leaf = nullptr;
    std::vector<Row*> distinct;  // recursion counts once toward a function's total
  };
  std::vector<StackFunctions> per_stack(p.stacks.size());
  for (size_t i = 0; i < p.stacks.size(); ++i) {
    std::set<Row*> seen;
    for (const Frame& f : p.stacks[i]) {
      auto [it, inserted] = rows.try_emplace(function_key(f));
      if (inserted) it->second.name = row_name(f);
      if (per_stack[i].leaf == nullptr) per_stack[i].leaf = &it->second;
      if (seen.insert(&it->second).second) per_stack[i].distinct.push_back(&it->second);
    }
  }

  double no_stack = 0;
  for (const auto& s : p.samples) {
    if (s.stack_index >= p.stacks.size() || p.stacks[s.stack_index].empty()) {
      no_stack += p.weighted(s);
      continue;
    }
    const StackFunctions& sf = per_stack[s.stack_index];
    const double v = p.weighted(s);
    sf.leaf->self += v;
    for (Row* r : sf.distinct) r->total += v;
  }
  if (no_stack > 0) {
    // Kept as a row so the self column still adds up to the total.
    Row& r = rows[FunctionKey{FrameKind::kNative, "", "[no stack]"}];
    r.name = "[no stack]";
    r.self = r.total = no_stack;
  }

  std::vector<const Row*> all;
  all.reserve(rows.size());
  for (const auto& [key, row] : rows) all.push_back(&row);
  write_table("by self:", all, total, limit, true, out);
  write_table("by total:", all, total, limit, false, out);
}

}  // namespace strata::report
