// Per-module unwind information, built lazily from a module's ELF file and cached by build id under
// one memory budget (least recently used modules are dropped first, and rebuilt if seen again).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "unwind/cfi.h"

namespace strata::unwind {

enum class ModuleMethod : uint8_t {
  kFramePointer = 0,  // most functions keep rbp as frame pointer: walk the rbp chain
  kCfi = 1,           // unwind from the module's .eh_frame / .debug_frame rows
  kNone = 2,          // no usable CFI and no frame pointers: stacks stop here
};
const char* module_method_name(ModuleMethod m);

struct LoadSegment {
  uint64_t file_offset = 0;
  uint64_t vaddr = 0;
  uint64_t size = 0;
};

struct ModuleUnwind {
  std::string path;
  std::string build_id;
  ModuleMethod method = ModuleMethod::kNone;
  UnwindTable table;  // rows dropped when method is kFramePointer: the walk does not need them
  std::vector<LoadSegment> segments;  // PT_LOAD: file offset -> ELF virtual address
  uint64_t cfi_bytes = 0;  // size of the CFI sections read (for the bench's memory per MB figure)
  size_t table_bytes_built = 0;  // rows before the frame-pointer decision dropped them

  // The ELF virtual address of a file offset, or ~0 when no segment maps it.
  uint64_t vaddr_of_file_offset(uint64_t off) const;
  size_t memory_bytes() const { return table.memory_bytes() + segments.capacity() * sizeof(LoadSegment) + sizeof(*this); }
};

struct ModuleOptions {
  CfiLimits limits;
  bool prefer_frame_pointers = true;  // false: use CFI even where frame pointers are kept
};

// Reads the ELF file's CFI (.eh_frame, else .debug_frame) and decides the module's method.
Result<std::unique_ptr<ModuleUnwind>> load_module_unwind(const std::string& path, const ModuleOptions& options = {});
// The same from an ELF image in memory (the vdso; tests).
Result<std::unique_ptr<ModuleUnwind>> load_module_unwind_image(std::span<const uint8_t> image, const std::string& name,
                                                               const ModuleOptions& options = {});

// Modules by key (build id, or path when there is none), least recently used dropped first when
// the rows of all modules together pass budget_bytes. A module that failed to load is remembered
// (as a null entry) so it is not re-read on every sample.
class ModuleCache {
 public:
  explicit ModuleCache(size_t budget_bytes = 64u << 20, ModuleOptions options = {})
      : budget_(budget_bytes), options_(options) {}
  // The module for `path` (read via `open_path`, e.g. through /proc/PID/root), nullptr if unusable.
  std::shared_ptr<const ModuleUnwind> get(const std::string& key, const std::string& open_path);
  // The module under `key` when it was loaded (or refused: nullptr) before, without opening
  // anything; nullopt when it never was. Counts as a use for the LRU.
  std::optional<std::shared_ptr<const ModuleUnwind>> find(const std::string& key);
  size_t memory_bytes() const { return used_; }
  size_t peak_bytes() const { return peak_; }  // the most memory_bytes() has been
  size_t budget_bytes() const { return budget_; }
  size_t modules() const { return entries_.size(); }
  uint64_t builds() const { return builds_; }
  uint64_t evictions() const { return evictions_; }
  uint64_t build_ns() const { return build_ns_; }

 private:
  struct Entry {
    std::shared_ptr<const ModuleUnwind> module;
    std::list<std::string>::iterator lru;
  };
  size_t budget_;
  ModuleOptions options_;
  size_t used_ = 0, peak_ = 0;
  uint64_t builds_ = 0, evictions_ = 0, build_ns_ = 0;
  std::unordered_map<std::string, Entry> entries_;
  std::list<std::string> lru_;  // front: most recently used
};

}  // namespace strata::unwind
