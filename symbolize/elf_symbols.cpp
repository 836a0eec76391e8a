#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <limits>
#include <optional>
#include <unordered_map>

#include "symbolize/elf_file.h"
#include "symbolize/symbol_table.h"
#include "symbolize/symbolizer.h"

namespace strata::symbolize {

namespace {

constexpr uint64_t kNoLimit = std::numeric_limits<uint64_t>::max();

// file:line from DWARF through libdw. The DWARF file is opened by libdw itself (mapped, not read
// into memory: debug info can be gigabytes; the price is that a file truncated in place while mapped
// would fault, where installs replace files by rename). A per-CU address table makes the lookup
// independent of .debug_aranges, which clang does not emit.
class LineTable {
 public:
  static std::unique_ptr<LineTable> open(const std::string& path) {
    auto table = std::make_unique<LineTable>();
    table->fd_ = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    struct stat st;
    if (table->fd_.get() < 0 || ::fstat(table->fd_.get(), &st) != 0 || !S_ISREG(st.st_mode)) return nullptr;
    table->dwarf_.reset(dwarf_begin(table->fd_.get(), DWARF_C_READ));
    if (!table->dwarf_) return nullptr;  // no DWARF: not an error, lines just stay empty
    Dwarf_CU* cu = nullptr;
    Dwarf_CU* next = nullptr;
    Dwarf_Half version = 0;
    uint8_t unit_type = 0;
    Dwarf_Die cudie;
    Dwarf_Die subdie;
    while (dwarf_get_units(table->dwarf_.get(), cu, &next, &version, &unit_type, &cudie, &subdie) == 0) {
      cu = next;
      if (unit_type != DW_UT_compile && unit_type != DW_UT_skeleton) continue;
      Dwarf_Addr base = 0, lo = 0, hi = 0;
      ptrdiff_t off = 0;
      while ((off = dwarf_ranges(&cudie, off, &base, &lo, &hi)) > 0) {
        if (hi > lo) table->ranges_.push_back(CuRange{lo, hi, cudie});
      }
    }
    if (table->ranges_.empty()) return nullptr;
    std::sort(table->ranges_.begin(), table->ranges_.end(),
              [](const CuRange& a, const CuRange& b) { return a.lo < b.lo; });
    table->ranges_.shrink_to_fit();
    return table;
  }

