// Call frame information from files the node does not control: a raw .eh_frame/.debug_frame section
// (first byte picks which, next 8 its load address), or a whole ELF image (first byte odd).
#include <cstdint>
#include <span>

#include "tests/fuzz/fuzz_input.h"
#include "unwind/cfi.h"
#include "unwind/module_tables.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::Bytes in(data, size);
  uint8_t mode = in.take<uint8_t>();
  if (mode & 1) {
    std::span<const uint8_t> image(in.rest(), in.remaining());
    auto module = strata::unwind::load_module_unwind_image(image, "fuzz");
    if (module) (void)(*module)->table.find(0x1000);
    return 0;
  }
  strata::unwind::CfiSection section;
  section.debug_frame = (mode & 2) != 0;
  section.vaddr = in.take<uint32_t>();
  section.bytes = std::span<const uint8_t>(in.rest(), in.remaining());
  strata::unwind::CfiLimits limits;
  limits.max_rows = 1u << 16;  // the bound is what is under test, not the machine's memory
  strata::unwind::UnwindTable table;
  (void)strata::unwind::parse_cfi(section, limits, table);
  strata::unwind::finish_table(table);
  for (uint64_t a : {uint64_t{0}, uint64_t{0x1000}, section.vaddr, ~uint64_t{0}}) (void)table.find(a);
  (void)table.keeps_frame_pointers();
  return 0;
}
