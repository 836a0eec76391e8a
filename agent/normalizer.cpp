#include "agent/normalizer.h"

#include <sys/auxv.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <unordered_set>
#include <vector>

#include "agent/capture.h"
#include "symbolize/symbolizer.h"

namespace strata::agent {
namespace {
constexpr size_t kMaxNativeFrames = 127;
constexpr size_t kMaxCodeObjectsPerProcess = 16384;

// The kernel's row is the unwinder's row, byte for byte (the rows are copied as they are).
static_assert(sizeof(unwind::UnwindRow) == sizeof(strata_unwind_row));
static_assert(offsetof(unwind::UnwindRow, pc) == offsetof(strata_unwind_row, pc));
static_assert(offsetof(unwind::UnwindRow, cfa_offset) == offsetof(strata_unwind_row, cfa_offset));
static_assert(offsetof(unwind::UnwindRow, rbp_offset) == offsetof(strata_unwind_row, rbp_offset));
static_assert(offsetof(unwind::UnwindRow, cfa_rule) == offsetof(strata_unwind_row, cfa_rule));
static_assert(offsetof(unwind::UnwindRow, rbp_rule) == offsetof(strata_unwind_row, rbp_rule));
static_assert(static_cast<int>(unwind::CfaRule::kRsp) == STRATA_KCFI_CFA_RSP &&
              static_cast<int>(unwind::CfaRule::kRbp) == STRATA_KCFI_CFA_RBP &&
              static_cast<int>(unwind::CfaRule::kPltExpr) == STRATA_KCFI_CFA_PLT &&
              static_cast<int>(unwind::CfaRule::kEndOfStack) == STRATA_KCFI_CFA_END &&
              static_cast<int>(unwind::RbpRule::kOffset) == STRATA_KCFI_RBP_OFFSET &&
              static_cast<int>(unwind::RbpRule::kUnknown) == STRATA_KCFI_RBP_UNKNOWN);

// The vdso is the same in every process of this kernel: read our own copy once.
std::shared_ptr<const unwind::ModuleUnwind> vdso_module() {
  static std::shared_ptr<const unwind::ModuleUnwind> vdso = [] {
    std::shared_ptr<const unwind::ModuleUnwind> m;
    auto base = getauxval(AT_SYSINFO_EHDR);
    auto maps = read_proc_maps(static_cast<uint32_t>(getpid()));
    if (!base || !maps) return m;
    for (const auto& map : *maps) {
      if (map.path == "[vdso]" && map.start == base) {
        auto loaded = unwind::load_module_unwind_image(
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(base), map.end - map.start), "[vdso]");
        if (loaded) m = std::move(*loaded);
      }
    }
    return m;
  }();
  return vdso;
}

uint32_t fnv32(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

}  // namespace

struct Normalizer::PythonProcess {
  int minor = 0;
  std::string module_path;
  uint64_t module_start = 0, module_inode = 0;  // its executable mapping, to tell an exec'd image
  uint64_t eval_lo = 0, eval_hi = 0;  // file offsets of _PyEval_EvalFrameDefault in module_path
  uint64_t code_type = 0;             // &PyCode_Type in the process
  std::unique_ptr<unwind::ProcMemReader> mem;
  // Code objects by address. Freed code objects can be reused at the same address; the type check
  // on every first read and the per-process lifetime of this cache keep that rare.
  std::unordered_map<uint64_t, std::shared_ptr<unwind::CodeInfo>> codes;
};

// One process's address space for the unwinder: its mappings, each module's unwind info.
class Normalizer::ProcessSpace final : public unwind::AddressSpace {
 public:
  ProcessSpace(Normalizer& n, uint32_t pid) : n_(n), pid_(pid) {}
  bool find(uint64_t addr, unwind::MappedModule& out) override {
    auto it = n_.maps_.find(pid_);
    const Mapping* m = it != n_.maps_.end() ? find_mapping(it->second, addr) : nullptr;
    if ((!m || !m->executable) && n_.may_reread(pid_)) {
      n_.learn_process(pid_);  // mapped since we last looked (dlopen)
      it = n_.maps_.find(pid_);
      m = it != n_.maps_.end() ? find_mapping(it->second, addr) : nullptr;
    }
    if (!m || !m->executable || m->path.empty()) return false;
    std::string key;
    auto module = n_.module_of(*m, pid_, key);
    if (!module) return false;
    held_.push_back(module);  // kept alive for this walk even if the cache drops it
    out.start = m->start;
    out.file_offset = m->file_offset;
    out.module = module.get();
    return true;
  }
  void release() { held_.clear(); }

