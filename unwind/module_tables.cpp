#include "unwind/module_tables.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <span>

namespace strata::unwind {
namespace {

struct ElfCloser {
  void operator()(Elf* e) const { elf_end(e); }
};
using ElfPtr = std::unique_ptr<Elf, ElfCloser>;

std::string hex(const uint8_t* p, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kHex[p[i] >> 4]);
    s.push_back(kHex[p[i] & 15]);
  }
  return s;
}

Result<std::unique_ptr<ModuleUnwind>> load_from_elf(Elf* elf, const std::string& name, const ModuleOptions& options) {
  auto m = std::make_unique<ModuleUnwind>();
  m->path = name;
  GElf_Ehdr ehdr;
  if (!gelf_getehdr(elf, &ehdr)) return Error{name + ": bad ELF header"};
  if (ehdr.e_machine != EM_X86_64) return Error{name + ": not an x86-64 ELF file"};
  size_t phnum = 0;
  if (elf_getphdrnum(elf, &phnum) != 0) return Error{name + ": cannot read program headers"};
  for (size_t i = 0; i < phnum && i < 256; ++i) {
    GElf_Phdr ph;
    if (!gelf_getphdr(elf, static_cast<int>(i), &ph)) continue;
    if (ph.p_type == PT_LOAD) m->segments.push_back({ph.p_offset, ph.p_vaddr, ph.p_filesz});
  }
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return Error{name + ": no section names"};
  Elf_Data* eh_frame = nullptr;
  Elf_Data* debug_frame = nullptr;
  uint64_t eh_vaddr = 0;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type == SHT_NOBITS) continue;
    const char* sname = elf_strptr(elf, shstrndx, sh.sh_name);
    if (!sname) continue;
    if (std::strcmp(sname, ".eh_frame") == 0) {
      eh_frame = elf_getdata(scn, nullptr);
      eh_vaddr = sh.sh_addr;
    } else if (std::strcmp(sname, ".debug_frame") == 0 && !(sh.sh_flags & SHF_COMPRESSED)) {
      debug_frame = elf_getdata(scn, nullptr);
    } else if (sh.sh_type == SHT_NOTE && std::strcmp(sname, ".note.gnu.build-id") == 0) {
      Elf_Data* d = elf_getdata(scn, nullptr);
      if (d && d->d_buf && d->d_size > 16) {
        auto* p = static_cast<const uint8_t*>(d->d_buf);
        uint32_t namesz, descsz;
        std::memcpy(&namesz, p, 4);
        std::memcpy(&descsz, p + 4, 4);
        size_t desc = 12 + ((namesz + 3) & ~3u);
        if (desc <= d->d_size && descsz <= d->d_size - desc && descsz <= 64) m->build_id = hex(p + desc, descsz);
      }
    }
  }
  auto span_of = [](Elf_Data* d) {
    return d && d->d_buf ? std::span<const uint8_t>(static_cast<const uint8_t*>(d->d_buf), d->d_size)
                         : std::span<const uint8_t>();
  };
  // .eh_frame first: it is what the runtime itself trusts. .debug_frame only when there is no
  // .eh_frame (some static and kernel-style builds): the two would describe the same functions.
  Status parsed = {};
  if (eh_frame && eh_frame->d_size > 0) {
    m->cfi_bytes = eh_frame->d_size;
    parsed = parse_cfi(CfiSection{span_of(eh_frame), eh_vaddr, false}, options.limits, m->table);
  } else if (debug_frame && debug_frame->d_size > 0) {
    m->cfi_bytes = debug_frame->d_size;
    parsed = parse_cfi(CfiSection{span_of(debug_frame), 0, true}, options.limits, m->table);
  }
  finish_table(m->table);
  m->table_bytes_built = m->table.memory_bytes();
  if (options.prefer_frame_pointers && m->table.keeps_frame_pointers()) {
    m->method = ModuleMethod::kFramePointer;
    m->table.rows = {};  // the walk needs none: memory goes to modules that do
  } else if (!m->table.rows.empty()) {
    m->method = ModuleMethod::kCfi;
  }
  return m;
}

}  // namespace

