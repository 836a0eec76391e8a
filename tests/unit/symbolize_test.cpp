// symbolize/: ELF symbols (own binary, a test library and its stripped, debuglinked and
// build-id-dir variants), kallsyms, perf maps, the caching symbolizer, and hostile input.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "symbolize/symbolizer.h"

namespace fs = std::filesystem;
using strata::Frame;
using strata::FrameKind;
using namespace strata::symbolize;

// Functions of this binary that the tests look up.
extern "C" __attribute__((noinline)) int symbolize_test_c_function(int x) {  // MARK:c_function
  return x * 5 + 3;
}
namespace symbolize_test_ns {
__attribute__((noinline)) double mangled_function(int a, double b) { return a * b + 1.5; }
}  // namespace symbolize_test_ns

// Two levels of inlining into one function: DWARF keeps them as inlined-subroutine scopes.
volatile int g_inline_sink;
static inline __attribute__((always_inline)) void inl_leaf(int x) {
  g_inline_sink = x * 7;  // MARK:inl_leaf
}
static inline __attribute__((always_inline)) void inl_mid(int x) {
  inl_leaf(x + 1);  // MARK:inl_mid
  g_inline_sink = g_inline_sink + 3;
}
extern "C" __attribute__((noinline)) int symbolize_test_inlining(int x) {
  inl_mid(x);  // MARK:inl_outer
  return g_inline_sink;
}

// A lambda inlined into its caller: GCC gives its operator() no linkage name.
extern "C" __attribute__((noinline)) int symbolize_test_lambda(int x) {
  auto scaled = [x](int y) __attribute__((always_inline)) {
    g_inline_sink = x * y + 11;  // MARK:lambda_body
    return g_inline_sink;
  };
  return scaled(x + 1) + 1;
}

namespace {

uintptr_t address_of(int (*f)(int)) { return reinterpret_cast<uintptr_t>(f); }
uintptr_t address_of(double (*f)(int, double)) { return reinterpret_cast<uintptr_t>(f); }

// A temporary folder, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "strata-symbolize-XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    if (p == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string shell_output(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// Runs a command; the test fails (not skips) when the tool is missing or fails.
void run(const std::string& cmd) { ASSERT_EQ(std::system((cmd + " 2>&1").c_str()), 0) << cmd; }

// File offset of a code address in this process, from /proc/self/maps.
std::optional<uint64_t> file_offset_of(uintptr_t addr, std::string* path_out = nullptr) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode, path;
    in >> range >> perms >> offset >> dev >> inode >> path;
    auto dash = range.find('-');
    uint64_t start = std::stoull(range.substr(0, dash), nullptr, 16);
    uint64_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (addr >= start && addr < end) {
      if (path_out != nullptr) *path_out = path;
      return addr - start + std::stoull(offset, nullptr, 16);
    }
  }
  return std::nullopt;
}

// This executable's load bias: ELF vaddr = runtime address - bias.
uintptr_t main_program_bias() {
  uintptr_t bias = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        *static_cast<uintptr_t*>(data) = info->dlpi_addr;
        return 1;  // the first entry is the main program
      },
      &bias);
  return bias;
}

// The line of a "// MARK:name" comment in a source file.
int marked_line(const std::string& source, const std::string& mark) {
  std::ifstream in(source);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find("// MARK:" + mark) != std::string::npos) return n;
  }
  return -1;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ---------------------------------------------------------------------------------------------
// demangle

TEST(SymbolizeDemangle, CxxNames) {
  EXPECT_EQ(demangle("_ZN3foo3barEv"), "foo::bar()");
  EXPECT_EQ(demangle("_ZNK14strata_testlib6Widget7computeEi"), "strata_testlib::Widget::compute(int) const");
  EXPECT_EQ(demangle("_ZNSt6thread4joinEv@@GLIBCXX_3.4.11"), "std::thread::join()@@GLIBCXX_3.4.11");
}

TEST(SymbolizeDemangle, LeavesOtherNamesAlone) {
  EXPECT_EQ(demangle("main"), "main");
  EXPECT_EQ(demangle(""), "");
  EXPECT_EQ(demangle("_Z"), "_Z");
  EXPECT_EQ(demangle("_Zxx!!not-mangled"), "_Zxx!!not-mangled");
  EXPECT_EQ(demangle("Z3foov"), "Z3foov");
}

// ---------------------------------------------------------------------------------------------
// build id