 private:
  Normalizer& n_;
  uint32_t pid_;
  std::vector<std::shared_ptr<const unwind::ModuleUnwind>> held_;
};

Normalizer::Normalizer(size_t unwind_table_budget)
    : modules_(std::make_unique<unwind::ModuleCache>(unwind_table_budget)) {}
Normalizer::~Normalizer() = default;

std::string build_id_hex(const uint8_t* id, size_t len) {
  // The kernel pads ids shorter than 20 bytes (e.g. 16-byte md5/uuid ids) with zeroes.
  while (len > 0 && id[len - 1] == 0) --len;
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(len * 2);
  for (size_t i = 0; i < len; ++i) {
    s.push_back(digits[id[i] >> 4]);
    s.push_back(digits[id[i] & 15]);
  }
  return s;
}

namespace {
// A file's hex id as the kernel's padded 20 bytes trim to: a 20-byte id that happens to end in
// zero bytes loses them too, so both sides must trim alike to meet.
std::string trimmed_like_kernel(std::string hex) {
  if (hex.size() > 40) hex.resize(40);
  while (hex.size() >= 2 && hex.compare(hex.size() - 2, 2, "00") == 0) hex.resize(hex.size() - 2);
  return hex;
}
}  // namespace

const std::string& Normalizer::hex(const std::array<uint8_t, 20>& id) {
  std::string key(reinterpret_cast<const char*>(id.data()), id.size());
  auto it = hex_cache_.find(key);
  if (it != hex_cache_.end()) return it->second;
  if (hex_cache_.size() >= kMaxKnownFiles) hex_cache_.clear();  // a memo: anything dropped is recomputed
  return hex_cache_.emplace(std::move(key), build_id_hex(id.data(), id.size())).first->second;
}

const std::string& Normalizer::build_id_of(const Mapping& m, uint32_t pid, bool recheck) {
  static const std::string kNone;
  if (m.path.empty() || m.path[0] != '/') return kNone;
  DevIno k{m.dev, m.inode};
  auto it = build_id_by_file_.find(k);
  if (it != build_id_by_file_.end() && !recheck) return it->second.build_id;
  // Opened through the process's root (files inside containers) and checked to be the mapped file.
  // What was read is taped (agent/capture.h): replay reads no target's files.
  auto [identity, id] = read_build_id_taped(m, pid);
  if (!identity) {
    if (it != build_id_by_file_.end()) return it->second.build_id;  // keep what it was
    return build_id_by_file_[k].build_id;                            // "" until a recheck reads it
  }
  if (it != build_id_by_file_.end() && it->second.identity == *identity && !it->second.build_id.empty())
    return it->second.build_id;
  auto& known = build_id_by_file_[k];
  known.identity = *identity;
  known.build_id = std::move(id);
  return known.build_id;
}

std::pair<std::optional<FileIdentity>, std::string> Normalizer::read_build_id_taped(const Mapping& m, uint32_t pid) {
  // What was read is taped (agent/capture.h): replay reads no target's files.
  std::optional<FileIdentity> identity;
  std::string id;
  if (replaying()) {
    auto rec = tape_->next_build_id(pid, m.dev, m.inode);
    const std::string payload = rec ? *rec : std::string();  // the reader views it: kept alive here
    ByteReader r(payload);
    (void)r.bytes(Tape::key_bytes(CaptureKind::kBuildId));  // pid, device, inode: as asked
    bool opened = r.u8() != 0;
    FileIdentity fi;
    fi.dev = r.u64();
    fi.ino = r.u64();
    fi.size = r.u64();
    fi.mtime_ns = r.i64();
    id = r.str();
    if (rec && !r.at_end()) tape_->fail("corrupt build id record");
    if (opened && r.ok()) identity = fi;
  } else {
    auto file = open_mapped_file(pid, m);
    if (file) {
      identity = file->identity();
      auto read = symbolize::read_build_id(file->path());
      id = read ? *read : std::string();
    }
    if (tape_ && tape_->capturing()) {
      ByteWriter w;
      FileIdentity fi = identity.value_or(FileIdentity{});
      w.u32(pid);  // the key (Tape::key_bytes): the process and the mapping's file
      w.u64(m.dev);
      w.u64(m.inode);
      w.u8(identity ? 1 : 0);
      w.u64(fi.dev);
      w.u64(fi.ino);
      w.u64(fi.size);
      w.i64(fi.mtime_ns);
      w.str(id);
      tape_->put(CaptureKind::kBuildId, w.data());
    }
  }
  return {identity, id};
}

bool Normalizer::replaying() const { return tape_ && tape_->replaying(); }

std::string Normalizer::module_key(const Mapping& m, const std::string& build_id) {
  if (!build_id.empty()) return build_id;
  return "file " + std::to_string(m.dev) + ":" + std::to_string(m.inode);
}

std::shared_ptr<const unwind::ModuleUnwind> Normalizer::module_of(const Mapping& m, uint32_t pid, std::string& key) {
  if (m.path == "[vdso]") {
    key = m.path;
    return vdso_module();
  }
  if (m.path.empty() || m.path[0] != '/') return nullptr;
  key = module_key(m, build_id_of(m, pid));
  if (auto known = modules_->find(key)) return *known;
  if (replaying()) return modules_->get(key, std::string());  // no target's files in replay (capture.h)
  auto file = open_mapped_file(pid, m);
  // A file that is not the mapped one is remembered as unusable (an empty path loads nothing), so
  // it is not opened again on every sample.
  return modules_->get(key, file ? file->path() : std::string());
}

// The kernel keeps its own copy of a module's rows, loaded once per build id (never evicted: the
// kernel's row budget is fixed at load; a module that does not fit is walked no further).
uint32_t Normalizer::kernel_module_id(const std::string& key, const unwind::ModuleUnwind& module) {
  auto it = kernel_ids_.find(key);
  if (it != kernel_ids_.end()) return it->second;
  uint32_t id = STRATA_KCFI_NO_TABLE;
  if (module.method == unwind::ModuleMethod::kFramePointer) {
    id = STRATA_KCFI_NO_MODULE;
  } else if (module.method == unwind::ModuleMethod::kCfi) {
    const auto& rows = module.table.rows;
    auto loaded = kernel_.load_module(reinterpret_cast<const strata_unwind_row*>(rows.data()), rows.size());
    if (loaded) {
      id = *loaded;
      counters_.kernel_modules++;
      counters_.kernel_rows += rows.size();
      counters_.kernel_cfi_bytes += module.cfi_bytes;
    } else {
      counters_.kernel_refused++;
    }
  }
  kernel_ids_.emplace(key, id);
  return id;
}

void Normalizer::push_kernel_mappings(uint32_t pid, const std::vector<Mapping>& maps) {
  auto t0 = std::chrono::steady_clock::now();
  uint64_t built0 = modules_->build_ns();
  auto pm = std::make_unique<strata_proc_mappings>();
  std::memset(pm.get(), 0, sizeof(*pm));
  for (const auto& m : maps) {  // /proc/PID/maps is sorted by address, as the kernel's search needs
    if (!m.executable || m.path.empty()) continue;
    uint32_t id = STRATA_KCFI_NO_TABLE;
    uint64_t bias = 0;
    if (!kernel_.tables) {
      // The adaptive mode: what the node has learned of the module so far, without building
      // anything -- a module is read when a sample's walk first needs it (a stack copy), and the
      // list is sent again then (see unwind). Unknown or frameless: the kernel asks for a copy.
      std::string key = m.path == "[vdso]" ? m.path : m.path[0] == '/' ? module_key(m, build_id_of(m, pid)) : "";
      auto known = key == "[vdso]" ? std::optional(vdso_module()) : key.empty() ? std::nullopt : modules_->find(key);
      if (known && *known && (*known)->method == unwind::ModuleMethod::kFramePointer) id = STRATA_KCFI_NO_MODULE;
    } else {
      std::string key;
      auto module = module_of(m, pid, key);
      if (!module) continue;  // the walk stops there (no mapping), as the node's does
      uint64_t vaddr = module->vaddr_of_file_offset(m.file_offset);
      if (vaddr == ~0ull) continue;
      id = kernel_module_id(key, *module);
      bias = m.start - vaddr;
    }
    if (pm->n > 0) {  // one module's adjacent executable mappings (split by mprotect) as one entry
      auto& prev = pm->m[pm->n - 1];
      if (prev.end == m.start && prev.bias == bias && prev.module_id == id) {
        prev.end = m.end;
        continue;
      }
    }
    if (pm->n >= STRATA_MAX_PROC_MAPPINGS) {
      counters_.kernel_mappings_dropped++;
      continue;
    }
    auto& e = pm->m[pm->n++];
    e.start = m.start;
    e.end = m.end;
    e.bias = bias;
    e.module_id = id;
  }
  if (!kernel_.set_mappings(pid, pm.get())) counters_.kernel_mapping_refused++;
  pushed_builds_[pid] = modules_->builds();
  counters_.kernel_mapping_pushes++;
  auto ns = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  uint64_t built = modules_->build_ns() - built0;
  counters_.kernel_table_ns += ns > built ? ns - built : 0;
  counters_.unwind_ns += ns;
}

void Normalizer::prune_file_caches() {
  if (build_id_by_file_.size() < prune_at_ && path_by_build_id_.size() < prune_at_) return;
  std::unordered_set<DevIno, DevInoHash> files;
  for (const auto& [pid, maps] : maps_)
    for (const auto& m : maps)
      if (m.executable) files.insert(DevIno{m.dev, m.inode});
  std::unordered_set<std::string> ids;
  for (auto it = build_id_by_file_.begin(); it != build_id_by_file_.end();) {
    if (files.count(it->first)) {
      if (!it->second.build_id.empty()) ids.insert(it->second.build_id);
      ++it;
    } else {
      it = build_id_by_file_.erase(it);
    }
  }
  for (auto it = path_by_build_id_.begin(); it != path_by_build_id_.end();)
    it = ids.count(it->second.build_id) ? std::next(it) : path_by_build_id_.erase(it);
  counters_.file_cache_prunes++;
  // The known processes may map more than the cap: pruning again only once the caches doubled keeps
  // the work per learned file constant.
  prune_at_ = std::max(kMaxKnownFiles, 2 * std::max(build_id_by_file_.size(), path_by_build_id_.size()));
}

void Normalizer::learn_process(uint32_t pid) {
  // Before anything of this read is looked up: no caller holds an entry across learn_process.
  prune_file_caches();
  auto r0 = std::chrono::steady_clock::now();
  auto maps = tape_ ? tape_->proc_maps(pid) : read_proc_maps(pid);
  if (!maps) return;
  // Reading the maps is one-time work when it finds code that was not there (a library loaded: once
  // per library), and the agent's own cost when it finds none (a re-read that learned nothing).
  auto old = maps_.find(pid);
  size_t old_exec = 0, new_exec = 0;
  if (old != maps_.end())
    for (const auto& m : old->second) old_exec += m.executable;
  for (const auto& m : *maps) new_exec += m.executable;
  const bool learned_code = old == maps_.end() || new_exec != old_exec;
  if (learned_code)
    counters_.learn_once_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - r0).count());
  rereads_.note(pid, learned_code);  // a re-read that learned nothing makes the next one wait longer
  // A process's first look (or its first after an exec) opens each mapped file again, in case an
  // inode was reused by another build; a re-read for a new mapping (dlopen, a grown heap) opens
  // only files it has not seen: re-reads come at up to MapsRereadLimiter's rate, and opening a
  // PyTorch rank's 300 libraries each time was most of the agent's cost.
  bool first = !maps_.count(pid);
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& m : *maps) {
    if (!m.executable || m.path.empty() || m.path[0] != '/') continue;
    const std::string& id = build_id_of(m, pid, /*recheck=*/first);
    if (!id.empty()) path_by_build_id_.emplace(trimmed_like_kernel(id), KnownModule{m.path, id});
  }
  if (!replaying()) detect_python(pid, *maps);  // reads the interpreter's file: not replayed (capture.h)
  // Reading build ids of new files and recognizing an interpreter: once per file and process.
  counters_.learn_once_ns += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  if (kernel_.set_mappings) push_kernel_mappings(pid, *maps);
  maps_[pid] = std::move(*maps);
}

