// strata record with hybrid unwinding (needs root + BPF): a chain without frame pointers across a
// shared library under qsort, Python chains under every installed interpreter, Python -> C -> Python.
// Each check is a share of leaf samples (>= 95%), not a timing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "tests/support/run.h"

namespace strata::test {
namespace {

struct Folded {
  std::vector<std::string> frames;  // root first
  uint64_t count = 0;
};

// --budget 0: the checks are about the unwinder; the cost budget (0.2%) may turn node-side CFI off
// after a window, which is its own behaviour (cost_budget_test), not the unwinder's.
std::vector<Folded> record(const TempDir& dir, const std::string& cmd, const std::string& options = "",
                           const std::string& env = "") {
  auto rec = run(env + strata_bin() + " record --budget 0 --layers cpu " + options + " -o " + dir.file("rec.db") + " -- " + cmd);
  EXPECT_EQ(rec.exit_code, 0) << describe(rec);
  auto rep = run(strata_bin() + " report " + dir.file("rec.db") + " --format folded");
  EXPECT_EQ(rep.exit_code, 0) << describe(rep);
  std::vector<Folded> out;
  std::istringstream in(rep.out);
  std::string line;
  while (std::getline(in, line)) {
    auto sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    Folded f;
    f.count = std::stoull(line.substr(sp + 1));
    std::stringstream ss(line.substr(0, sp));
    std::string part;
    while (std::getline(ss, part, ';')) f.frames.push_back(part);
    out.push_back(std::move(f));
  }
  return out;
}

std::string name_of(const std::string& frame) { return frame.substr(0, frame.find(" (")); }

// Share of samples whose leaf is `leaf` that carry `chain` (names, root first) as a subsequence
// ending at the leaf, rooted at _start.
// `excused`: samples known to be cut for a reason the caller bounds itself (start-up), left out of
// the share (at most the samples that are not whole).
void expect_chain(const std::vector<Folded>& lines, const std::string& leaf, const std::vector<std::string>& chain,
                  const std::string& py_file = "", uint64_t excused = 0) {
  uint64_t total = 0, full = 0;
  std::string bad;
  for (const auto& l : lines) {
    if (l.frames.empty() || name_of(l.frames.back()) != leaf) continue;
    total += l.count;
    size_t at = 0;
    bool files_ok = true;
    for (const auto& f : l.frames) {
      if (at < chain.size() && name_of(f) == chain[at]) ++at;
      if (!py_file.empty() && f.find(".py:") != std::string::npos && f.find(py_file) == std::string::npos &&
          f.find("<frozen") == std::string::npos)
        files_ok = false;
    }
    if (at == chain.size() && files_ok && l.frames.front() == "_start") full += l.count;
    else bad = l.frames.back();
  }
  ASSERT_GT(total, 15u) << "too few samples in " << leaf;
  excused = std::min(excused, total - full);
  ASSERT_GT(total - excused, 15u) << "too few samples in " << leaf << " once " << excused << " are left out";
  EXPECT_GE(static_cast<double>(full) / static_cast<double>(total - excused), 0.95)
      << full << " of " << total << " (" << excused << " excused); " << bad;
}

std::vector<std::string> nofp_chain() {
  std::vector<std::string> chain = {"_start", "main", "qsort_r", "compare"};
  for (int i = 1; i <= 6; ++i) chain.push_back("exe_0" + std::to_string(i));
  for (int i = 1; i <= 12; ++i) chain.push_back((i < 10 ? "lib_0" : "lib_") + std::to_string(i));
  for (int i = 7; i <= 12; ++i) chain.push_back((i < 10 ? "exe_0" : "exe_") + std::to_string(i));
  chain.push_back("nofp_leaf");
  return chain;
}

TEST(Unwind, ChainWithoutFramePointersAcrossALibraryUnderQsort) {
  TempDir dir;
  auto lines = record(dir, testprog("nofp_chain") + " 2");
  expect_chain(lines, "nofp_leaf", nofp_chain());
}

// The recording's agent stats whose key matches the SQL condition `where`, printed as `what stats:`.
std::map<std::string, uint64_t> recording_stats(const TempDir& dir, const std::string& where, const std::string& what) {
  auto stats = run("sqlite3 " + dir.file("rec.db") + " \"SELECT key || ' ' || CAST(value AS INTEGER) FROM agent_stats WHERE " +
                   where + "\"");
  std::map<std::string, uint64_t> st;
  EXPECT_EQ(stats.exit_code, 0) << describe(stats);  // then every expectation on the stats fails too
  std::istringstream in(stats.out);
  std::string key;
  uint64_t value;
  while (in >> key >> value) st[key] = value;
  std::cout << what << " stats:";
  for (const auto& [k, v] : st) std::cout << " " << k << "=" << v;
  std::cout << "\n";
  return st;
}

// The same chain unwound in the kernel (STRATA_USER_STACK_MODE=3): CFI rows the agent derived and
// loaded into BPF maps, no stack copy. The walks must have run there, and (nearly) all be whole.
// Start-up: the agent reads a new process's maps at its exec, before ld.so mapped its libraries, so
// walks into the library stop at "no mapping" until the re-read the first such stop asks for lands,
// a poll later (~10 samples on a loaded 2-CPU machine in CI, none when quiet). A quarter of a 2 s
// run is far above that and far below a broken mapping lookup (every walk into the library).
constexpr double kStartupNoMappingShare = 0.25;

TEST(Unwind, ChainWithoutFramePointersKernelCfi) {
  TempDir dir;
  auto lines = record(dir, testprog("nofp_chain") + " 2", "", "STRATA_USER_STACK_MODE=3 ");
  auto st = recording_stats(dir, "key LIKE 'unwind_kernel%' OR key LIKE 'kcfi%' OR key IN ('samples', 'unwind_snapshot_samples')",
                            "kernel CFI");
  const auto walks = static_cast<double>(st["unwind_kernel_walks"]);
  const auto no_mapping = st["kcfi_stop_no_mapping"];
  EXPECT_LE(static_cast<double>(no_mapping), kStartupNoMappingShare * walks) << "walks that found no mapping";
  expect_chain(lines, "nofp_leaf", nofp_chain(), "", no_mapping);
  EXPECT_EQ(st["unwind_snapshot_samples"], 0u) << "no stack copies in mode 3";
  EXPECT_GT(st["unwind_kernel_walks"], 15u);
  EXPECT_GT(st["unwind_kernel_modules"], 1u) << "the executable's and the library's rows";
  EXPECT_GT(st["kcfi_frames"], st["unwind_kernel_walks"] * 10) << "the chain's frames were stepped with CFI";
  EXPECT_GE(static_cast<double>(st["unwind_kernel_complete"]), 0.9 * (walks - static_cast<double>(no_mapping)));
}

std::string source(const std::string& name) {
  return env_or("STRATA_SOURCE", ".") + "/tests/testprogs/" + name;
}

void python_chain(const std::string& python) {
  if (access(python.c_str(), X_OK) != 0) GTEST_SKIP() << python << " is not installed";
  TempDir dir;
  auto lines = record(dir, python + " " + source("py_chain.py") + " 3");
  std::vector<std::string> chain = {"_start", "Py_BytesMain", "<module>", "main_loop", "outer", "middle"};
  for (int i = 0; i < 6; ++i) chain.push_back("recurse");
  chain.push_back("leaf");
  expect_chain(lines, "leaf", chain, "py_chain.py");
}

TEST(Unwind, PythonDebian311) { python_chain("/usr/bin/python3.11"); }
TEST(Unwind, Python310) { python_chain("/root/.pyenv/versions/3.10.13/bin/python3.10"); }
TEST(Unwind, Python311) { python_chain("/root/.pyenv/versions/3.11.7/bin/python3.11"); }
TEST(Unwind, Python312) { python_chain("/root/.pyenv/versions/3.12.1/bin/python3.12"); }
TEST(Unwind, Python313) { python_chain("/root/.pyenv/versions/3.13.0/bin/python3.13"); }

TEST(Unwind, PythonToCToPythonCallbackIsWhole) {
  TempDir dir;
  auto lines = record(dir, "/usr/bin/python3.11 " + source("py_ctypes.py") + " 2");
  expect_chain(lines, "cb_leaf", {"_start", "py_main", "call_into_c", "ffi_call", "qsort_r", "py_callback", "cb_leaf"},
               "py_ctypes.py");
}

// The unwind tables' memory budget (--unwind-tables-mb): 16 modules of ~65 KB of CFI rows each,
// plus libc's ~300 KB, against 0.75 MiB. Tables must be evicted and rebuilt, the cache must never
// hold more than the budget, and the stacks through every module must still be whole. One window
// (--window 120): the cost budget, judged per window, must not trade CFI for frame pointers here.
TEST(Unwind, TableBudgetEvictsRebuildsAndStillUnwinds) {
  TempDir dir;
  constexpr int kModules = 16;
  constexpr uint64_t kBudget = 786432;  // 0.75 MiB
  const std::string prog = testprog("many_modules");
  const std::string modules_dir = prog.substr(0, prog.rfind('/'));  // libstrata_modN.so lie beside it
  auto lines = record(dir, prog + " " + modules_dir + " " + std::to_string(kModules) + " 4",
                      "--unwind-tables-mb 0.75 --window 120");
  auto st = recording_stats(dir, "key LIKE 'unwind_table%'", "unwind table");
  EXPECT_EQ(st["unwind_table_budget_bytes"], kBudget);
  EXPECT_GT(st["unwind_table_peak_bytes"], kBudget / 2) << "the modules did not fill the budget";
  EXPECT_LE(st["unwind_table_peak_bytes"], kBudget);
  EXPECT_LE(st["unwind_table_bytes"], kBudget);
  EXPECT_GT(st["unwind_table_evictions"], 0u);
  EXPECT_GT(st["unwind_table_builds"], static_cast<uint64_t>(kModules) + 4) << "tables were not rebuilt";

  // Every module's chain, whole from _start, in (nearly) every sample of its leaf.
  uint64_t total = 0, full = 0;
  std::set<int> seen;
  std::string bad;
  for (const auto& l : lines) {
    // The module's leaf, maybe under kernel frames (a timer tick, its clock read).
    std::string leaf;
    for (const auto& f : l.frames) {
      const std::string n = name_of(f);
      if (n.rfind("mod", 0) == 0 && n.size() >= 9 && n.substr(n.size() - 5) == "_leaf") leaf = n;
    }
    if (leaf.empty()) continue;
    std::string mod = leaf.substr(0, leaf.size() - 5);
    total += l.count;
    seen.insert(std::stoi(mod.substr(3)));
    std::vector<std::string> chain = {"_start", "main", mod + "_run", mod + "_a", mod + "_b", leaf};
    size_t at = 0;
    for (const auto& f : l.frames)
      if (at < chain.size() && name_of(f) == chain[at]) ++at;
    if (at == chain.size() && l.frames.front() == "_start") full += l.count;
    else bad = l.frames.front() + ";...;" + leaf;
  }
  std::cout << full << " of " << total << " module samples whole from _start, in " << seen.size() << " modules\n";
  ASSERT_GT(total, 100u) << "too few samples in the modules";
  EXPECT_GE(seen.size(), static_cast<size_t>(kModules * 3 / 4)) << "samples in too few modules";
  EXPECT_GE(static_cast<double>(full) / static_cast<double>(total), 0.95) << full << " of " << total << "; " << bad;
}

}  // namespace
}  // namespace strata::test