TEST(SymbolizeBuildId, MatchesReadelf) {
  // Not /proc/self/exe in the command: there "self" would be readelf.
  std::string exe = fs::read_symlink("/proc/self/exe").string();
  std::string out = shell_output("readelf -n '" + exe + "' 2>&1");
  auto pos = out.find("Build ID: ");
  ASSERT_NE(pos, std::string::npos) << "readelf -n printed no build id:\n" << out;
  std::string expected = out.substr(pos + 10, out.find('\n', pos) - pos - 10);
  auto id = read_build_id("/proc/self/exe");
  ASSERT_TRUE(id.ok()) << id.error().message;
  EXPECT_EQ(*id, expected);
  EXPECT_GE(id->size(), 16u);
}

TEST(SymbolizeBuildId, MissingNoteIsAnError) {
  TempDir tmp;
  run("objcopy --remove-section=.note.gnu.build-id " SYMBOLIZE_TESTLIB " " + tmp / "noid.so");
  auto id = read_build_id(tmp / "noid.so");
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.error().message.find("no GNU build id"), std::string::npos) << id.error().message;
}

// ---------------------------------------------------------------------------------------------
// ElfSymbols on this test binary

TEST(SymbolizeElf, OwnFunctionsByVaddr) {
  auto syms = ElfSymbols::open("/proc/self/exe");
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  EXPECT_GT((*syms)->symbol_count(), 10u);
  uintptr_t bias = main_program_bias();

  uint64_t c_vaddr = address_of(&symbolize_test_c_function) - bias;
  auto s = (*syms)->lookup_vaddr(c_vaddr);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->function, "symbolize_test_c_function");
  // An address inside the function, not only its first byte.
  s = (*syms)->lookup_vaddr(c_vaddr + 2);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->function, "symbolize_test_c_function");

  s = (*syms)->lookup_vaddr(address_of(&symbolize_test_ns::mangled_function) - bias);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->function, "symbolize_test_ns::mangled_function(int, double)");

  EXPECT_FALSE((*syms)->lookup_vaddr(0).has_value());
  EXPECT_FALSE((*syms)->lookup_vaddr(~0ULL).has_value());
}

// The source lines binutils' addr2line gives for a vaddr of this binary, innermost inlined function
// first (one line when nothing is inlined there); empty when it cannot run.
std::vector<int> addr2line_inline_lines(uint64_t vaddr) {
  char cmd[256];
  std::snprintf(cmd, sizeof cmd, "addr2line -i -e /proc/%d/exe 0x%llx 2>/dev/null", static_cast<int>(getpid()),
                static_cast<unsigned long long>(vaddr));
  std::vector<int> lines;
  FILE* p = popen(cmd, "r");
  if (p == nullptr) return lines;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) {
    std::string l(buf);
    auto colon = l.rfind(':');
    if (colon == std::string::npos) continue;
    lines.push_back(std::atoi(l.c_str() + colon + 1));
  }
  pclose(p);
  return lines;
}

// The per-CU scope index gives the inline chains libdw's own walk gives, address by address, over
// this test binary's code around the functions above (gtest's templates inline deeply); where they
// differ, binutils' addr2line (a third reading of the same DWARF) must agree with the index.
TEST(SymbolizeElf, TheScopeIndexAgreesWithLibdwsWalk) {
  ElfOptions indexed;
  ElfOptions walked;
  walked.inline_index = false;
  auto fast = ElfSymbols::open("/proc/self/exe", indexed);
  auto slow = ElfSymbols::open("/proc/self/exe", walked);
  ASSERT_TRUE(fast.ok() && slow.ok());
  uint64_t middle = address_of(&symbolize_test_inlining) - main_program_bias();
  constexpr uint64_t kSpan = 16 * 1024;  // each side; a prime step lands on every instruction offset
  constexpr uint64_t kStep = 37;
  size_t compared = 0;
  size_t with_chain = 0;
  size_t deepest = 0;
  size_t disagreed = 0;
  for (uint64_t a = middle > kSpan ? middle - kSpan : 0; a < middle + kSpan; a += kStep) {
    auto f = (*fast)->lookup_vaddr(a);
    auto s = (*slow)->lookup_vaddr(a);
    ASSERT_EQ(f.has_value(), s.has_value()) << std::hex << a;
    if (!f) continue;
    ++compared;
    bool same = f->inlined.size() == s->inlined.size();
    for (size_t i = 0; same && i < f->inlined.size(); ++i)
      same = f->inlined[i].function == s->inlined[i].function && f->inlined[i].file == s->inlined[i].file &&
             f->inlined[i].line == s->inlined[i].line;
    if (!same) {
      // libdw's walk loses some chains (a captureless lambda's operator() inlined into its static
      // invoker _FUN, found in a closure type inside a function): binutils' addr2line decides.
      ++disagreed;
      std::vector<int> lines = addr2line_inline_lines(a);
      ASSERT_FALSE(lines.empty()) << "addr2line gave nothing for " << std::hex << a;
      std::vector<int> ours;
      for (const auto& i : f->inlined) ours.push_back(i.line);
      if (ours.empty()) ours.push_back(f->line);
      EXPECT_EQ(ours, lines) << "at " << std::hex << a << " in " << f->function;
    }
    if (!f->inlined.empty()) ++with_chain;
    deepest = std::max(deepest, f->inlined.size());
  }
  std::printf("compared %zu addresses, %zu with an inline chain (the deepest %zu), libdw disagreed at %zu\n",
              compared, with_chain, deepest, disagreed);
  // The comparison means something only if many addresses carry chains, some of them nested (at least
  // three deep: the ASan build, compiled with other flags, inlines less than the release build's 4+).
  EXPECT_GT(compared, 500u);
  EXPECT_GT(with_chain, 100u);
  EXPECT_GE(deepest, 3u);
}