void Normalizer::forget_process(uint32_t pid) {
  maps_.erase(pid);
  rereads_.forget(pid);
  pushed_builds_.erase(pid);
  spaces_.erase(pid);
  if (python_.erase(pid) && python_hook_) python_hook_(pid, nullptr);
  if (kernel_.set_mappings) kernel_.set_mappings(pid, nullptr);
}

void Normalizer::detect_python(uint32_t pid, const std::vector<Mapping>& maps) {
  if (auto it = python_.find(pid); it != python_.end()) {
    // Still the interpreter we recognized (same file at the same place)? An exec whose event was
    // lost, or a forked child read before its exec, maps another image: recognize it again.
    for (const auto& m : maps)
      if (m.start == it->second->module_start && m.inode == it->second->module_inode && m.executable) return;
    python_.erase(it);
    if (python_hook_) python_hook_(pid, nullptr);
  }
  // The interpreter is libpython when the executable links it, else the executable itself.
  const Mapping* best = nullptr;
  int minor = 0;
  for (const auto& m : maps) {
    if (!m.executable || m.path.empty() || m.path[0] != '/') continue;
    auto v = unwind::python_minor_from_path(m.path);
    if (!v) continue;
    if (!best || m.path.find("libpython") != std::string::npos) {
      best = &m;
      minor = *v;
    }
  }
  if (!best) return;
  auto file = open_mapped_file(pid, *best);
  if (!file) return;  // not the mapped file (replaced under its path), or gone
  auto syms = unwind::inspect_python_module(file->path(), minor);
  if (!syms) return;  // e.g. pyenv's python3.x before its libpython is mapped: tried again later
  auto module = modules_->get(module_key(*best, build_id_of(*best, pid)), file->path());
  if (!module) return;
  uint64_t exec_vaddr = module->vaddr_of_file_offset(best->file_offset);
  if (exec_vaddr == ~0ull) return;
  uint64_t bias = best->start - exec_vaddr;
  auto py = std::make_unique<PythonProcess>();
  py->minor = minor;
  py->module_path = best->path;
  py->module_start = best->start;
  py->module_inode = best->inode;
  py->code_type = syms->code_type ? syms->code_type + bias : 0;
  py->mem = std::make_unique<unwind::ProcMemReader>(pid);
  for (const auto& seg : module->segments) {
    if (syms->eval_start >= seg.vaddr && syms->eval_start - seg.vaddr < seg.size) {
      py->eval_lo = syms->eval_start - seg.vaddr + seg.file_offset;
      py->eval_hi = py->eval_lo + (syms->eval_end - syms->eval_start);
    }
  }
  std::optional<strata_py_offsets> offsets;
  if (minor >= 13) {
    auto dbg = unwind::python_debug_offsets(*py->mem, syms->runtime + bias);
    if (dbg) offsets = *dbg;
  }
  if (!offsets) offsets = unwind::builtin_python_offsets(minor);
  if (!offsets) return;
  offsets->runtime_addr = syms->runtime + bias;
  if (python_hook_) python_hook_(pid, &*offsets);
  python_[pid] = std::move(py);
  counters_.python_processes++;
}