  // Not thread-safe: libdw fills its line caches on first use.
  bool lookup(uint64_t vaddr, std::string& file, int& line, Dwarf_Die* cu_out = nullptr) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), vaddr,
                               [](uint64_t a, const CuRange& r) { return a < r.lo; });
    // CU ranges rarely overlap; a few steps back covers the ones that do.
    for (int i = 0; i < 4 && it != ranges_.begin(); ++i) {
      --it;
      if (vaddr >= it->hi) continue;
      Dwarf_Die die = it->cu;
      Dwarf_Line* l = dwarf_getsrc_die(&die, vaddr);
      if (l == nullptr) continue;
      const char* src = dwarf_linesrc(l, nullptr, nullptr);
      int n = 0;
      if (src == nullptr || dwarf_lineno(l, &n) != 0) continue;
      file = src;
      line = n;
      if (cu_out) *cu_out = die;
      return true;
    }
    return false;
  }

  // The functions DWARF says were inlined at vaddr, leaf first (see Symbol::inlined): each
  // DW_TAG_inlined_subroutine scope around the address is a function at the line where the next
  // inner one was called (its DW_AT_call_file / DW_AT_call_line); `outer` closes the chain. Empty
  // when nothing is inlined there.
  void lookup_inlined(Dwarf_Die cu, uint64_t vaddr, const std::string& outer, std::string file, int line,
                      std::vector<InlinedFrame>& out) const {
    if (!scope_index_) {
      lookup_inlined_libdw(cu, vaddr, outer, std::move(file), line, out);
      return;
    }
    const ScopeIndex& index = scopes_of(cu);
    int32_t scope = index.innermost(vaddr);
    Dwarf_Files* files = nullptr;
    size_t nfiles = 0;
    if (scope >= 0 && dwarf_getsrcfiles(&cu, &files, &nfiles) != 0) files = nullptr;
    // Innermost first: each inlined scope is a function at the line where the next inner one was
    // called; the chain ends at the function they were all inlined into.
    for (; scope >= 0 && index.scopes[scope].inlined; scope = index.scopes[scope].parent) {
      Dwarf_Die die;
      if (dwarf_offdie(dwarf_.get(), index.scopes[scope].die, &die) == nullptr) break;
      out.push_back(InlinedFrame{name_of_inlined(&die), file, line});
      file.clear();
      line = 0;
      Dwarf_Attribute a;
      Dwarf_Word w = 0;
      if (files && dwarf_attr(&die, DW_AT_call_file, &a) && dwarf_formudata(&a, &w) == 0 && w < nfiles) {
        if (const char* src = dwarf_filesrc(files, w, nullptr, nullptr)) file = src;
      }
      if (dwarf_attr(&die, DW_AT_call_line, &a) && dwarf_formudata(&a, &w) == 0) line = static_cast<int>(w);
    }
    if (!out.empty()) out.push_back(InlinedFrame{outer, file, line});
  }

  // The same answer from libdw's own scope walk (ElfOptions::inline_index off): two walks from the
  // CU's root for every address, and one more per inlined function for its name.
  void lookup_inlined_libdw(Dwarf_Die cu, uint64_t vaddr, const std::string& outer, std::string file, int line,
                            std::vector<InlinedFrame>& out) const {
    // dwarf_getscopes gives the innermost scope at the address, but past an inlined instance it
    // goes on with the abstract definition's scopes; the concrete parents (the functions it was
    // inlined into) come from dwarf_getscopes_die on that innermost scope (as eu-addr2line -i).
    Dwarf_Die* found = nullptr;
    int nfound = dwarf_getscopes(&cu, vaddr, &found);
    if (nfound <= 0) return;
    Dwarf_Die innermost = found[0];
    free(found);
    Dwarf_Die* scopes = nullptr;
    int n = dwarf_getscopes_die(&innermost, &scopes);
    if (n <= 0) return;
    Dwarf_Files* files = nullptr;
    size_t nfiles = 0;
    if (dwarf_getsrcfiles(&cu, &files, &nfiles) != 0) files = nullptr;
    for (int i = 0; i < n; ++i) {
      int tag = dwarf_tag(&scopes[i]);
      if (tag == DW_TAG_subprogram) break;  // the function the chain was inlined into
      if (tag != DW_TAG_inlined_subroutine) continue;
      out.push_back(InlinedFrame{inlined_name(&scopes[i]), file, line});
      file.clear();
      line = 0;
      Dwarf_Attribute a;
      Dwarf_Word w = 0;
      if (files && dwarf_attr(&scopes[i], DW_AT_call_file, &a) && dwarf_formudata(&a, &w) == 0 && w < nfiles) {
        if (const char* src = dwarf_filesrc(files, w, nullptr, nullptr)) file = src;
      }
      if (dwarf_attr(&scopes[i], DW_AT_call_line, &a) && dwarf_formudata(&a, &w) == 0) line = static_cast<int>(w);
    }
    free(scopes);
    if (!out.empty()) out.push_back(InlinedFrame{outer, file, line});
  }

  void set_scope_index(bool on) { scope_index_ = on; }

 private:
  // The function scopes of one CU that hold code (DW_TAG_subprogram and DW_TAG_inlined_subroutine
  // with address ranges), built by one walk of its DIE tree the first time an address of the CU is
  // looked up. libdw's dwarf_getscopes walks the CU from its root for every address, and naming the
  // chain walks it again per function: measured at 1-3 ms an address on strata-sim-rank's CUs, a
  // quarter of the node agent's CPU on the sim job (each window brings addresses not seen before).
  struct ScopeIndex {
    struct Scope {
      Dwarf_Off die;
      int32_t parent;  // the enclosing function scope, -1 for none
      bool inlined;
    };
    struct Range {
      uint64_t lo;
      uint64_t hi;
      uint32_t depth;
      int32_t scope;
    };
    std::vector<Scope> scopes;
    std::vector<Range> ranges;  // by lo, then outer before inner: see innermost()

    // Function scopes nest (an inlined call lies within its caller's code), so of the ranges that
    // hold vaddr the innermost starts last; a backward scan from vaddr meets it first, past the
    // ranges that ended before vaddr.
    int32_t innermost(uint64_t vaddr) const {
      auto it = std::upper_bound(ranges.begin(), ranges.end(), vaddr,
                                 [](uint64_t a, const Range& r) { return a < r.lo; });
      while (it != ranges.begin()) {
        --it;
        if (vaddr < it->hi) return it->scope;
      }
      return -1;
    }
  };

  static bool may_hold_code(int tag) {
    switch (tag) {
      case DW_TAG_compile_unit:
      case DW_TAG_partial_unit:
      case DW_TAG_namespace:
      case DW_TAG_module:
      case DW_TAG_subprogram:
      case DW_TAG_inlined_subroutine:
      case DW_TAG_lexical_block:
      case DW_TAG_try_block:
      case DW_TAG_catch_block:
      case DW_TAG_structure_type:
      case DW_TAG_class_type:
      case DW_TAG_union_type:
        return true;
      default:
        return false;
    }
  }

  // Depth-first over the CU's DIEs, with an explicit stack (DWARF nests deep in template code).
  static ScopeIndex build_index(Dwarf_Die cu) {
    ScopeIndex index;
    struct Open {
      Dwarf_Die die;
      int32_t scope;  // the innermost function scope around die's children
      uint32_t depth;
    };
    std::vector<Open> todo;
    Dwarf_Die child;
    if (dwarf_child(&cu, &child) == 0) todo.push_back(Open{child, -1, 0});
    while (!todo.empty()) {
      Open o = todo.back();
      todo.pop_back();
      // o.die and its later siblings share the parent scope o.scope.
      Dwarf_Die sibling;
      if (dwarf_siblingof(&o.die, &sibling) == 0) todo.push_back(Open{sibling, o.scope, o.depth});
      int tag = dwarf_tag(&o.die);
      if (!may_hold_code(tag)) continue;
      int32_t inner = o.scope;
      uint32_t depth = o.depth;
      if (tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine) {
        Dwarf_Addr base = 0, lo = 0, hi = 0;
        ptrdiff_t off = 0;
        bool any = false;
        const auto id = static_cast<int32_t>(index.scopes.size());
        while ((off = dwarf_ranges(&o.die, off, &base, &lo, &hi)) > 0) {
          if (hi <= lo) continue;
          index.ranges.push_back(ScopeIndex::Range{lo, hi, depth + 1, id});
          any = true;
        }
        if (any) {
          // A function is never inlined into the scope that declares it (a local class's method):
          // only an inlined call has a caller here.
          const bool inlined = tag == DW_TAG_inlined_subroutine;
          index.scopes.push_back(ScopeIndex::Scope{dwarf_dieoffset(&o.die), inlined ? o.scope : -1, inlined});
          inner = id;
          depth += 1;
        }
      }
      if (dwarf_haschildren(&o.die) > 0 && dwarf_child(&o.die, &child) == 0) todo.push_back(Open{child, inner, depth});
    }
    std::sort(index.ranges.begin(), index.ranges.end(), [](const ScopeIndex::Range& a, const ScopeIndex::Range& b) {
      if (a.lo != b.lo) return a.lo < b.lo;
      if (a.hi != b.hi) return a.hi > b.hi;  // the outer of two ranges that start together first
      return a.depth < b.depth;              // the same code: the deeper scope is the inner one
    });
    index.scopes.shrink_to_fit();
    index.ranges.shrink_to_fit();
    return index;
  }

  const ScopeIndex& scopes_of(Dwarf_Die cu) const {
    Dwarf_Off key = dwarf_dieoffset(&cu);
    if (auto it = indexes_.find(key); it != indexes_.end()) return it->second;
    if (indexed_ranges_ >= kMaxIndexedRanges) {
      indexes_.clear();
      indexed_ranges_ = 0;
    }
    ScopeIndex index = build_index(cu);
    indexed_ranges_ += index.ranges.size() + index.scopes.size();
    return indexes_.emplace(key, std::move(index)).first->second;
  }

  const std::string& name_of_inlined(Dwarf_Die* die) const {
    Dwarf_Off key = dwarf_dieoffset(die);
    if (auto it = names_.find(key); it != names_.end()) return it->second;
    if (names_.size() >= kMaxInlinedNames) names_.clear();
    return names_.emplace(key, inlined_name(die)).first->second;
  }

  // Memory bounds for the caches above, cleared when reached (rebuilt as addresses come): a CU of
  // heavy template code has tens of thousands of function scopes (24 bytes each, and ~24 per range),
  // so a million entries is ~24-48 MB; names are a few hundred bytes each.
  static constexpr size_t kMaxIndexedRanges = 1 << 20;
  static constexpr size_t kMaxInlinedNames = 1 << 16;

 private:
  // A DIE's linkage name demangled (fully qualified, as the symbol table spells it), if it has one.
  static std::optional<std::string> linkage_name(Dwarf_Die* die) {
    Dwarf_Attribute a;
    for (int at : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
      if (dwarf_attr_integrate(die, at, &a)) {
        if (const char* n = dwarf_formstring(&a)) return demangle(n);
      }
    }
    return std::nullopt;
  }

  // An inlined function's name from its abstract origin: the linkage name demangled, else DW_AT_name
  // qualified by the scopes that declare it. GCC gives an inlined lambda's operator() no linkage
  // name, so its bare name is "operator()", which says nothing; its scopes make it
  // "main::{lambda}::operator()", the spelling the demangler gives an out-of-line lambda
  // ("main::{lambda(int)#1}::operator()(int) const"), so readers treat both alike.
  static std::string inlined_name(Dwarf_Die* die) {
    if (auto n = linkage_name(die)) return *n;
    Dwarf_Attribute a;
    const char* name = dwarf_attr_integrate(die, DW_AT_name, &a) ? dwarf_formstring(&a) : nullptr;
    if (name == nullptr) return "[inlined]";
    return scope_prefix(die) + name;
  }

  // "outer::inner::" for the scopes (namespaces, classes, an enclosing function) that declare the
  // function an inlined DIE stands for; empty when nothing encloses it or the chain cannot be read.
  static std::string scope_prefix(Dwarf_Die* inlined) {
    Dwarf_Die decl = *inlined;
    Dwarf_Attribute a;
    // The abstract origin, then its declaration (a member defined outside its class).
    for (int at : {DW_AT_abstract_origin, DW_AT_specification}) {
      Dwarf_Die next;
      if (dwarf_attr(&decl, at, &a) && dwarf_formref_die(&a, &next) != nullptr) decl = next;
    }
    Dwarf_Die* scopes = nullptr;
    int n = dwarf_getscopes_die(&decl, &scopes);
    if (n <= 1) {
      free(scopes);
      return "";
    }
    std::string prefix;
    for (int i = 1; i < n; ++i) {  // scopes[0] is the declaration itself, the CU comes last
      Dwarf_Die* s = &scopes[i];
      int tag = dwarf_tag(s);
      const char* name = dwarf_attr(s, DW_AT_name, &a) ? dwarf_formstring(&a) : nullptr;
      if (tag == DW_TAG_subprogram) {  // a function's own name is qualified already when linked
        auto full = linkage_name(s);
        prefix = (full ? *full : std::string(name ? name : "[function]")) + "::" + prefix;
        break;
      }
      if (tag == DW_TAG_namespace) {
        prefix = std::string(name ? name : "(anonymous namespace)") + "::" + prefix;
      } else if (tag == DW_TAG_structure_type || tag == DW_TAG_class_type || tag == DW_TAG_union_type) {
        // A closure type has no name; the demangler calls it {lambda(...)#N}.
        prefix = std::string(name ? name : "{lambda}") + "::" + prefix;
      } else {
        break;  // the CU, or a scope no name is built from
      }
    }
    free(scopes);
    return prefix;
  }

  struct DwarfDeleter {
    void operator()(Dwarf* d) const { dwarf_end(d); }
  };
  struct CuRange {
    uint64_t lo;
    uint64_t hi;
    Dwarf_Die cu;
  };
  UniqueFd fd_;
  std::unique_ptr<Dwarf, DwarfDeleter> dwarf_;  // after fd_: ended before the fd closes
  std::vector<CuRange> ranges_;
  bool scope_index_ = true;
  mutable std::unordered_map<Dwarf_Off, ScopeIndex> indexes_;  // by the CU's DIE offset
  mutable size_t indexed_ranges_ = 0;
  mutable std::unordered_map<Dwarf_Off, std::string> names_;  // inlined functions' names by DIE offset
};

