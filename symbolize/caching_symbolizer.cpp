#include <unordered_map>

#include "symbolize/symbolizer.h"

namespace strata::symbolize {

namespace {

// Results per (file, offset): stacks repeat the same frames, and demangling is the costly part of
// a lookup. Cleared when full, which keeps memory bounded without LRU bookkeeping.
constexpr size_t kMaxCachedResults = 1 << 18;

// Files held open with their symbol tables (readable or not), by path and by build id. A node agent
// runs for months and its processes keep mapping new files (each container image's libraries, the
// .so files torch.compile and Triton build at run time): without a cap it would hold every file it
// ever symbolized. A PyTorch rank's stacks touch at most its ~300 mapped libraries, so 1024 holds
// several jobs' worth; past it every file is dropped and read again when next needed (no frame is
// lost, only the reading is repeated).
constexpr size_t kMaxCachedFiles = 1024;

class CachingSymbolizer final : public Symbolizer {
 public:
  explicit CachingSymbolizer(SymbolizerOptions options) : options_(std::move(options)) {}

  size_t cached_files() const override { return by_path_.size() + debug_by_build_id_.size(); }

  void symbolize(std::vector<Frame>& frames) override {
    for (Frame& f : frames) {
      if (!f.function.empty()) continue;  // already resolved (Python, CUDA, or an earlier pass)
      std::optional<Symbol> s;
      if (f.kind == FrameKind::kNative) {
        s = lookup_native(f);
      } else if (f.kind == FrameKind::kKernel) {
        s = lookup_kernel(f.offset);
      }
      if (!s) continue;  // keeps module+offset
      f.function = encode_inlined(s->function, s->inlined);
      if (!s->file.empty()) {
        f.file = s->file;
        f.line = s->line;
      }
    }
  }

 private:
  struct Key {
    const ElfSymbols* file;
    uint64_t offset;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.file) ^ (std::hash<uint64_t>()(k.offset) * 0x9e3779b97f4a7c15ULL);
    }
  };

  std::optional<Symbol> lookup_native(const Frame& f) {
    const ElfSymbols* file = file_for(f);
    if (file == nullptr) return std::nullopt;
    Key key{file, f.offset};
    if (auto it = results_.find(key); it != results_.end()) return it->second;
    if (results_.size() >= kMaxCachedResults) results_.clear();
    return results_.emplace(key, file->lookup_file_offset(f.offset)).first->second;
  }

  std::optional<Symbol> lookup_kernel(uint64_t address) {
    if (!kallsyms_tried_) {
      kallsyms_tried_ = true;
      if (options_.kallsyms_path == "/proc/kallsyms") {
        kallsyms_ = Kallsyms::shared();
      } else if (auto k = Kallsyms::load(options_.kallsyms_path)) {
        kallsyms_ = std::move(*k);
      }
    }
    if (!kallsyms_) return std::nullopt;
    return kallsyms_->lookup(address);
  }

  // The symbols for a frame's module, or nullptr when none can be trusted.
  const ElfSymbols* file_for(const Frame& f) {
    // "[unknown]", "[vdso]", "[anon]": no file to read.
    if (f.module.empty() || f.module[0] == '[') return nullptr;
    const std::string& id = f.build_id;
    if (!id.empty()) {
      if (auto it = by_build_id_.find(id); it != by_build_id_.end()) return it->second;
    }
    // A file not held yet: make room first (no pointer into the cache is held at this point).
    if (!by_path_.count(f.module) && cached_files() >= kMaxCachedFiles) forget_files();
    const ElfSymbols* file = open_path(f.module);
    if (id.empty()) return file;
    if (file != nullptr && file->build_id() == id) {
      by_build_id_.emplace(id, file);
      return file;
    }
    // The file on disk is not the one that was sampled (rebuilt, upgraded, gone): only a debug
    // file carrying the sampled build id can be trusted.
    auto [it, inserted] = debug_by_build_id_.try_emplace(id, nullptr);
    if (inserted) {
      auto r = ElfSymbols::open_build_id(id, options_.elf);
      if (r) it->second = keep(std::move(*r));
    }
    if (it->second != nullptr) by_build_id_.emplace(id, it->second);
    return it->second;
  }

  const ElfSymbols* open_path(const std::string& path) {
    auto [it, inserted] = by_path_.try_emplace(path, nullptr);
    if (inserted) {
      auto r = ElfSymbols::open(path, options_.elf);
      if (r) it->second = keep(std::move(*r));
    }
    return it->second;
  }

  // Everything that points into owned_ goes with it: the results are keyed by its files.
  void forget_files() {
    results_.clear();
    by_build_id_.clear();
    debug_by_build_id_.clear();
    by_path_.clear();
    owned_.clear();
  }

  const ElfSymbols* keep(std::unique_ptr<ElfSymbols> file) {
    owned_.push_back(std::move(file));
    return owned_.back().get();
  }

  SymbolizerOptions options_;
  std::vector<std::unique_ptr<ElfSymbols>> owned_;
  std::unordered_map<std::string, const ElfSymbols*> by_path_;            // nullptr: unreadable
  std::unordered_map<std::string, const ElfSymbols*> by_build_id_;        // verified matches only
  std::unordered_map<std::string, const ElfSymbols*> debug_by_build_id_;  // nullptr: none found
  std::unordered_map<Key, std::optional<Symbol>, KeyHash> results_;
  bool kallsyms_tried_ = false;
  std::shared_ptr<const Kallsyms> kallsyms_;
};

}  // namespace

std::unique_ptr<Symbolizer> make_caching_symbolizer(const std::string& kallsyms_path) {
  SymbolizerOptions options;
  options.kallsyms_path = kallsyms_path;
  return make_caching_symbolizer(options);
}

std::unique_ptr<Symbolizer> make_caching_symbolizer(const SymbolizerOptions& options) {
  return std::make_unique<CachingSymbolizer>(options);
}

}  // namespace strata::symbolize