Normalizer::ProcessSpace& Normalizer::space_of(uint32_t pid) {
  auto& s = spaces_[pid];
  if (!s) s = std::make_unique<ProcessSpace>(*this, pid);
  return *s;
}

void Normalizer::unwind(const SampleEvent& e, UserStack& out) {
  out.native.clear();
  out.method = store::UnwindMethod::kFramePointer;
  auto t0 = std::chrono::steady_clock::now();
  uint64_t once0 = modules_->build_ns() + counters_.kernel_table_ns;  // not per-sample work
  auto walked = [&] {
    auto ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    uint64_t once = modules_->build_ns() + counters_.kernel_table_ns - once0;
    counters_.walk_ns += ns > once ? ns - once : 0;
  };
  if (e.kernel_cfi) {  // unwound in the kernel (mode 3): only normalization is left
    out.native = e.ustack;
    // Its frame-pointer steps (modules without tables, processes not learned yet) are checked too.
    out.native.resize(checked_chain_length(e.pid, e.ustack));
    out.method = e.kcfi_frames == 0      ? store::UnwindMethod::kFramePointer
                 : e.kcfi_fp_frames == 0 ? store::UnwindMethod::kDwarf
                                         : store::UnwindMethod::kMixed;
    counters_.kernel_walks++;
    if (e.kcfi_stop == STRATA_KCFI_STOP_END) counters_.kernel_complete++;
    // An address in no mapping the kernel knows: mapped since (dlopen); it learns on the next sample.
    if (e.kcfi_stop == STRATA_KCFI_STOP_NO_MAPPING && may_reread(e.pid)) learn_process(e.pid);
    counters_.unwind_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    walked();
    return;
  }
  bool complete = false;
  if (snapshot_unwinding_ && e.has_regs && e.ip != 0) {
    auto& space = space_of(e.pid);
    unwind::unwind_stack(unwind::Registers{e.ip, e.sp, e.bp}, unwind::StackSnapshot{e.stack_base, e.stack}, space,
                         kMaxNativeFrames, unwound_);
    space.release();
    // The walk read modules the kernel's list does not describe yet: send it again, so the next
    // samples through modules that keep frame pointers need no copy.
    if (kernel_.set_mappings && !kernel_.tables) {
      auto pb = pushed_builds_.find(e.pid);
      auto mit = maps_.find(e.pid);
      if (pb != pushed_builds_.end() && pb->second != modules_->builds() && mit != maps_.end())
        push_kernel_mappings(e.pid, mit->second);
    }
    counters_.unwind_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    walked();
    counters_.snapshot_unwinds++;
    complete = unwound_.stop == unwind::StopReason::kEndOfStack;
    counters_.stops[static_cast<size_t>(unwound_.stop) % counters_.stops.size()]++;
    // A walk that stopped at an address in no module it could read ends before it, as a
    // frame-pointer chain does (valid_frame_chain): an address no module explains is not a frame
    // we can name or trust (the leaf, where the thread was, always stays).
    if (unwound_.stop == unwind::StopReason::kNoModule && unwound_.ips.size() > 1) unwound_.ips.pop_back();
    if (complete) counters_.snapshot_complete++;
    // The kernel's frame-pointer walk wins only when the copy gave less (a module we could not read)
    // and every one of its return addresses is code: a walk cut short by the check is one that
    // went through a frameless module's rbp, and a loop through the heap is always longer.
    size_t fp_len = checked_chain_length(e.pid, e.ustack);
    if (complete || unwound_.ips.size() >= fp_len || fp_len < e.ustack.size()) {
      for (uint64_t ip : unwound_.ips) out.native.push_back(RawUserFrame{false, {}, ip});
      out.method = unwound_.cfi_frames == 0   ? store::UnwindMethod::kFramePointer
                   : unwound_.fp_frames == 0 ? store::UnwindMethod::kDwarf
                                             : store::UnwindMethod::kMixed;
      return;
    }
    counters_.fp_fallbacks++;
  }
  out.native = e.ustack;
  out.native.resize(checked_chain_length(e.pid, e.ustack));
}

