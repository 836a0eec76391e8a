// The CPython reader over a memory image: a target process's memory is not trusted (it may be
// corrupt, racing, or hostile), so walking thread states and frames, reading code objects and
// decoding line tables must give errors, never crashes or endless loops.
// Input: minor selector, code object offset, lasti, tid, then the image, mapped at kBase.
#include <cstdint>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "unwind/python_runtime.h"

namespace {
constexpr uint64_t kBase = 0x1000;  // small, so pointers into the image are easy to find
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata::unwind;
  strata::fuzz::Bytes in(data, size);
  int minor = 10 + in.take<uint8_t>() % 4;
  uint16_t code_offset = in.take<uint16_t>();
  uint32_t lasti = in.take<uint32_t>();
  uint32_t tid = in.take<uint32_t>();
  ImageMemReader mem;
  mem.add(kBase, std::vector<uint8_t>(in.rest(), in.rest() + in.remaining()));

  // The line table alone: it comes from the process as bytes (co_linetable).
  CodeInfo raw;
  raw.linetable.assign(reinterpret_cast<const char*>(in.rest()), in.remaining());
  raw.first_line = static_cast<int>(lasti);
  (void)code_line(raw, minor, lasti);

  auto code = read_code_object(mem, minor, kBase + code_offset, /*code_type=*/0);
  if (code) (void)code_line(*code, minor, lasti);
  uint64_t identity = 0;
  (void)code_object_identity(mem, minor, kBase + code_offset, identity);

  if (auto published = python_debug_offsets(mem, kBase)) (void)walk_python_frames(mem, *published, tid);
  if (auto builtin = builtin_python_offsets(minor)) {
    strata_py_offsets o = *builtin;
    o.runtime_addr = kBase;
    (void)walk_python_frames(mem, o, tid);
    (void)walk_python_frames(mem, o, 0, 0);
  }
  return 0;
}