// Inlined functions: an address in inl_leaf's code, inlined into inl_mid, inlined into
// symbolize_test_inlining, symbolizes as the three functions, each at its own source line.
TEST(SymbolizeElf, InlinedFunctionsAreFramesOfTheirOwn) {
  auto syms = ElfSymbols::open("/proc/self/exe");
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  uint64_t start = address_of(&symbolize_test_inlining) - main_program_bias();
  std::string self = __FILE__;
  std::optional<Symbol> found;
  for (uint64_t a = start; a < start + 128 && !found; ++a) {
    auto s = (*syms)->lookup_vaddr(a);
    if (s && s->function == "symbolize_test_inlining" && s->inlined.size() == 3 &&
        s->inlined[0].function.starts_with("inl_leaf"))
      found = s;
  }
  ASSERT_TRUE(found.has_value()) << "no address of symbolize_test_inlining carries the inline chain";
  EXPECT_EQ(found->inlined[0].line, marked_line(self, "inl_leaf"));
  EXPECT_TRUE(found->inlined[1].function.starts_with("inl_mid")) << found->inlined[1].function;
  EXPECT_EQ(found->inlined[1].line, marked_line(self, "inl_mid"));
  EXPECT_EQ(found->inlined[2].function, "symbolize_test_inlining");
  EXPECT_EQ(found->inlined[2].line, marked_line(self, "inl_outer"));
  EXPECT_TRUE(ends_with(found->inlined[2].file, "symbolize_test.cpp")) << found->inlined[2].file;

  // Stored in one frame, expanded into three by readers, leaf first; a plain frame stays as it is.
  strata::Frame f;
  f.kind = FrameKind::kNative;
  f.function = strata::encode_inlined(found->function, found->inlined);
  EXPECT_EQ(f.display_name(), "symbolize_test_inlining");
  strata::Frame plain;
  plain.function = "main";
  strata::Stack stack = {f, plain};
  strata::expand_inlined(stack);
  ASSERT_EQ(stack.size(), 4u);
  EXPECT_TRUE(stack[0].function.starts_with("inl_leaf"));
  EXPECT_TRUE(stack[1].function.starts_with("inl_mid"));
  EXPECT_EQ(stack[2].function, "symbolize_test_inlining");
  EXPECT_EQ(stack[2].line, marked_line(self, "inl_outer"));
  EXPECT_EQ(stack[3].function, "main");
}

// An inlined lambda is named by the function that holds it, as the demangler names an out-of-line
// one ("f::{lambda(int)#1}::operator()(int) const"), not by its bare "operator()".
TEST(SymbolizeElf, InlinedLambdaIsNamedByItsEnclosingFunction) {
  auto syms = ElfSymbols::open("/proc/self/exe");
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  uint64_t start = address_of(&symbolize_test_lambda) - main_program_bias();
  std::optional<Symbol> found;
  const int body = marked_line(__FILE__, "lambda_body");
  // The whole function (an instrumented build, ASan's, makes it far longer than 128 bytes).
  for (uint64_t a = start; a < start + 16384 && !found; ++a) {
    auto s = (*syms)->lookup_vaddr(a);
    if (!s || s->function != "symbolize_test_lambda") break;
    if (!s->inlined.empty() && s->inlined[0].line == body) found = s;
  }
  ASSERT_TRUE(found.has_value()) << "no address of symbolize_test_lambda carries the lambda's line";
  EXPECT_EQ(found->inlined[0].function, "symbolize_test_lambda::{lambda}::operator()");
  EXPECT_EQ(found->inlined.back().function, "symbolize_test_lambda");
}

