// ELF files as the node meets them (any file a process maps, possibly hostile or truncated): build
// id, .dynsym exports with DT_NEEDED/SONAME/RPATH, and the symbol tables with DWARF lines.
#include <cstdint>

#include "symbolize/exports.h"
#include "symbolize/symbolizer.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::MemFile file(data, size);
  if (!file.ok()) return 0;
  const std::string path = file.path();

  (void)strata::symbolize::read_build_id(path);
  (void)strata::symbolize::read_exported_functions(path);

  strata::symbolize::ElfOptions options;
  options.debug_root = "/nonexistent-strata-fuzz";  // never wander into the host's debug files
  options.line_info = true;
  auto symbols = strata::symbolize::ElfSymbols::open(path, options);
  if (symbols) {
    // A few lookups across the address space: the tables built from the file must hold up.
    for (uint64_t a : {uint64_t{0}, uint64_t{0x40}, uint64_t{0x1000}, uint64_t{0x401000}, ~uint64_t{0}}) {
      (void)(*symbols)->lookup_vaddr(a);
      (void)(*symbols)->lookup_file_offset(a);
    }
  }
  return 0;
}
