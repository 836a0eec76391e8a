// Normalization on the node (blazesym's split): raw stacks from the kernel become frames that mean
// the same anywhere — kernel addresses, and user frames as (build id, file offset, module path).
// It also unwinds the user stack copy (unwind/: frame pointers or CFI per module) and splices the
// thread's Python frames in where the interpreter loop runs: kernel -> native -> Python -> native.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "abi/oncpu.h"
#include "agent/events.h"
#include "agent/proc_maps.h"
#include "common/frame.h"
#include "store/store.h"
#include "unwind/module_tables.h"
#include "unwind/python_runtime.h"
#include "unwind/stack_unwinder.h"

namespace strata::agent {

class Tape;

// A sample's user stack after unwinding, before normalization: what identical samples share.
struct UserStack {
  std::vector<RawUserFrame> native;  // leaf first
  store::UnwindMethod method = store::UnwindMethod::kFramePointer;
};

// The node-wide caches keyed by mapped file (build ids by device and inode, files by build id) are
// pruned to the files the known processes map once they hold this many: a PyTorch rank maps ~300
// files and a node's ranks share one image, so this leaves room for ~10 images' worth; past it the
// files of processes gone (old images, .so files compiled at run time) are dropped, and read again
// if they come back. Pruning loses nothing a live process needs.
inline constexpr size_t kMaxKnownFiles = 4096;

struct UnwindCounters {
  uint64_t snapshot_unwinds = 0;   // samples unwound from the stack copy
  uint64_t snapshot_complete = 0;  // ... that reached the outermost frame
  uint64_t fp_fallbacks = 0;       // the kernel's frame-pointer walk was used instead
  uint64_t fp_chains_cut = 0;      // frame-pointer chains cut at a return address that is not code
  uint64_t fp_frames_cut = 0;      // ... frames dropped so
  uint64_t fp_unchecked = 0;       // chains of processes whose maps were never read (gone first)
  uint64_t maps_rereads = 0;       // maps read again (a new mapping) ...
  uint64_t maps_rereads_refused = 0;  // ... and not, the rate spent (MapsRereadLimiter)
  uint64_t file_cache_prunes = 0;  // file caches pruned to the known processes' files (kMaxKnownFiles)
  uint64_t unwind_ns = 0;          // node time spent unwinding
  uint64_t python_frames = 0;      // Python frames resolved
  uint64_t python_unresolved = 0;  // code objects that could not be read
  uint64_t python_processes = 0;
  size_t table_bytes = 0;          // unwind tables held now
  size_t table_peak_bytes = 0;     // ... at most, over the run (never above the budget)
  size_t table_budget_bytes = 0;
  uint64_t table_builds = 0;       // modules' tables built (again, after an eviction)
  uint64_t table_evictions = 0;    // least recently used tables dropped to stay in the budget
  std::array<uint64_t, 6> stops{};  // snapshot walks by unwind::StopReason
  // The kernel's CFI walk (mode 3): its tables as the normalizer loaded them.
  uint64_t kernel_walks = 0;          // samples whose user stack the kernel unwound with CFI
  uint64_t kernel_complete = 0;       // ... that reached the outermost frame
  uint64_t kernel_modules = 0;        // modules whose rows went to the kernel
  uint64_t kernel_rows = 0;
  uint64_t kernel_cfi_bytes = 0;      // .eh_frame/.debug_frame bytes of those modules
  uint64_t kernel_refused = 0;        // modules the kernel's row budget had no room for
  uint64_t kernel_mapping_pushes = 0; // process mapping lists sent
  uint64_t kernel_mappings_dropped = 0;  // executable mappings past STRATA_MAX_PROC_MAPPINGS
  uint64_t kernel_mapping_refused = 0;   // lists the kernel had no room for: that process's samples
                                         // are walked with frame pointers, checked on the node
  uint64_t kernel_table_ns = 0;       // node time loading them into the kernel (also in unwind_ns)
  uint64_t table_build_ns = 0;        // node time parsing CFI into tables (once per module)
  uint64_t learn_once_ns = 0;         // ... reading build ids, recognizing CPython (once per file
                                      // and process), maps reads that found new code (once per
                                      // library loaded); re-reads that found none are not in it
  uint64_t walk_ns = 0;               // node time unwinding samples, table builds and loads not counted
};

// Mode 3 (STRATA_USTACK_KERNEL_CFI): how the normalizer gives the kernel its compact tables (rows
// per module, once per build id) and each process's executable mappings (on every learn_process).
struct KernelUnwindHooks {
  std::function<Result<uint32_t>(const strata_unwind_row* rows, size_t n)> load_module;  // module id
  // nullptr: forget. False when the kernel refused the list (its process table full).
  std::function<bool(uint32_t pid, const strata_proc_mappings* maps)> set_mappings;
  // False in the adaptive mode (2): no rows go to the kernel, only which modules keep frame
  // pointers (module_id STRATA_KCFI_NO_MODULE), as far as the node has learned.
  bool tables = true;
};

// The unwind tables of all modules together (CFI rows, cached by build id, least recently used
// dropped first): strata record / agent --unwind-tables-mb.
constexpr size_t kDefaultUnwindTableBudget = 128u << 20;

// Hash combining for the agent's keys (boost's hash_combine, on 64 bits).
inline uint64_t hash_mix(uint64_t h, uint64_t v) { return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)); }