struct Segment {
  uint64_t offset;
  uint64_t filesz;
  uint64_t vaddr;
};

class ElfFile final : public ElfSymbols {
 public:
  ElfFile(std::string build_id, std::vector<Segment> segments, SymbolTable symbols,
          std::unique_ptr<LineTable> lines)
      : build_id_(std::move(build_id)),
        segments_(std::move(segments)),
        symbols_(std::move(symbols)),
        lines_(std::move(lines)) {}

  std::optional<Symbol> lookup_file_offset(uint64_t file_offset) const override {
    for (const Segment& s : segments_) {
      if (file_offset >= s.offset && file_offset - s.offset < s.filesz) {
        return lookup_vaddr(file_offset - s.offset + s.vaddr);
      }
    }
    return std::nullopt;
  }

  std::optional<Symbol> lookup_vaddr(uint64_t vaddr) const override {
    const SymbolTable::Entry* e = symbols_.find(vaddr);
    if (e == nullptr) return std::nullopt;
    Symbol s;
    s.function = demangle(std::string(symbols_.name(*e)));
    Dwarf_Die cu;
    if (lines_ && lines_->lookup(vaddr, s.file, s.line, &cu)) lines_->lookup_inlined(cu, vaddr, s.function, s.file, s.line, s.inlined);
    return s;
  }

