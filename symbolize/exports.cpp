#include "symbolize/exports.h"

#include <optional>
#include <vector>

#include "symbolize/elf_file.h"

namespace strata::symbolize {

Result<ExportedFunctions> read_exported_functions(const std::string& path) {
  auto h = open_elf(path);
  if (!h) return h.error();
  Elf* elf = h->elf.get();
  ExportedFunctions out;
  out.build_id = elf_build_id(elf);

  // Program headers map virtual addresses to file offsets.
  size_t nphdr = 0;
  if (elf_getphdrnum(elf, &nphdr) != 0) return Error{path + ": no program headers"};
  std::vector<GElf_Phdr> loads;
  for (size_t i = 0; i < nphdr; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf, static_cast<int>(i), &ph) && ph.p_type == PT_LOAD) loads.push_back(ph);
  }
  auto to_offset = [&](uint64_t vaddr) -> std::optional<uint64_t> {
    for (const auto& ph : loads) {
      if (vaddr >= ph.p_vaddr && vaddr < ph.p_vaddr + ph.p_filesz) return vaddr - ph.p_vaddr + ph.p_offset;
    }
    return std::nullopt;
  };

  Elf_Scn* scn = nullptr;
  while ((scn = elf_nextscn(elf, scn)) != nullptr) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh)) continue;
    if (sh.sh_type == SHT_DYNAMIC) {
      Elf_Data* data = elf_getdata(scn, nullptr);
      if (!data || sh.sh_entsize == 0) continue;
      size_t n = sh.sh_size / sh.sh_entsize;
      for (size_t i = 0; i < n; ++i) {
        GElf_Dyn dyn;
        if (!gelf_getdyn(data, static_cast<int>(i), &dyn)) break;
        if (dyn.d_tag != DT_SONAME && dyn.d_tag != DT_NEEDED && dyn.d_tag != DT_RPATH && dyn.d_tag != DT_RUNPATH)
          continue;
        const char* s = elf_strptr(elf, sh.sh_link, dyn.d_un.d_val);
        if (!s) continue;
        if (dyn.d_tag == DT_SONAME) out.soname = s;
        if (dyn.d_tag == DT_NEEDED) out.needed.push_back(s);
        if (dyn.d_tag == DT_RPATH) out.rpath = s;
        if (dyn.d_tag == DT_RUNPATH) out.runpath = s;
      }
    }
    if (sh.sh_type != SHT_DYNSYM || sh.sh_entsize == 0) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (!data) continue;
    size_t n = sh.sh_size / sh.sh_entsize;
    for (size_t i = 0; i < n; ++i) {
      GElf_Sym sym;
      if (!gelf_getsym(data, static_cast<int>(i), &sym)) break;
      int type = GELF_ST_TYPE(sym.st_info);
      int bind = GELF_ST_BIND(sym.st_info);
      if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym.st_shndx == SHN_UNDEF) continue;
      if (bind != STB_GLOBAL && bind != STB_WEAK) continue;
      const char* name = elf_strptr(elf, sh.sh_link, sym.st_name);
      if (!name || !*name) continue;
      if (auto off = to_offset(sym.st_value)) out.file_offset.emplace(name, *off);
    }
  }
  return out;
}

}  // namespace strata::symbolize