// A key for a sample's unwound stack (kernel addresses, user frames by build id and offset or by
// address, Python frames), seeded with whatever else keys it (the pid; an off-CPU reason). Samples
// with equal keys normalize to the same stack: on-CPU windows and off-CPU blocks normalize once
// per distinct key.
uint64_t unwound_stack_key(uint64_t seed, const SampleEvent& e, const UserStack& user);

class Normalizer {
 public:
  explicit Normalizer(size_t unwind_table_budget = kDefaultUnwindTableBudget);
  ~Normalizer();

  // Appends the sample's frames to `out`, leaf first: kernel frames, then user frames.
  void normalize(const SampleEvent& e, Stack& out);
  // The same in two steps, so callers can share normalization between samples whose unwound
  // stacks are equal: unwind (per sample), then normalize (per distinct stack).
  void unwind(const SampleEvent& e, UserStack& out);
  // Node-side CFI unwinding of stack copies; off, stacks come from the kernel's frame-pointer walk
  // (the cost budget turns it off when the agent costs too much).
  void set_snapshot_unwinding(bool on) { snapshot_unwinding_ = on; }
  bool snapshot_unwinding() const { return snapshot_unwinding_; }
  void normalize(const SampleEvent& e, const UserStack& user, Stack& out);

  // Reads the process's mappings and learns which file carries which build id. Called when a
  // process is first seen and when a frame names an unknown build id.
  void learn_process(uint32_t pid);
  void forget_process(uint32_t pid);
  // The process exec'd: forgets what it knew of the old image (its CPython above all); the next
  // learn_process reads the new one.
  void process_exec(uint32_t pid);

  // Called when a process's CPython is recognized (offsets) or forgotten (nullptr): the sampler
  // passes it to the kernel side.
  void set_python_hook(std::function<void(uint32_t, const strata_py_offsets*)> hook) { python_hook_ = std::move(hook); }
  // Turns on loading the kernel's CFI tables (mode 3): from then on learn_process sends them.
  void set_kernel_unwind(KernelUnwindHooks hooks) { kernel_ = std::move(hooks); }

  // Where it reads the processes' maps and the mapped files' build ids: /proc (no tape, or a
  // capturing one) or a replayed capture (agent/capture.h), which reads no target's files.
  void set_tape(Tape* tape) { tape_ = tape; }

  size_t known_build_ids() const { return path_by_build_id_.size(); }
  size_t known_files() const { return build_id_by_file_.size(); }
  // Processes it holds anything of (mappings, unwinding state, CPython, re-read rate): bounded by the
  // processes not forgotten yet.
  size_t processes_held() const {
    return std::max({maps_.size(), spaces_.size(), python_.size(), pushed_builds_.size(), rereads_.processes()});
  }
  UnwindCounters unwind_counters() const;