size_t Normalizer::checked_chain_length(uint32_t pid, const std::vector<RawUserFrame>& chain) {
  if (chain.empty()) return 0;
  // Frames the kernel already named by build id (the comm layer's launch stacks) lie in files.
  if (chain.front().has_build_id) return chain.size();
  chain_ips_.clear();
  for (const auto& f : chain) chain_ips_.push_back(f.has_build_id ? 0 : f.offset_or_ip);
  auto it = maps_.find(pid);
  if (it == maps_.end() && may_reread(pid)) {
    learn_process(pid);
    it = maps_.find(pid);
  }
  if (it == maps_.end()) {  // gone before we could read its maps: nothing to check against
    counters_.fp_unchecked++;
    return chain.size();
  }
  size_t n = valid_frame_chain(it->second, chain_ips_.data(), chain_ips_.size());
  // Mapped since we last looked? Only an address in no mapping at all can be: one in the heap or
  // in a module's data is not code, and reading the maps again would not change that.
  if (n < chain.size() && !find_mapping(it->second, chain_ips_[n] - 1) && chain_ips_[n] != 0 && may_reread(pid)) {
    learn_process(pid);
    it = maps_.find(pid);
    if (it != maps_.end()) n = valid_frame_chain(it->second, chain_ips_.data(), chain_ips_.size());
  }
  if (n < chain.size()) {
    counters_.fp_chains_cut++;
    counters_.fp_frames_cut += chain.size() - n;
  }
  return n;
}