TEST(SymbolizeElf, OwnFunctionByFileOffset) {
  std::string mapped_path;
  auto offset = file_offset_of(address_of(&symbolize_test_c_function), &mapped_path);
  ASSERT_TRUE(offset.has_value());
  EXPECT_EQ(fs::canonical(mapped_path), fs::canonical("/proc/self/exe"));
  auto syms = ElfSymbols::open(mapped_path);
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  auto s = (*syms)->lookup_file_offset(*offset);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->function, "symbolize_test_c_function");
  // Source line from DWARF: the test is built with -g.
  EXPECT_TRUE(ends_with(s->file, "symbolize_test.cpp")) << s->file;
  int mark = marked_line(__FILE__, "c_function");
  ASSERT_GT(mark, 0);
  EXPECT_GE(s->line, mark);
  EXPECT_LE(s->line, mark + 2);

  auto id = read_build_id(mapped_path);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ((*syms)->build_id(), *id);
}

TEST(SymbolizeElf, LineInfoCanBeTurnedOff) {
  ElfOptions options;
  options.line_info = false;
  auto syms = ElfSymbols::open("/proc/self/exe", options);
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  auto s = (*syms)->lookup_vaddr(address_of(&symbolize_test_c_function) - main_program_bias());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->function, "symbolize_test_c_function");
  EXPECT_TRUE(s->file.empty());
  EXPECT_EQ(s->line, 0);
}

// ---------------------------------------------------------------------------------------------
// ElfSymbols on the test library and its stripped / debuglinked copies

// The test library, dlopen'ed once to learn the file offsets of its functions.
class SymbolizeLib : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    handle_ = dlopen(SYMBOLIZE_TESTLIB, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle_, nullptr) << dlerror();
    auto offset = [](const char* sym) -> uint64_t {
      void* p = dlsym(handle_, sym);
      EXPECT_NE(p, nullptr) << sym;
      return file_offset_of(reinterpret_cast<uintptr_t>(p)).value_or(0);
    };
    exported_ = offset("strata_testlib_exported");
    compute_ = offset("_ZNK14strata_testlib6Widget7computeEi");
    nosize_ = offset("strata_testlib_nosize");
    auto local_address =
        reinterpret_cast<uintptr_t (*)()>(dlsym(handle_, "strata_testlib_local_helper_address"));
    ASSERT_NE(local_address, nullptr);
    local_ = file_offset_of(local_address()).value_or(0);
  }
  static void TearDownTestSuite() {
    if (handle_ != nullptr) dlclose(handle_);
  }

  static std::string name_at(const ElfSymbols& syms, uint64_t offset) {
    auto s = syms.lookup_file_offset(offset);
    return s ? s->function : "<none>";
  }

  // stripped.so: no .symtab, no DWARF; lib.debug: the symbols and DWARF that were taken out.
  void make_stripped_and_debug() {
    run("objcopy --only-keep-debug " SYMBOLIZE_TESTLIB " " + tmp_ / "lib.debug");
    run("objcopy --strip-all " SYMBOLIZE_TESTLIB " " + tmp_ / "stripped.so");
  }

  static inline void* handle_ = nullptr;
  static inline uint64_t exported_ = 0, compute_ = 0, nosize_ = 0, local_ = 0;
  TempDir tmp_;
};

TEST_F(SymbolizeLib, FullFile) {
  ASSERT_NE(exported_, 0u);
  ASSERT_NE(local_, 0u);
  auto syms = ElfSymbols::open(SYMBOLIZE_TESTLIB);
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  const ElfSymbols& s = **syms;
  EXPECT_EQ(name_at(s, exported_), "strata_testlib_exported");
  EXPECT_EQ(name_at(s, exported_ + 1), "strata_testlib_exported");
  EXPECT_EQ(name_at(s, compute_), "strata_testlib::Widget::compute(int) const");
  EXPECT_EQ(name_at(s, local_), "local_helper(int)");
  auto line = s.lookup_file_offset(compute_);
  ASSERT_TRUE(line.has_value());
  EXPECT_TRUE(ends_with(line->file, "symbolize_testlib.cpp")) << line->file;
  int mark = marked_line(SYMBOLIZE_TESTLIB_SOURCE, "compute");
  EXPECT_GE(line->line, mark);
  EXPECT_LE(line->line, mark + 2);
}

