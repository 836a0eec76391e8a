// Symbolization: turns normalized frames (build id + file offset, kernel address) into function
// names. Split from normalization (blazesym's habit): the node normalizes, symbols are resolved once
// per build id and cached, anywhere.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/frame.h"
#include "common/result.h"

namespace strata::symbolize {

struct Symbol {
  std::string function;  // demangled
  std::string file;      // source file, when debug info tells (may stay empty)
  int line = 0;
  // When DWARF says functions were inlined at the address: every function as the source reads,
  // leaf first, ending with `function` at the line of the outermost call (common/frame.h).
  std::vector<InlinedFrame> inlined;
};

// Reads the GNU build id note of an ELF file, as lowercase hex.
Result<std::string> read_build_id(const std::string& path);

// C++ demangling; returns the input unchanged when it is not a mangled name.
std::string demangle(const std::string& name);

// Where ElfSymbols looks for separate debug files, and whether it reads DWARF lines.
struct ElfOptions {
  // Root of the debug file tree: <root>/.build-id/xx/yyyy.debug and <root>/<dir>/<debuglink>.
  // Tests point it at a temporary folder.
  std::string debug_root = "/usr/lib/debug";
  // file:line from DWARF (libdw) when the file or its debug file has line info. Keeps the
  // DWARF file mapped while the ElfSymbols lives.
  bool line_info = true;
  // Inlined-function chains from a per-CU index of function scopes, built once per CU (off: libdw's
  // walk from the CU's root for every address; tests compare the two).
  bool inline_index = true;
};

// Symbols of one ELF file: .symtab, else .dynsym; and those of its separate debug file when
// .gnu_debuglink (or /usr/lib/debug/.build-id/xx/yyyy.debug) names one that exists.
class ElfSymbols {
 public:
  static Result<std::unique_ptr<ElfSymbols>> open(const std::string& path);
  static Result<std::unique_ptr<ElfSymbols>> open(const std::string& path, const ElfOptions& options);
  // The debug file <debug_root>/.build-id/xx/yyyy.debug alone, when its build id is build_id: for
  // frames whose binary changed on disk since they were sampled.
  static Result<std::unique_ptr<ElfSymbols>> open_build_id(const std::string& build_id,
                                                           const ElfOptions& options = {});
  virtual ~ElfSymbols() = default;
  // Lookup by file offset (what the node normalized to); mapped to a virtual address through the
  // PT_LOAD program headers.
  virtual std::optional<Symbol> lookup_file_offset(uint64_t file_offset) const = 0;
  // Lookup by ELF virtual address.
  virtual std::optional<Symbol> lookup_vaddr(uint64_t vaddr) const = 0;
  virtual const std::string& build_id() const = 0;
  virtual size_t symbol_count() const = 0;
};

// Kernel symbols from /proc/kallsyms (or another file in that format, for tests).
class Kallsyms {
 public:
  static Result<std::unique_ptr<Kallsyms>> load(const std::string& path = "/proc/kallsyms");
  // /proc/kallsyms, read once per process for everyone who needs it (the symbolizer, the off-CPU
  // source's __schedule range); nullptr when it cannot be read.
  static std::shared_ptr<const Kallsyms> shared();
  virtual ~Kallsyms() = default;
  virtual std::optional<Symbol> lookup(uint64_t address) const = 0;
  // [start, end) of a kernel function by name; nullopt when absent.
  virtual std::optional<std::pair<uint64_t, uint64_t>> range_of(std::string_view function) const = 0;
  virtual size_t symbol_count() const = 0;
};

// JIT code named by a perf map, /tmp/perf-PID.map: lines of "START SIZE name", hex without 0x
// (what V8, the JVM's perf-map-agent and Python 3.12's perf trampoline write). Reads the file on
// every call: meant for the rare frame in anonymous memory, not for a hot loop.
std::optional<Symbol> lookup_perf_map(int pid, uint64_t addr);
std::optional<Symbol> lookup_perf_map_file(const std::string& path, uint64_t addr);

// Resolves frames in place. Caches per build id (and per path for files without one); a file that
// cannot be read is remembered as such, so it is tried once.
class Symbolizer {
 public:
  virtual ~Symbolizer() = default;
  // Fills function/file/line of each frame that it can resolve; leaves the others as they are.
  virtual void symbolize(std::vector<Frame>& frames) = 0;
  // Files it holds (with their symbols, or remembered as unreadable): bounded by a constant.
  virtual size_t cached_files() const { return 0; }
};

// The default: ELF files by path (the frame's module), checked against the frame's build id when
// both are known; kernel frames from kallsyms.
std::unique_ptr<Symbolizer> make_caching_symbolizer(const std::string& kallsyms_path = "/proc/kallsyms");

struct SymbolizerOptions {
  std::string kallsyms_path = "/proc/kallsyms";
  ElfOptions elf;
};
std::unique_ptr<Symbolizer> make_caching_symbolizer(const SymbolizerOptions& options);

}  // namespace strata::symbolize