bool Normalizer::may_reread(uint32_t pid) {
  auto now = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
  return rereads_.allow(pid, now);
}

void Normalizer::process_exec(uint32_t pid) {
  // A new image: everything learned of the old one (mappings, its CPython, the kernel's list) is
  // wrong now -- a child forked by a Python process was recognized from its parent's copy, and an
  // exec'd interpreter sits at other addresses. learn_process then reads the new image.
  maps_.erase(pid);
  spaces_.erase(pid);
  if (python_.erase(pid) && python_hook_) python_hook_(pid, nullptr);
  rereads_.forget(pid);
  pushed_builds_.erase(pid);
  if (kernel_.set_mappings) kernel_.set_mappings(pid, nullptr);  // until the new image is read
}

void Normalizer::normalize(const SampleEvent& e, Stack& out) {
  UserStack user;
  unwind(e, user);
  normalize(e, user, out);
}

void Normalizer::normalize(const SampleEvent& e, const UserStack& user, Stack& out) {
  for (uint64_t addr : e.kstack) {
    Frame f;
    f.kind = FrameKind::kKernel;
    f.module = "[kernel]";
    f.offset = addr;
    out.push_back(std::move(f));
  }
  size_t user_start = out.size();
  for (size_t ui = 0; ui < user.native.size(); ++ui) {
    RawUserFrame u = user.native[ui];
    // Past the leaf, frames are return addresses: the instruction after the call, which may
    // belong to the next line or to code inlined after it. The call is one byte earlier (as perf
    // and addr2line look them up), so lines and inlined functions name the call site.
    if (ui > 0 && u.offset_or_ip > 0) u.offset_or_ip -= 1;
    Frame f;
    f.kind = FrameKind::kNative;
    if (u.has_build_id) {
      f.build_id = hex(u.build_id);
      f.offset = u.offset_or_ip;
      auto it = path_by_build_id_.find(f.build_id);
      if (it == path_by_build_id_.end() && may_reread(e.pid)) {
        learn_process(e.pid);  // a library loaded since we last looked (dlopen)
        it = path_by_build_id_.find(f.build_id);
      }
      f.module = it != path_by_build_id_.end() ? it->second.path : "[unknown]";
      if (it != path_by_build_id_.end()) f.build_id = it->second.build_id;
    } else {
      // A raw address: resolve it through the process's mappings.
      auto mit = maps_.find(e.pid);
      const Mapping* m = mit != maps_.end() ? find_mapping(mit->second, u.offset_or_ip) : nullptr;
      if (!m && may_reread(e.pid)) {
        learn_process(e.pid);
        mit = maps_.find(e.pid);
        m = mit != maps_.end() ? find_mapping(mit->second, u.offset_or_ip) : nullptr;
      }
      if (m && !m->path.empty()) {
        f.module = m->path;
        f.offset = u.offset_or_ip - m->start + m->file_offset;
        if (m->path[0] == '/') f.build_id = build_id_of(*m, e.pid);
      } else {
        f.module = m ? "[anon]" : "[unknown]";
        f.offset = u.offset_or_ip;
      }
    }
    out.push_back(std::move(f));
  }
  if (!e.pystack.empty()) {
    Stack native(std::make_move_iterator(out.begin() + static_cast<long>(user_start)),
                 std::make_move_iterator(out.end()));
    out.resize(user_start);
    Stack python;
    append_python(e, python);
    auto pit = python.begin();
    // Each eval loop frame (leaf first) ran one run of Python frames, which ends at an entry frame.
    auto py = python_.find(e.pid);
    for (auto& f : native) {
      bool eval = py != python_.end() && f.kind == FrameKind::kNative && f.module == py->second->module_path &&
                  f.offset >= py->second->eval_lo && f.offset < py->second->eval_hi;
      if (!eval || pit == python.end()) {
        out.push_back(std::move(f));
        continue;
      }
      while (pit != python.end()) {
        bool entry = pit->line < 0;  // marker set by append_python
        pit->line = entry ? -pit->line - 1 : pit->line;
        out.push_back(std::move(*pit++));
        if (entry) break;
      }
    }
    // Python frames the native walk did not reach (a truncated native stack) go outermost.
    for (; pit != python.end(); ++pit) {
      if (pit->line < 0) pit->line = -pit->line - 1;
      out.push_back(std::move(*pit));
    }
  }
}