TEST_F(SymbolizeLib, ZeroSizeSymbolCoversUpToTheNextSymbol) {
  ASSERT_NE(nosize_, 0u);
  auto syms = ElfSymbols::open(SYMBOLIZE_TESTLIB);
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  // Its four nops and the ret: all five bytes are inside it.
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(name_at(**syms, nosize_ + i), "strata_testlib_nosize") << i;
}

TEST_F(SymbolizeLib, StrippedKeepsDynsym) {
  make_stripped_and_debug();
  auto full = ElfSymbols::open(SYMBOLIZE_TESTLIB);
  auto syms = ElfSymbols::open(tmp_ / "stripped.so");
  ASSERT_TRUE(full.ok() && syms.ok());
  const ElfSymbols& s = **syms;
  EXPECT_GT(s.symbol_count(), 0u);
  EXPECT_LT(s.symbol_count(), (*full)->symbol_count());
  EXPECT_EQ(name_at(s, exported_), "strata_testlib_exported");
  EXPECT_EQ(name_at(s, compute_), "strata_testlib::Widget::compute(int) const");
  // The local function is gone with .symtab: whatever covers it now is not it.
  EXPECT_NE(name_at(s, local_), "local_helper(int)");
  EXPECT_EQ(s.build_id(), (*full)->build_id());
  auto line = s.lookup_file_offset(exported_);
  ASSERT_TRUE(line.has_value());
  EXPECT_TRUE(line->file.empty());
}

TEST_F(SymbolizeLib, DebuglinkResolvesFromDebugFile) {
  make_stripped_and_debug();
  run("cd '" + tmp_.path().string() + "' && objcopy --add-gnu-debuglink=lib.debug stripped.so linked.so");
  ElfOptions options;
  options.debug_root = tmp_ / "no-such-root";  // only the debuglink may find it
  auto syms = ElfSymbols::open(tmp_ / "linked.so", options);
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  EXPECT_EQ(name_at(**syms, local_), "local_helper(int)");
  EXPECT_EQ(name_at(**syms, compute_), "strata_testlib::Widget::compute(int) const");
  auto line = (*syms)->lookup_file_offset(compute_);
  ASSERT_TRUE(line.has_value());
  EXPECT_TRUE(ends_with(line->file, "symbolize_testlib.cpp")) << line->file;
  EXPECT_GT(line->line, 0);
}

TEST_F(SymbolizeLib, DebuglinkWithWrongCrcIsIgnored) {
  make_stripped_and_debug();
  run("cd '" + tmp_.path().string() + "' && objcopy --add-gnu-debuglink=lib.debug stripped.so linked.so");
  // The debug file changes after the link was made: its CRC no longer matches.
  { std::ofstream(tmp_ / "lib.debug", std::ios::app) << "x"; }
  ElfOptions options;
  options.debug_root = tmp_ / "no-such-root";
  auto syms = ElfSymbols::open(tmp_ / "linked.so", options);
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  EXPECT_NE(name_at(**syms, local_), "local_helper(int)");
  EXPECT_EQ(name_at(**syms, exported_), "strata_testlib_exported");
}

TEST_F(SymbolizeLib, BuildIdDirectoryResolvesStrippedFile) {
  make_stripped_and_debug();
  auto id = read_build_id(SYMBOLIZE_TESTLIB);
  ASSERT_TRUE(id.ok()) << id.error().message;
  fs::path dir = tmp_.path() / "root" / ".build-id" / id->substr(0, 2);
  fs::create_directories(dir);
  fs::copy_file(tmp_ / "lib.debug", dir / (id->substr(2) + ".debug"));
  ElfOptions options;
  options.debug_root = tmp_ / "root";

  auto syms = ElfSymbols::open(tmp_ / "stripped.so", options);
  ASSERT_TRUE(syms.ok()) << syms.error().message;
  EXPECT_EQ(name_at(**syms, local_), "local_helper(int)");

  // The debug file alone, by build id: its program headers map file offsets too.
  auto by_id = ElfSymbols::open_build_id(*id, options);
  ASSERT_TRUE(by_id.ok()) << by_id.error().message;
  EXPECT_EQ(name_at(**by_id, local_), "local_helper(int)");
  EXPECT_EQ(name_at(**by_id, exported_), "strata_testlib_exported");

  EXPECT_FALSE(ElfSymbols::open_build_id("0123456789abcdef", options).ok());
  EXPECT_FALSE(ElfSymbols::open_build_id("../../etc/passwd", options).ok());
}

// ---------------------------------------------------------------------------------------------
// caching symbolizer

Frame native(const std::string& module, uint64_t offset, const std::string& build_id = "") {
  Frame f;
  f.kind = FrameKind::kNative;
  f.module = module;
  f.offset = offset;
  f.build_id = build_id;
  return f;
}