  const std::string& build_id() const override { return build_id_; }
  size_t symbol_count() const override { return symbols_.size(); }

 private:
  std::string build_id_;
  std::vector<Segment> segments_;
  SymbolTable symbols_;
  std::unique_ptr<LineTable> lines_;
};

// Adds the function symbols of every section of this type; returns how many.
size_t add_function_symbols(Elf* elf, GElf_Word section_type, SymbolTable& table) {
  size_t shnum = 0;
  if (elf_getshdrnum(elf, &shnum) != 0) return 0;
  // Section ends bound zero-size symbols, which otherwise run to the next symbol.
  std::vector<uint64_t> section_end(shnum, kNoLimit);
  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    size_t idx = elf_ndxscn(scn);
    if (gelf_getshdr(scn, &sh) == nullptr || idx >= shnum) continue;
    if (sh.sh_addr + sh.sh_size > sh.sh_addr) section_end[idx] = sh.sh_addr + sh.sh_size;
  }
  size_t added = 0;
  scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != section_type) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr) continue;
    GElf_Sym sym;
    for (int i = 0; gelf_getsym(data, i, &sym) != nullptr; ++i) {
      int type = GELF_ST_TYPE(sym.st_info);
      if (type != STT_FUNC && type != STT_GNU_IFUNC) continue;
      if (sym.st_shndx == SHN_UNDEF || sym.st_value == 0) continue;
      const char* name = elf_strptr(elf, sh.sh_link, sym.st_name);
      if (name == nullptr || *name == '\0') continue;
      uint64_t limit = sym.st_shndx < shnum ? section_end[sym.st_shndx] : kNoLimit;
      int bind = GELF_ST_BIND(sym.st_info);
      int rank = bind == STB_GLOBAL ? 0 : bind == STB_WEAK ? 1 : 2;
      table.add(sym.st_value, sym.st_size, limit, rank, name);
      ++added;
    }
  }
  return added;
}