// Resolves the sample's Python frames into `out`, leaf first. Entry frames (where one eval loop
// call began) carry a negative line (-(line+1)) for the splice, which restores it.
void Normalizer::append_python(const SampleEvent& e, Stack& out) {
  auto it = python_.find(e.pid);
  if (it == python_.end()) return;
  PythonProcess& py = *it->second;
  // Each cached code object is checked against what its address holds now (freed and reused
  // memory is another code object): all of the sample's in one read (a frame each, by pread, was
  // the largest part of the agent's own CPU on a PyTorch job).
  const size_t n = e.pystack.size();
  std::vector<uint64_t> codes(n, 0), identities(n, 0);
  std::unique_ptr<bool[]> read(new bool[n]());
  for (size_t i = 0; i < n; ++i) {
    auto c = py.codes.find(e.pystack[i].code);
    if (c != py.codes.end() && c->second) codes[i] = e.pystack[i].code;
  }
  unwind::code_object_identities(*py.mem, py.minor, codes.data(), n, identities.data(), read.get());
  for (size_t i = 0; i < n; ++i) {
    const auto& raw = e.pystack[i];
    auto& slot = py.codes[raw.code];
    // (A slot that was not there before this sample was read just now, by an earlier frame.)
    if (slot && codes[i] && (!read[i] || identities[i] != slot->identity))
      slot.reset();  // the address now holds another code object
    if (!slot) {
      if (py.codes.size() > kMaxCodeObjectsPerProcess) py.codes.clear();
      auto code = unwind::read_code_object(*py.mem, py.minor, raw.code, py.code_type);
      slot = std::make_shared<unwind::CodeInfo>(code ? *code : unwind::CodeInfo{"[unknown]", "", 0, ""});
      if (!code) counters_.python_unresolved++;
    }
    Frame f;
    f.kind = FrameKind::kPython;
    f.function = slot->name;
    f.file = slot->file;
    f.module = slot->file;
    f.line = slot->linetable.empty() ? slot->first_line : unwind::code_line(*slot, py.minor, raw.lasti);
    // The store keys frames by (kind, build id, module, offset): name and line make it unique.
    f.offset = (static_cast<uint64_t>(fnv32(f.function)) << 32) | static_cast<uint32_t>(f.line);
    if (raw.flags & STRATA_PY_FRAME_ENTRY) f.line = -f.line - 1;
    out.push_back(std::move(f));
    counters_.python_frames++;
  }
}

UnwindCounters Normalizer::unwind_counters() const {
  UnwindCounters c = counters_;
  c.table_bytes = modules_->memory_bytes();
  c.table_peak_bytes = modules_->peak_bytes();
  c.table_budget_bytes = modules_->budget_bytes();
  c.table_builds = modules_->builds();
  c.table_evictions = modules_->evictions();
  c.table_build_ns = modules_->build_ns();
  c.maps_rereads = rereads_.rereads();
  c.maps_rereads_refused = rereads_.refused();
  return c;
}

uint64_t unwound_stack_key(uint64_t seed, const SampleEvent& e, const UserStack& user) {
  uint64_t h = hash_mix(hash_mix(seed, e.kstack.size()), static_cast<uint64_t>(user.method));
  for (uint64_t a : e.kstack) h = hash_mix(h, a);
  for (const auto& u : user.native) {
    uint64_t id;
    std::memcpy(&id, u.build_id.data(), sizeof id);
    h = hash_mix(hash_mix(h, u.offset_or_ip), u.has_build_id ? id : 0);
  }
  for (const auto& p : e.pystack) h = hash_mix(hash_mix(h, p.code), p.lasti);
  return h;
}

}  // namespace strata::agent