Frame kernel(uint64_t address) {
  Frame f;
  f.kind = FrameKind::kKernel;
  f.module = "[kernel]";
  f.offset = address;
  return f;
}

TEST_F(SymbolizeLib, SymbolizerResolvesAndKeepsUnknowns) {
  fs::copy_file(SYMBOLIZE_TESTLIB, tmp_ / "lib.so");
  auto id = read_build_id(tmp_ / "lib.so");
  ASSERT_TRUE(id.ok());
  { std::ofstream(tmp_ / "kallsyms") << "ffffffff81000000 T _stext\nffffffff81000100 t do_thing\n"; }
  SymbolizerOptions options;
  options.kallsyms_path = tmp_ / "kallsyms";
  options.elf.debug_root = tmp_ / "root";
  auto sym = make_caching_symbolizer(options);

  std::vector<Frame> frames = {native(tmp_ / "lib.so", local_, *id), native(tmp_ / "lib.so", compute_),
                               native("[unknown]", 0x1234),          native(tmp_ / "missing.so", 0x10),
                               kernel(0xffffffff81000104),           kernel(0x10)};
  sym->symbolize(frames);
  EXPECT_EQ(frames[0].function, "local_helper(int)");
  EXPECT_EQ(frames[1].function, "strata_testlib::Widget::compute(int) const");
  EXPECT_TRUE(ends_with(frames[1].file, "symbolize_testlib.cpp")) << frames[1].file;
  EXPECT_GT(frames[1].line, 0);
  EXPECT_EQ(frames[2].function, "");
  EXPECT_EQ(frames[2].display_name(), "[unknown]+0x1234");
  EXPECT_EQ(frames[3].function, "");
  EXPECT_EQ(frames[3].display_name(), "missing.so+0x10");
  EXPECT_EQ(frames[4].function, "do_thing");
  EXPECT_EQ(frames[5].function, "");

  // Opened once: the file is gone now, its symbols are not.
  fs::remove(tmp_ / "lib.so");
  // Failures are remembered: missing.so appearing later is not read.
  fs::copy_file(SYMBOLIZE_TESTLIB, tmp_ / "missing.so");
  std::vector<Frame> again = {native(tmp_ / "lib.so", exported_), native(tmp_ / "missing.so", exported_)};
  sym->symbolize(again);
  EXPECT_EQ(again[0].function, "strata_testlib_exported");
  EXPECT_EQ(again[1].function, "");
}

// A months-long agent sees ever new files (new images, run-time compiled .so files): the files it
// holds stay bounded, and a file dropped to make room resolves again when it comes back.
TEST_F(SymbolizeLib, SymbolizerHoldsABoundedNumberOfFiles) {
  fs::copy_file(SYMBOLIZE_TESTLIB, tmp_ / "lib.so");
  SymbolizerOptions options;
  options.kallsyms_path = tmp_ / "no-kallsyms";
  options.elf.debug_root = tmp_ / "root";
  auto sym = make_caching_symbolizer(options);
  constexpr int kFiles = 20'000;     // distinct paths, none readable: each is remembered as such
  constexpr size_t kBound = 4'096;   // well above the cap, far below kFiles
  size_t most = 0;
  for (int i = 0; i < kFiles; ++i) {
    std::vector<Frame> frames = {native(tmp_ / ("gone-" + std::to_string(i) + ".so"), 0x10)};
    if (i % 1000 == 0) frames.push_back(native(tmp_ / "lib.so", exported_));
    sym->symbolize(frames);
    most = std::max(most, sym->cached_files());
    if (i % 1000 == 0) {
      EXPECT_EQ(frames[1].function, "strata_testlib_exported") << "after " << i << " files";
    }
  }
  EXPECT_GT(most, 0u);
  EXPECT_LT(most, kBound);
}

