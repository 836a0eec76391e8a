#include "unwind/python_runtime.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <regex>
#include <vector>

#include "common/parse.h"

namespace strata::unwind {
namespace {

constexpr uint16_t kNo = STRATA_PY_NO_FIELD;
constexpr size_t kMaxString = 1024;     // names and paths longer than this are cut
constexpr size_t kMaxLineTable = 1 << 16;

template <typename T>
bool read_value(MemoryReader& mem, uint64_t addr, T& out) {
  return mem.read(addr, &out, sizeof(T));
}

// Unicode objects: compact ASCII text follows the PyASCIIObject header; other compact strings
// follow PyCompactUnicodeObject with 1/2/4-byte code units (kind).
bool read_unicode(MemoryReader& mem, int minor, uint64_t obj, std::string& out) {
  out.clear();
  if (!obj) return false;
  int64_t length = 0;
  uint32_t state = 0;
  if (!read_value(mem, obj + 16, length) || !read_value(mem, obj + 32, state)) return false;
  if (length < 0) return false;
  size_t n = std::min<size_t>(static_cast<size_t>(length), kMaxString);
  bool compact = state & 32, ascii = state & 64;
  unsigned kind = (state >> 2) & 7;
  if (!compact) return false;  // legacy strings: not used for names in 3.10+
  size_t ascii_header = minor >= 12 ? 40 : 48, compact_header = minor >= 12 ? 56 : 72;
  if (ascii) {
    out.resize(n);
    return mem.read(obj + ascii_header, out.data(), n);
  }
  if (kind != 1 && kind != 2 && kind != 4) return false;
  std::vector<uint8_t> raw(n * kind);
  if (!mem.read(obj + compact_header, raw.data(), raw.size())) return false;
  for (size_t i = 0; i < n; ++i) {
    uint32_t cp = 0;
    std::memcpy(&cp, raw.data() + i * kind, kind);
    // UTF-8 encode.
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | ((cp >> 18) & 7)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }
  return true;
}

bool read_bytes_object(MemoryReader& mem, uint64_t obj, std::string& out) {
  int64_t size = 0;
  if (!obj || !read_value(mem, obj + 16, size) || size < 0 || static_cast<size_t>(size) > kMaxLineTable) return false;
  out.resize(static_cast<size_t>(size));
  return mem.read(obj + 32, out.data(), out.size());
}

// Code object fields that differ by version: co_filename, co_name, co_qualname, co_firstlineno,
// co_linetable.
struct CodeLayout {
  uint16_t filename, name, qualname, firstlineno, linetable;
};
std::optional<CodeLayout> code_layout(int minor) {
  switch (minor) {
    case 10: return CodeLayout{104, 112, kNo, 40, 120};
    case 11: return CodeLayout{112, 120, 128, 72, 136};
    case 12:
    case 13: return CodeLayout{112, 120, 128, 68, 136};
    default: return std::nullopt;
  }
}

}  // namespace

void MemoryReader::read_many(const Range* ranges, size_t count, bool* ok) {
  for (size_t i = 0; i < count; ++i) ok[i] = read(ranges[i].addr, ranges[i].dst, ranges[i].n);
}

ProcMemReader::ProcMemReader(uint32_t pid) : pid_(pid) {
  fd_ = ::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
}
ProcMemReader::~ProcMemReader() {
  if (fd_ >= 0) ::close(fd_);
}
bool ProcMemReader::read(uint64_t addr, void* dst, size_t n) {
  if (fd_ < 0 || addr > static_cast<uint64_t>(INT64_MAX)) return false;
  return ::pread(fd_, dst, n, static_cast<off_t>(addr)) == static_cast<ssize_t>(n);
}

void ProcMemReader::read_many(const Range* ranges, size_t count, bool* ok) {
  constexpr size_t kBatch = 256;  // iovecs per call, well under IOV_MAX
  size_t i = 0;
  while (i < count && vectored_ && fd_ >= 0) {
    const size_t n = std::min(kBatch, count - i);
    iovec local[kBatch], remote[kBatch];
    for (size_t k = 0; k < n; ++k) {
      local[k] = {ranges[i + k].dst, ranges[i + k].n};
      remote[k] = {reinterpret_cast<void*>(ranges[i + k].addr), ranges[i + k].n};
    }
    const ssize_t got = ::process_vm_readv(static_cast<pid_t>(pid_), local, n, remote, n, 0);
    if (got < 0) {
      // Refused as a whole (ESRCH: the process is gone, and pread fails too; EPERM/ENOSYS: not
      // allowed here): the file takes all of it from now on.
      if (errno != ESRCH) vectored_ = false;
      break;
    }
    // A partial transfer stops at a range it could not read whole: the ones before it are done,
    // that one is read alone (it fails or it straddles a page the call gave up on), then on.
    size_t done = 0, left = static_cast<size_t>(got);
    while (done < n && left >= ranges[i + done].n) {
      left -= ranges[i + done].n;
      ok[i + done++] = true;
    }
    i += done;
    if (done < n) {
      ok[i] = read(ranges[i].addr, ranges[i].dst, ranges[i].n);
      ++i;
    }
  }
  for (; i < count; ++i) ok[i] = read(ranges[i].addr, ranges[i].dst, ranges[i].n);
}

bool ImageMemReader::read(uint64_t addr, void* dst, size_t n) {
  auto it = regions_.upper_bound(addr);
  if (it == regions_.begin()) return false;
  --it;
  uint64_t off = addr - it->first;
  if (off > it->second.size() || it->second.size() - off < n) return false;
  if (n) std::memcpy(dst, it->second.data() + off, n);  // memcpy of 0 bytes may still not take null
  return true;
}

std::optional<int> python_minor_from_path(const std::string& path) {
  static const std::regex re(R"((?:^|/)(?:libpython3\.(\d+)[a-z]*\.so[.0-9]*|python3\.(\d+)[a-z]*)$)");
  std::smatch m;
  if (!std::regex_search(path, m, re)) return std::nullopt;
  // A file name is the target's to choose: python3.99999999999 is a name, not an exception.
  auto minor = parse_int<int>(m[1].matched ? m[1].str() : m[2].str());
  if (!minor || *minor < 10 || *minor > 13) return std::nullopt;
  return minor;
}

Result<PythonModuleSymbols> inspect_python_module(const std::string& path, int minor) {
  if (elf_version(EV_CURRENT) == EV_NONE) return Error{"libelf init failed"};
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Error::from_errno("cannot open " + path, errno);
  std::unique_ptr<Elf, decltype(&elf_end)> elf(elf_begin(fd, ELF_C_READ, nullptr), &elf_end);
  PythonModuleSymbols s;
  s.minor = minor;
  if (elf && elf_kind(elf.get()) == ELF_K_ELF) {
    for (Elf_Scn* scn = elf_nextscn(elf.get(), nullptr); scn; scn = elf_nextscn(elf.get(), scn)) {
      GElf_Shdr sh;
      if (!gelf_getshdr(scn, &sh) || (sh.sh_type != SHT_SYMTAB && sh.sh_type != SHT_DYNSYM)) continue;
      Elf_Data* data = elf_getdata(scn, nullptr);
      if (!data || sh.sh_entsize == 0) continue;
      size_t count = std::min<size_t>(sh.sh_size / sh.sh_entsize, 4u << 20);
      for (size_t i = 0; i < count; ++i) {
        GElf_Sym sym;
        if (!gelf_getsym(data, static_cast<int>(i), &sym) || sym.st_shndx == SHN_UNDEF) continue;
        const char* name = elf_strptr(elf.get(), sh.sh_link, sym.st_name);
        if (!name || (name[0] != '_' && name[0] != 'P')) continue;
        if (std::strcmp(name, "_PyRuntime") == 0) {
          s.runtime = sym.st_value;
        } else if (std::strcmp(name, "_PyEval_EvalFrameDefault") == 0) {
          s.eval_start = sym.st_value;
          s.eval_end = sym.st_value + std::max<uint64_t>(sym.st_size, 1);
        } else if (std::strcmp(name, "PyCode_Type") == 0) {
          s.code_type = sym.st_value;
        }
      }
    }
  }
  elf.reset();
  ::close(fd);
  if (!s.runtime || !s.eval_start) return Error{path + ": no _PyRuntime / _PyEval_EvalFrameDefault symbol"};
  return s;
}

std::optional<strata_py_offsets> builtin_python_offsets(int minor) {
  // offsetof() against each version's Include/internal headers (3.10.13, 3.11.7 and Debian's
  // 3.11.2, 3.12.1, 3.13.0); see tests/unit/unwind_python_test.cpp, which checks them live.
  strata_py_offsets o{};
  o.minor = static_cast<uint16_t>(minor);
  o.tstate_next = 8;
  o.frame_is_entry = kNo;
  o.frame_owner = kNo;
  o.code_adaptive = kNo;
  switch (minor) {
    case 10:
      o.runtime_interpreters_head = 32;
      o.interp_threads_head = 8;
      o.tstate_native_thread_id = kNo;
      o.tstate_thread_id = 176;
      o.tstate_frame = 24;
      o.cframe_current_frame = kNo;
      o.frame_previous = 24;  // f_back
      o.frame_code = 32;
      o.frame_instr = 96;     // f_lasti (int; the upper half read with it is masked by the u32)
      return o;
    case 11:
      o.runtime_interpreters_head = 40;
      o.interp_threads_head = 16;
      o.tstate_native_thread_id = 160;
      o.tstate_thread_id = 152;
      o.tstate_frame = 56;  // cframe
      o.cframe_current_frame = 8;
      o.frame_previous = 48;
      o.frame_code = 32;
      o.frame_instr = 56;  // prev_instr
      o.frame_is_entry = 68;
      o.code_adaptive = 184;
      return o;
    case 12:
      o.runtime_interpreters_head = 40;
      o.interp_threads_head = 72;
      o.tstate_native_thread_id = 144;
      o.tstate_thread_id = 136;
      o.tstate_frame = 56;  // cframe
      o.cframe_current_frame = 0;
      o.frame_previous = 8;
      o.frame_code = 0;
      o.frame_instr = 56;  // prev_instr
      o.frame_owner = 70;
      o.code_adaptive = 192;
      return o;
    case 13:
      o.runtime_interpreters_head = 632;
      o.interp_threads_head = 7344;
      o.tstate_native_thread_id = 160;
      o.tstate_thread_id = 152;
      o.tstate_frame = 72;  // current_frame
      o.cframe_current_frame = kNo;
      o.frame_previous = 8;
      o.frame_code = 0;    // f_executable
      o.frame_instr = 56;  // instr_ptr
      o.frame_owner = 70;
      o.code_adaptive = 200;
      return o;
    default: return std::nullopt;
  }
}

Result<strata_py_offsets> python_debug_offsets(MemoryReader& mem, uint64_t runtime_addr) {
  // 3.13's _Py_DebugOffsets: cookie, version, free_threaded, then groups of u64 offsets, each
  // group starting with the struct's size. We need the first five groups.
  struct Raw {
    char cookie[8];
    uint64_t version, free_threaded;
    uint64_t runtime[3];       // size, finalizing, interpreters_head
    uint64_t interp[13];       // size, id, next, threads_head, ...
    uint64_t tstate[9];        // size, prev, next, interp, current_frame, thread_id, native_thread_id, ...
    uint64_t frame[6];         // size, previous, executable, instr_ptr, localsplus, owner
    uint64_t code[10];         // size, filename, name, qualname, linetable, firstlineno, ..., co_code_adaptive
  } raw{};
  if (!mem.read(runtime_addr, &raw, sizeof(raw))) return Error{"cannot read _Py_DebugOffsets"};
  if (std::memcmp(raw.cookie, "xdebugpy", 8) != 0) return Error{"_PyRuntime does not start with _Py_DebugOffsets"};
  int minor = static_cast<int>((raw.version >> 16) & 0xff);
  if ((raw.version >> 24) != 3 || minor != 13) {
    return Error{"_Py_DebugOffsets of Python 3." + std::to_string(minor) + ": only 3.13's layout is known"};
  }
  if (raw.free_threaded) return Error{"free-threaded CPython is not supported"};
  auto fits = [](uint64_t v) { return v < 0xffff; };
  strata_py_offsets o{};
  o.minor = 13;
  uint64_t vals[] = {raw.runtime[2], raw.interp[3], raw.tstate[2], raw.tstate[4], raw.tstate[5], raw.tstate[6],
                     raw.frame[1],   raw.frame[2],  raw.frame[3],  raw.frame[5],  raw.code[9]};
  for (uint64_t v : vals) {
    if (!fits(v)) return Error{"_Py_DebugOffsets: an offset out of range"};
  }
  if (raw.frame[1] + 8 > STRATA_PY_FRAME_READ || raw.frame[2] + 8 > STRATA_PY_FRAME_READ ||
      raw.frame[3] + 8 > STRATA_PY_FRAME_READ || raw.frame[5] >= STRATA_PY_FRAME_READ)
    return Error{"_Py_DebugOffsets: frame fields beyond what the kernel reads"};
  o.runtime_interpreters_head = static_cast<uint16_t>(raw.runtime[2]);
  o.interp_threads_head = static_cast<uint16_t>(raw.interp[3]);
  o.tstate_next = static_cast<uint16_t>(raw.tstate[2]);
  o.tstate_frame = static_cast<uint16_t>(raw.tstate[4]);
  o.tstate_thread_id = static_cast<uint16_t>(raw.tstate[5]);
  o.tstate_native_thread_id = static_cast<uint16_t>(raw.tstate[6]);
  o.cframe_current_frame = kNo;
  o.frame_previous = static_cast<uint16_t>(raw.frame[1]);
  o.frame_code = static_cast<uint16_t>(raw.frame[2]);
  o.frame_instr = static_cast<uint16_t>(raw.frame[3]);
  o.frame_owner = static_cast<uint16_t>(raw.frame[5]);
  o.frame_is_entry = kNo;
  o.code_adaptive = static_cast<uint16_t>(raw.code[9]);
  o.runtime_addr = runtime_addr;
  return o;
}

Result<CodeInfo> read_code_object(MemoryReader& mem, int minor, uint64_t code, uint64_t code_type) {
  auto layout = code_layout(minor);
  if (!layout) return Error{"unsupported Python 3." + std::to_string(minor)};
  if (!code) return Error{"null code object"};
  if (code_type) {
    uint64_t type = 0;
    if (!read_value(mem, code + 8, type)) return Error{"cannot read the code object"};
    if (type != code_type) return Error{"not a code object (freed or reused memory)"};
  }
  CodeInfo info;
  uint64_t name = 0, file = 0, table = 0;
  int32_t first = 0;
  uint16_t name_field = layout->qualname != kNo ? layout->qualname : layout->name;
  if (!read_value(mem, code + name_field, name) || !read_value(mem, code + layout->filename, file) ||
      !read_value(mem, code + layout->linetable, table) || !read_value(mem, code + layout->firstlineno, first))
    return Error{"cannot read the code object"};
  if (!read_unicode(mem, minor, name, info.name) || !read_unicode(mem, minor, file, info.file))
    return Error{"cannot read the code object's name or file"};
  info.first_line = first;
  info.identity = name * 31 + file;
  if (!read_bytes_object(mem, table, info.linetable)) info.linetable.clear();
  return info;
}

bool code_object_identity(MemoryReader& mem, int minor, uint64_t code, uint64_t& out) {
  auto layout = code_layout(minor);
  if (!layout || !code) return false;
  uint64_t name = 0, file = 0;
  uint16_t name_field = layout->qualname != kNo ? layout->qualname : layout->name;
  if (!read_value(mem, code + name_field, name) || !read_value(mem, code + layout->filename, file)) return false;
  out = name * 31 + file;
  return true;
}

void code_object_identities(MemoryReader& mem, int minor, const uint64_t* codes, size_t n, uint64_t* out, bool* ok) {
  auto layout = code_layout(minor);
  for (size_t i = 0; i < n; ++i) ok[i] = false;
  if (!layout || n == 0) return;
  const uint16_t name_field = layout->qualname != kNo ? layout->qualname : layout->name;
  // One range per code object from the lower of the two fields to the end of the higher.
  const uint16_t lo = std::min(name_field, layout->filename);
  const uint16_t len = static_cast<uint16_t>(std::max(name_field, layout->filename) + sizeof(uint64_t) - lo);
  constexpr size_t kSpan = 64;  // the two fields lie within 24 bytes in every layout above
  if (len > kSpan) {
    for (size_t i = 0; i < n; ++i) ok[i] = code_object_identity(mem, minor, codes[i], out[i]);
    return;
  }
  std::vector<std::array<uint8_t, kSpan>> bufs(n);
  std::vector<MemoryReader::Range> ranges;
  std::vector<size_t> which;
  for (size_t i = 0; i < n; ++i) {
    if (!codes[i]) continue;
    ranges.push_back({codes[i] + lo, bufs[i].data(), len});
    which.push_back(i);
  }
  std::unique_ptr<bool[]> got(new bool[ranges.size()]());
  mem.read_many(ranges.data(), ranges.size(), got.get());
  for (size_t k = 0; k < ranges.size(); ++k) {
    if (!got[k]) continue;
    const size_t i = which[k];
    uint64_t name = 0, file = 0;
    std::memcpy(&name, bufs[i].data() + (name_field - lo), sizeof name);
    std::memcpy(&file, bufs[i].data() + (layout->filename - lo), sizeof file);
    out[i] = name * 31 + file;
    ok[i] = true;
  }
}

int code_line(const CodeInfo& code, int minor, uint32_t lasti) {
  const auto* t = reinterpret_cast<const uint8_t*>(code.linetable.data());
  size_t n = code.linetable.size();
  if (minor == 10) {
    // (byte delta, signed line delta) pairs; -128: no line. Addresses in bytes.
    uint64_t addr = static_cast<uint64_t>(lasti) * 2, start = 0;
    int line = code.first_line, result = code.first_line;
    for (size_t i = 0; i + 1 < n; i += 2) {
      uint64_t end = start + t[i];
      auto delta = static_cast<int8_t>(t[i + 1]);
      // The table comes from the target's memory: a sum that overflows is no line at all.
      if (delta != -128 && __builtin_add_overflow(line, delta, &line)) return code.first_line;
      if (addr >= start && addr < end) return delta == -128 ? result : line;
      if (delta != -128) result = line;
      start = end;
    }
    return result;
  }
  // 3.11+ location table: entries of (code, length) with varint line deltas; lengths in code units.
  size_t i = 0;
  uint64_t unit = 0;
  int line = code.first_line;
  auto varint = [&]() -> uint64_t {
    uint64_t v = 0;
    for (unsigned shift = 0; i < n && shift < 64; shift += 6) {
      uint8_t b = t[i++];
      v |= static_cast<uint64_t>(b & 63) << shift;
      if (!(b & 64)) break;
    }
    return v;
  };
  auto svarint = [&]() -> int64_t {
    uint64_t v = varint();
    return (v & 1) ? -static_cast<int64_t>(v >> 1) : static_cast<int64_t>(v >> 1);
  };
  while (i < n) {
    uint8_t first = t[i++];
    if (!(first & 0x80)) continue;  // not at an entry start: resynchronize
    unsigned kind = (first >> 3) & 15;
    uint64_t length = (first & 7) + 1;
    int64_t delta = 0;
    if (kind == 15) {
      delta = 0;  // no location
    } else if (kind == 14) {
      delta = svarint();
      varint();
      varint();
      varint();
    } else if (kind == 13) {
      delta = svarint();
    } else if (kind >= 10) {
      delta = static_cast<int>(kind) - 10;
      i += 2;
    } else {
      i += 1;
    }
    if (__builtin_add_overflow(line, delta, &line)) return code.first_line;  // corrupt table
    if (lasti < unit + length) return line;
    unit += length;
  }
  return line;
}

Result<std::vector<strata_py_frame>> walk_python_frames(MemoryReader& mem, const strata_py_offsets& o, uint32_t tid,
                                                        uint64_t fsbase) {
  uint64_t interp = 0, tstate = 0;
  if (!read_value(mem, o.runtime_addr + o.runtime_interpreters_head, interp) || !interp ||
      !read_value(mem, interp + o.interp_threads_head, tstate))
    return Error{"cannot read the interpreter's thread list"};
  uint64_t want = tid;
  uint16_t id_field = o.tstate_native_thread_id;
  if (id_field == kNo) {
    want = fsbase;
    id_field = o.tstate_thread_id;
  }
  uint64_t found = 0;
  if (tid == 0 && fsbase == 0) found = tstate;  // no thread named: the most recently created one
  for (int i = 0; i < 64 && tstate && !found; ++i) {
    uint64_t v = 0;
    if (!read_value(mem, tstate + id_field, v)) break;
    if (v == want) {
      found = tstate;
      break;
    }
    if (!read_value(mem, tstate + o.tstate_next, tstate)) break;
  }
  if (!found) return Error{"no thread state for thread " + std::to_string(tid)};
  uint64_t frame = 0;
  if (!read_value(mem, found + o.tstate_frame, frame)) return Error{"cannot read the current frame"};
  if (o.cframe_current_frame != kNo && frame && !read_value(mem, frame + o.cframe_current_frame, frame))
    return Error{"cannot read the current frame"};
  std::vector<strata_py_frame> out;
  for (int i = 0; i < STRATA_MAX_PY_FRAMES + 16 && frame; ++i) {
    uint8_t buf[STRATA_PY_FRAME_READ];
    if (!mem.read(frame, buf, sizeof(buf))) break;
    auto u64 = [&](uint16_t f) {
      uint64_t v = 0;
      if (f <= sizeof(buf) - 8) std::memcpy(&v, buf + f, 8);
      return v;
    };
    uint64_t code = u64(o.frame_code), instr = u64(o.frame_instr), prev = u64(o.frame_previous);
    if (o.minor >= 12 && o.frame_owner < sizeof(buf) && buf[o.frame_owner] == 3) {
      if (!out.empty()) out.back().flags |= STRATA_PY_FRAME_ENTRY;
      frame = prev;
      continue;
    }
    if (out.size() >= STRATA_MAX_PY_FRAMES) break;
    strata_py_frame f{};
    f.code = code;
    if (o.minor <= 10) {
      f.lasti = static_cast<uint32_t>(instr);
      f.flags = STRATA_PY_FRAME_ENTRY;
    } else {
      f.lasti = instr > code + o.code_adaptive ? static_cast<uint32_t>((instr - code - o.code_adaptive) / 2) : 0;
      if (o.minor == 11 && o.frame_is_entry < sizeof(buf) && buf[o.frame_is_entry]) f.flags = STRATA_PY_FRAME_ENTRY;
    }
    out.push_back(f);
    frame = prev;
  }
  return out;
}

}  // namespace strata::unwind