const char* module_method_name(ModuleMethod m) {
  switch (m) {
    case ModuleMethod::kFramePointer: return "frame-pointer";
    case ModuleMethod::kCfi: return "cfi";
    case ModuleMethod::kNone: return "none";
  }
  return "?";
}

uint64_t ModuleUnwind::vaddr_of_file_offset(uint64_t off) const {
  for (const auto& s : segments) {
    if (off >= s.file_offset && off - s.file_offset < s.size) return s.vaddr + (off - s.file_offset);
  }
  return ~0ull;
}

Result<std::unique_ptr<ModuleUnwind>> load_module_unwind(const std::string& path, const ModuleOptions& options) {
  if (elf_version(EV_CURRENT) == EV_NONE) return Error{"libelf init failed"};
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Error::from_errno("cannot open " + path, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error{path + " is not a regular file"};
  }
  // ELF_C_READ: read with pread, never mapped: a file truncated under us reads short, no SIGBUS.
  ElfPtr elf(elf_begin(fd, ELF_C_READ, nullptr));
  Result<std::unique_ptr<ModuleUnwind>> r =
      elf && elf_kind(elf.get()) == ELF_K_ELF ? load_from_elf(elf.get(), path, options)
                                              : Result<std::unique_ptr<ModuleUnwind>>(Error{path + " is not ELF"});
  elf.reset();
  ::close(fd);
  return r;
}

Result<std::unique_ptr<ModuleUnwind>> load_module_unwind_image(std::span<const uint8_t> image, const std::string& name,
                                                               const ModuleOptions& options) {
  if (elf_version(EV_CURRENT) == EV_NONE) return Error{"libelf init failed"};
  // libelf wants a mutable buffer even to read; give it a copy.
  std::vector<char> copy(image.begin(), image.end());
  ElfPtr elf(elf_memory(copy.data(), copy.size()));
  if (!elf || elf_kind(elf.get()) != ELF_K_ELF) return Error{name + " is not ELF"};
  return load_from_elf(elf.get(), name, options);
}

std::optional<std::shared_ptr<const ModuleUnwind>> ModuleCache::find(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.module;
}

std::shared_ptr<const ModuleUnwind> ModuleCache::get(const std::string& key, const std::string& open_path) {
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    return it->second.module;
  }
  auto t0 = std::chrono::steady_clock::now();
  ModuleOptions opts = options_;
  // One module may use at most the whole budget; rows past it are not built.
  opts.limits.max_rows = std::min(opts.limits.max_rows, budget_ / sizeof(UnwindRow));
  auto loaded = load_module_unwind(open_path, opts);
  if (loaded && (*loaded)->memory_bytes() > budget_) {
    // The rows' spare capacity, the segments and the bookkeeping count too: keep the module's
    // first rows only (its later functions stop the walk), so the budget holds whatever loads.
    auto& rows = (*loaded)->table.rows;
    size_t over = (*loaded)->memory_bytes() - budget_;
    size_t drop = std::min(rows.size(), (over + sizeof(UnwindRow) - 1) / sizeof(UnwindRow) + 1);
    rows.resize(rows.size() - std::min(rows.size(), drop));
    rows.shrink_to_fit();
    if (!rows.empty()) rows.back() = UnwindRow{rows.back().pc, 0, 0, CfaRule::kInvalid, RbpRule::kSame};  // ends here
  }
  build_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  builds_++;
  std::shared_ptr<const ModuleUnwind> module;
  if (loaded && (*loaded)->memory_bytes() <= budget_) module = std::shared_ptr<const ModuleUnwind>(std::move(*loaded));
  size_t bytes = module ? module->memory_bytes() : 64;
  while (used_ + bytes > budget_ && !lru_.empty()) {
    auto victim = entries_.find(lru_.back());
    used_ -= victim->second.module ? victim->second.module->memory_bytes() : 64;
    entries_.erase(victim);
    lru_.pop_back();
    evictions_++;
  }
  lru_.push_front(key);
  entries_[key] = Entry{module, lru_.begin()};
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  return module;
}

}  // namespace strata::unwind
