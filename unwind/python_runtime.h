// CPython 3.10-3.13 as the unwinder sees it: recognizing the interpreter in a process's mappings,
// the per-version layouts the kernel-side frame walk needs (abi/oncpu.h strata_py_offsets; 3.13
// from the interpreter's own _Py_DebugOffsets), and reading code objects (name, file, line) from
// the process's memory on the node. Memory comes through MemoryReader, so tests replay saved images.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "abi/oncpu.h"
#include "common/result.h"

namespace strata::unwind {

class MemoryReader {
 public:
  virtual ~MemoryReader() = default;
  // Reads exactly n bytes at addr; false when any of them cannot be read.
  virtual bool read(uint64_t addr, void* dst, size_t n) = 0;
  // Several reads at once: ok[i] says whether range i was read whole. The default reads them one
  // by one; a live process's reader takes them in one system call.
  struct Range {
    uint64_t addr;
    void* dst;
    size_t n;
  };
  virtual void read_many(const Range* ranges, size_t count, bool* ok);
};

// A live process's memory, through /proc/PID/mem (pread: no ptrace stop of the target).
class ProcMemReader final : public MemoryReader {
 public:
  explicit ProcMemReader(uint32_t pid);
  ~ProcMemReader() override;
  ProcMemReader(const ProcMemReader&) = delete;
  ProcMemReader& operator=(const ProcMemReader&) = delete;
  bool read(uint64_t addr, void* dst, size_t n) override;
  // process_vm_readv: one system call for all the ranges (a sample's Python frames are checked
  // together), the file's pread for what it could not take.
  void read_many(const Range* ranges, size_t count, bool* ok) override;
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
  uint32_t pid_ = 0;
  bool vectored_ = true;  // false once process_vm_readv is refused (seccomp, no ptrace right): pread only
};

// Saved memory: regions by start address (tests; a recorded sample's image).
class ImageMemReader final : public MemoryReader {
 public:
  void add(uint64_t addr, std::vector<uint8_t> bytes) { regions_[addr] = std::move(bytes); }
  bool read(uint64_t addr, void* dst, size_t n) override;

 private:
  std::map<uint64_t, std::vector<uint8_t>> regions_;
};

// "3.11" from /usr/bin/python3.11, libpython3.11.so.1.0, libpython3.11d.so; nullopt otherwise.
std::optional<int> python_minor_from_path(const std::string& path);

// What the agent needs from the interpreter's ELF file (ELF virtual addresses).
struct PythonModuleSymbols {
  int minor = 0;
  uint64_t runtime = 0;      // _PyRuntime
  uint64_t eval_start = 0;   // _PyEval_EvalFrameDefault [start, end): where Python frames splice in
  uint64_t eval_end = 0;
  uint64_t code_type = 0;    // PyCode_Type: tells a code object from a stale pointer
};
Result<PythonModuleSymbols> inspect_python_module(const std::string& path, int minor);

// Layouts built into strata, measured against each version's headers (x86-64, release builds).
std::optional<strata_py_offsets> builtin_python_offsets(int minor);
// 3.13+: the offsets the interpreter publishes about itself at the start of _PyRuntime.
Result<strata_py_offsets> python_debug_offsets(MemoryReader& mem, uint64_t runtime_addr);

struct CodeInfo {
  std::string name;      // co_qualname (3.11+), else co_name
  std::string file;      // co_filename
  int first_line = 0;
  std::string linetable; // co_linetable bytes
  uint64_t identity = 0; // from the name and file object pointers: see code_object_identity
};
// Reads a code object; checks its type against PyCode_Type when code_type is known (non-zero).
Result<CodeInfo> read_code_object(MemoryReader& mem, int minor, uint64_t code, uint64_t code_type);
// A cheap fingerprint of the code object at `code` (its name and file object pointers): a cached
// CodeInfo whose identity no longer matches describes freed memory now reused by another object.
bool code_object_identity(MemoryReader& mem, int minor, uint64_t code, uint64_t& out);
// The same for n code objects in one read_many: ok[i] says whether out[i] was read.
void code_object_identities(MemoryReader& mem, int minor, const uint64_t* codes, size_t n, uint64_t* out, bool* ok);
// The source line of instruction `lasti` (code units), from the version's line table format.
int code_line(const CodeInfo& code, int minor, uint32_t lasti);

// The frame walk the BPF program does, in ordinary code: over live or saved memory, for tests and
// for checking a layout before handing it to the kernel. fsbase: the thread's pthread_self (3.10);
// tid and fsbase both 0: the interpreter's most recently created thread.
Result<std::vector<strata_py_frame>> walk_python_frames(MemoryReader& mem, const strata_py_offsets& o, uint32_t tid,
                                                        uint64_t fsbase = 0);

}  // namespace strata::unwind