 private:
  struct PythonProcess;
  class ProcessSpace;

  // The build id ("" = none or unreadable) of the file mapping `m` maps, cached by the mapping's
  // device and inode: one path names different files in different containers. `recheck` opens the
  // file again and re-reads the id when the file under that inode changed (an inode reused).
  const std::string& build_id_of(const Mapping& m, uint32_t pid, bool recheck = false);
  // The mapped file's identity (none: it could not be opened as the mapped file) and build id.
  std::pair<std::optional<FileIdentity>, std::string> read_build_id_taped(const Mapping& m, uint32_t pid);
  // The unwind-table cache's key of a mapped file: its build id, else its device and inode.
  static std::string module_key(const Mapping& m, const std::string& build_id);
  const std::string& hex(const std::array<uint8_t, 20>& id);
  void detect_python(uint32_t pid, const std::vector<Mapping>& maps);
  bool snapshot_unwinding_ = true;
  void append_python(const SampleEvent& e, Stack& out);
  ProcessSpace& space_of(uint32_t pid);
  std::shared_ptr<const unwind::ModuleUnwind> module_of(const Mapping& m, uint32_t pid, std::string& key);
  void push_kernel_mappings(uint32_t pid, const std::vector<Mapping>& maps);
  // How much of a frame-pointer chain (the kernel's walk) to keep: up to the first return address
  // outside the process's executable mappings (valid_frame_chain), after reading the maps again
  // when the rate allows.
  size_t checked_chain_length(uint32_t pid, const std::vector<RawUserFrame>& chain);
  bool may_reread(uint32_t pid);  // rereads_, now
  // Keeps of the node-wide file caches only what the known processes map (maps_), once they hold
  // prune_at_ entries: they are keyed by files, and a node sees new files for as long as it runs.
  void prune_file_caches();
  size_t prune_at_ = kMaxKnownFiles;
  std::vector<uint64_t> chain_ips_;  // reused
  uint32_t kernel_module_id(const std::string& key, const unwind::ModuleUnwind& module);

  struct KnownModule {
    std::string path;      // as the process maps it
    std::string build_id;  // full hex
  };
  std::unordered_map<std::string, KnownModule> path_by_build_id_;  // kernel-trimmed hex -> file
  struct DevIno {
    uint64_t dev = 0, ino = 0;
    bool operator==(const DevIno&) const = default;
  };
  struct DevInoHash {
    size_t operator()(const DevIno& k) const { return std::hash<uint64_t>()(k.dev * 0x9e3779b97f4a7c15ull ^ k.ino); }
  };
  struct KnownFile {
    FileIdentity identity;  // as last opened (size and time tell a reused inode)
    std::string build_id;   // hex, "" = none
  };
  std::unordered_map<DevIno, KnownFile, DevInoHash> build_id_by_file_;
  std::unordered_map<uint32_t, std::vector<Mapping>> maps_;
  MapsRereadLimiter rereads_;
  std::unordered_map<uint32_t, uint64_t> pushed_builds_;  // per pid: module builds at its last push  // per pid: maps read again at a bounded rate
  std::unordered_map<std::string, std::string> hex_cache_;          // raw 20 bytes -> hex
  std::unique_ptr<unwind::ModuleCache> modules_;
  std::unordered_map<uint32_t, std::unique_ptr<ProcessSpace>> spaces_;
  std::unordered_map<uint32_t, std::unique_ptr<PythonProcess>> python_;
  std::function<void(uint32_t, const strata_py_offsets*)> python_hook_;
  KernelUnwindHooks kernel_;
  Tape* tape_ = nullptr;
  bool replaying() const;
  std::unordered_map<std::string, uint32_t> kernel_ids_;  // module key -> kernel module id
  unwind::UnwoundStack unwound_;  // reused
  UnwindCounters counters_;
};

// The 20-byte id as the kernel stores it, trimmed of trailing zero padding (short ids), in hex.
std::string build_id_hex(const uint8_t* id, size_t len);

}  // namespace strata::agent