TEST_F(SymbolizeLib, SymbolizerDistrustsAChangedBinary) {
  make_stripped_and_debug();
  auto id = read_build_id(SYMBOLIZE_TESTLIB);
  ASSERT_TRUE(id.ok());
  // The path now holds another ELF file: the sampled build id does not match it.
  fs::copy_file(fs::read_symlink("/proc/self/exe"), tmp_ / "lib.so");
  std::string wrong_id = std::string(id->size(), '0');

  SymbolizerOptions options;
  options.kallsyms_path = tmp_ / "no-kallsyms";
  options.elf.debug_root = tmp_ / "root";
  {
    auto sym = make_caching_symbolizer(options);
    std::vector<Frame> frames = {native(tmp_ / "lib.so", exported_, *id),
                                 native(tmp_ / "lib.so", exported_, wrong_id), kernel(0xffffffff81000000)};
    sym->symbolize(frames);
    EXPECT_EQ(frames[0].function, "");
    EXPECT_EQ(frames[1].function, "");
    EXPECT_EQ(frames[2].function, "");  // no kallsyms: kernel frames stay as they are
  }
  // With the build id's debug file installed, the sampled code resolves again.
  fs::path dir = tmp_.path() / "root" / ".build-id" / id->substr(0, 2);
  fs::create_directories(dir);
  fs::copy_file(tmp_ / "lib.debug", dir / (id->substr(2) + ".debug"));
  auto sym = make_caching_symbolizer(options);
  std::vector<Frame> frames = {native(tmp_ / "lib.so", exported_, *id), native(tmp_ / "lib.so", local_, *id)};
  sym->symbolize(frames);
  EXPECT_EQ(frames[0].function, "strata_testlib_exported");
  EXPECT_EQ(frames[1].function, "local_helper(int)");
}

// ---------------------------------------------------------------------------------------------
// kallsyms

TEST(SymbolizeKallsyms, ParsesTextSymbols) {
  TempDir tmp;
  {
    std::ofstream f(tmp / "kallsyms");
    f << "0000000000000000 A fixed_percpu_data\n"
         "ffffffff81000000 T _stext\n"
         "ffffffff81000000 T _text\n"
         "ffffffff81001000 t helper_one\n"
         "ffffffff81001800 D some_data\n"
         "ffffffff81002000 W weak_thing\n"
         "not a line at all\n"
         "zzzzzzzzzzzzzzzz T bad_address\n"
         "ffffffffc0a00000 t mod_func\t[my_module]\n"
         "ffffffffc0a00040 T mod_other\t[my_module]\n";
  }
  auto k = Kallsyms::load(tmp / "kallsyms");
  ASSERT_TRUE(k.ok()) << k.error().message;
  EXPECT_EQ((*k)->symbol_count(), 5u);  // _stext/_text are one address
  auto name = [&](uint64_t a) {
    auto s = (*k)->lookup(a);
    return s ? s->function : "<none>";
  };
  EXPECT_EQ(name(0xffffffff80ffffff), "<none>");
  EXPECT_EQ(name(0xffffffff81000000), "_stext");
  EXPECT_EQ(name(0xffffffff81000fff), "_stext");
  EXPECT_EQ(name(0xffffffff81001000), "helper_one");
  EXPECT_EQ(name(0xffffffff81001900), "helper_one");  // data symbols do not split text
  EXPECT_EQ(name(0xffffffff81002004), "weak_thing");
  EXPECT_EQ(name(0xffffffffc0a00010), "mod_func");
  EXPECT_EQ(name(0xffffffffc0a00050), "mod_other");
  // Past the last symbol by more than any function is long: not resolved.
  EXPECT_EQ(name(0xffffffffc0a00040 + (1 << 21)), "<none>");
  // By name: a function runs to the next symbol (the off-CPU source cuts stacks at __schedule's).
  auto helper = (*k)->range_of("helper_one");
  ASSERT_TRUE(helper);
  EXPECT_EQ(helper->first, 0xffffffff81001000u);
  EXPECT_EQ(helper->second, 0xffffffff81002000u);
  EXPECT_FALSE((*k)->range_of("some_data"));  // not text
  EXPECT_FALSE((*k)->range_of("nothing_by_this_name"));
}

TEST(SymbolizeKallsyms, HiddenAddressesAreAnError) {
  TempDir tmp;
  { std::ofstream(tmp / "kallsyms") << "0000000000000000 T _stext\n0000000000000000 t foo\n"; }
  auto k = Kallsyms::load(tmp / "kallsyms");
  ASSERT_FALSE(k.ok());
  EXPECT_NE(k.error().message.find("kptr_restrict"), std::string::npos) << k.error().message;
}

TEST(SymbolizeKallsyms, BadFilesAreErrors) {
  TempDir tmp;
  { std::ofstream(tmp / "empty"); }
  { std::ofstream(tmp / "data") << "ffffffff81000000 D only_data\n"; }
  EXPECT_FALSE(Kallsyms::load(tmp / "empty").ok());
  EXPECT_FALSE(Kallsyms::load(tmp / "data").ok());
  EXPECT_FALSE(Kallsyms::load(tmp / "missing").ok());
  EXPECT_FALSE(Kallsyms::load(tmp.path().string()).ok());
}