std::vector<Segment> load_segments(Elf* elf) {
  std::vector<Segment> segments;
  size_t phnum = 0;
  if (elf_getphdrnum(elf, &phnum) != 0) return segments;
  std::vector<bool> exec;
  std::vector<GElf_Phdr> loads;
  for (size_t i = 0; i < phnum; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr || ph.p_type != PT_LOAD) continue;
    loads.push_back(ph);
  }
  // Code is never bss: executable segments without file bytes mean a separate debug file.
  bool debug_only = std::any_of(loads.begin(), loads.end(), [](const GElf_Phdr& ph) {
    return (ph.p_flags & PF_X) != 0 && ph.p_filesz == 0 && ph.p_memsz > 0;
  });
  uint64_t next_offset = 0;
  for (const GElf_Phdr& ph : loads) {
    if (!debug_only) {
      segments.push_back(Segment{ph.p_offset, ph.p_filesz, ph.p_vaddr});
    } else {
      // objcopy --only-keep-debug zeroes file sizes and offsets. Rebuild them the way GNU ld
      // and lld lay segments out: in order, each at the first offset past the previous one that
      // is congruent to its vaddr modulo its alignment.
      uint64_t align = ph.p_align != 0 && (ph.p_align & (ph.p_align - 1)) == 0 ? ph.p_align : 1;
      uint64_t want = ph.p_vaddr & (align - 1);
      uint64_t offset = (next_offset & ~(align - 1)) + want;
      if (offset < next_offset) offset += align;
      segments.push_back(Segment{offset, ph.p_memsz, ph.p_vaddr});
      next_offset = offset + ph.p_memsz;
    }
    exec.push_back((ph.p_flags & PF_X) != 0);
  }
  // Executable segments first: where a page is shared by two segments, code is what frames hit.
  std::vector<Segment> ordered;
  for (int want_exec = 1; want_exec >= 0; --want_exec) {
    for (size_t i = 0; i < segments.size(); ++i) {
      if (exec[i] == (want_exec == 1)) ordered.push_back(segments[i]);
    }
  }
  return ordered;
}