TEST(SymbolizeKallsyms, RealFileLoadsOrSaysWhy) {
  auto k = Kallsyms::load("/proc/kallsyms");
  if (k.ok()) {
    EXPECT_GT((*k)->symbol_count(), 1000u);
  } else {
    EXPECT_NE(k.error().message.find("kptr_restrict"), std::string::npos) << k.error().message;
  }
}

// ---------------------------------------------------------------------------------------------
// perf maps

TEST(SymbolizePerfMap, LooksUpJitSymbols) {
  std::string path = "/tmp/perf-" + std::to_string(getpid()) + ".map";
  {
    std::ofstream f(path);
    f << "7f0000001000 100 LazyCompile:~work /app/x.js:10\n"
         "7f0000002000 20 py::main:/app/main.py\r\n"
         "garbage\n"
         "0x7f0000003000 0x10 with_prefix\n";
  }
  auto name = [](uint64_t a) {
    auto s = lookup_perf_map(getpid(), a);
    return s ? s->function : "<none>";
  };
  EXPECT_EQ(name(0x7f0000001000), "LazyCompile:~work /app/x.js:10");
  EXPECT_EQ(name(0x7f00000010ff), "LazyCompile:~work /app/x.js:10");
  EXPECT_EQ(name(0x7f0000001100), "<none>");
  EXPECT_EQ(name(0x7f0000002010), "py::main:/app/main.py");
  EXPECT_EQ(name(0x7f0000003001), "with_prefix");
  std::remove(path.c_str());
  EXPECT_FALSE(lookup_perf_map(getpid(), 0x7f0000001000).has_value());
}

// ---------------------------------------------------------------------------------------------
// hostile input

TEST(SymbolizeHostile, NonElfInputsAreErrors) {
  TempDir tmp;
  { std::ofstream(tmp / "empty"); }
  { std::ofstream(tmp / "text") << "#!/bin/sh\necho hello\n"; }
  {
    std::ofstream(tmp / "fake") << "\x7f"
                                   "ELF garbage that is not really an ELF header";
  }
  for (const std::string& path : {tmp / "empty", tmp / "text", tmp / "fake", tmp.path().string(),
                                  tmp / "missing", std::string("/dev/null")}) {
    auto syms = ElfSymbols::open(path);
    EXPECT_FALSE(syms.ok()) << path;
    if (!syms.ok()) {
      EXPECT_NE(syms.error().message.find(path), std::string::npos) << syms.error().message;
    }
    EXPECT_FALSE(read_build_id(path).ok()) << path;
  }
}

TEST(SymbolizeHostile, TruncatedFilesNeverCrash) {
  TempDir tmp;
  std::ifstream in(SYMBOLIZE_TESTLIB, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 4096u);
  for (size_t len : {size_t{1}, size_t{4}, size_t{16}, size_t{52}, size_t{63}, size_t{64}, size_t{100},
                     size_t{512}, size_t{4096}, bytes.size() / 2, bytes.size() - 64, bytes.size() - 1}) {
    std::string path = tmp / ("cut" + std::to_string(len));
    std::ofstream(path, std::ios::binary) << bytes.substr(0, len);
    auto syms = ElfSymbols::open(path);
    if (len < 64) {
      EXPECT_FALSE(syms.ok()) << len;  // shorter than an ELF64 header
    }
    if (syms.ok()) {
      for (uint64_t off = 0; off < bytes.size(); off += 97) (void)(*syms)->lookup_file_offset(off);
    }
    (void)read_build_id(path);
  }
}

TEST(SymbolizeHostile, CorruptedBytesNeverCrash) {
  TempDir tmp;
  std::ifstream in(SYMBOLIZE_TESTLIB, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 4096u);
  // Deterministic damage: headers, the section header table at the end, and anywhere.
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  std::string path = tmp / "corrupt.so";
  int opened = 0;
  for (int round = 0; round < 300; ++round) {
    std::string b = bytes;
    for (int i = 0; i < 8; ++i) {
      size_t where;
      switch (next() % 3) {
        case 0:
          where = next() % 64;
          break;
        case 1:
          where = b.size() - 1 - next() % 2048;
          break;
        default:
          where = next() % b.size();
          break;
      }
      b[where] = static_cast<char>(next());
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
    auto syms = ElfSymbols::open(path);
    if (syms.ok()) {
      ++opened;
      for (uint64_t off = 0; off < b.size(); off += 61) (void)(*syms)->lookup_file_offset(off);
    }
    (void)read_build_id(path);
  }
  EXPECT_GT(opened, 0);  // the damage is not so total that nothing parses
}

}  // namespace