std::optional<uint32_t> file_crc32(int fd) {
  std::array<unsigned char, 64 * 1024> buf;
  uLong crc = crc32(0L, Z_NULL, 0);
  off_t pos = 0;
  for (;;) {
    ssize_t n = ::pread(fd, buf.data(), buf.size(), pos);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
    pos += n;
  }
  return static_cast<uint32_t>(crc);
}

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

bool is_hex(const std::string& s) {
  return std::all_of(s.begin(), s.end(),
                     [](unsigned char c) { return std::isxdigit(c) && !std::isupper(c); });
}

std::string build_id_debug_path(const std::string& build_id, const ElfOptions& options) {
  return options.debug_root + "/.build-id/" + build_id.substr(0, 2) + "/" + build_id.substr(2) + ".debug";
}

// The separate debug file of main: by build id first (its id proves the match), then by
// .gnu_debuglink in gdb's places, checked by CRC.
std::optional<ElfHandle> find_debug_file(const ElfHandle& main, const std::string& build_id,
                                         const ElfOptions& options) {
  if (build_id.size() > 2 && is_hex(build_id)) {
    auto h = open_elf(build_id_debug_path(build_id, options));
    if (h && !same_file(h->st, main.st) && elf_build_id(h->elf.get()) == build_id) return std::move(*h);
  }
  GElf_Word crc = 0;
  const char* link = dwelf_elf_gnu_debuglink(main.elf.get(), &crc);
  if (link == nullptr || *link == '\0') return std::nullopt;
  std::string name = link;
  // A debuglink is a bare file name; anything else is not followed.
  if (name.find('/') != std::string::npos || name == "." || name == "..") return std::nullopt;
  std::error_code ec;
  std::filesystem::path real = std::filesystem::canonical(main.path, ec);
  std::string dir = (ec ? std::filesystem::path(main.path) : real).parent_path().string();
  for (const std::string& candidate :
       {dir + "/" + name, dir + "/.debug/" + name, options.debug_root + dir + "/" + name}) {
    auto h = open_elf(candidate);
    if (!h || same_file(h->st, main.st)) continue;
    auto actual = file_crc32(h->fd.get());
    if (actual && *actual == crc) return std::move(*h);
  }
  return std::nullopt;
}

Result<std::unique_ptr<ElfSymbols>> build(const ElfHandle& main, const std::string& build_id,
                                          const std::optional<ElfHandle>& debug, const ElfOptions& options) {
  SymbolTable table;
  size_t n = add_function_symbols(main.elf.get(), SHT_SYMTAB, table);
  if (n == 0 && debug) n = add_function_symbols(debug->elf.get(), SHT_SYMTAB, table);
  if (n == 0) add_function_symbols(main.elf.get(), SHT_DYNSYM, table);
  table.finish();
  std::vector<Segment> segments = load_segments(main.elf.get());
  if (segments.empty() && debug) segments = load_segments(debug->elf.get());
  std::unique_ptr<LineTable> lines;
  if (options.line_info) {
    lines = LineTable::open(main.path);
    if (!lines && debug) lines = LineTable::open(debug->path);
    if (lines) lines->set_scope_index(options.inline_index);
  }
  return std::unique_ptr<ElfSymbols>(
      std::make_unique<ElfFile>(build_id, std::move(segments), std::move(table), std::move(lines)));
}

}  // namespace

Result<std::string> read_build_id(const std::string& path) {
  auto h = open_elf(path);
  if (!h) return h.error();
  std::string id = elf_build_id(h->elf.get());
  if (id.empty()) return Error{path + " has no GNU build id note (linked without --build-id?)"};
  return id;
}

Result<std::unique_ptr<ElfSymbols>> ElfSymbols::open(const std::string& path) {
  return open(path, ElfOptions{});
}

Result<std::unique_ptr<ElfSymbols>> ElfSymbols::open(const std::string& path, const ElfOptions& options) {
  auto main = open_elf(path);
  if (!main) return main.error().context("reading symbols");
  std::string build_id = elf_build_id(main->elf.get());
  std::optional<ElfHandle> debug = find_debug_file(*main, build_id, options);
  return build(*main, build_id, debug, options);
}

Result<std::unique_ptr<ElfSymbols>> ElfSymbols::open_build_id(const std::string& build_id,
                                                              const ElfOptions& options) {
  // Hex only: the id becomes part of a path.
  if (build_id.size() < 4 || !is_hex(build_id)) return Error{"bad build id '" + build_id + "'"};
  std::string path = build_id_debug_path(build_id, options);
  auto h = open_elf(path);
  if (!h) return h.error().context("no debug file for build id " + build_id);
  std::string actual = elf_build_id(h->elf.get());
  if (actual != build_id) return Error{path + " has build id '" + actual + "', not " + build_id};
  return build(*h, build_id, std::nullopt, options);
}

}  // namespace strata::symbolize
