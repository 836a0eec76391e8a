#include "agent/normalizer.h"

#include "symbolize/symbolizer.h"

namespace strata::agent {
namespace {
constexpr uint64_t kMaxRefreshesPerPid = 64;  // bounds /proc reads for processes that map oddly
}

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

const std::string& Normalizer::hex(const std::array<uint8_t, 20>& id) {
  std::string key(reinterpret_cast<const char*>(id.data()), id.size());
  auto it = hex_cache_.find(key);
  if (it != hex_cache_.end()) return it->second;
  return hex_cache_.emplace(std::move(key), build_id_hex(id.data(), id.size())).first->second;
}

std::string Normalizer::build_id_of_file(const std::string& path, uint32_t pid) {
  auto it = build_id_by_path_.find(path);
  if (it != build_id_by_path_.end()) return it->second;
  // Read through the process's root so files inside containers are found.
  auto id = symbolize::read_build_id("/proc/" + std::to_string(pid) + "/root" + path);
  if (!id) id = symbolize::read_build_id(path);
  std::string value = id ? *id : std::string();
  build_id_by_path_[path] = value;
  return value;
}

void Normalizer::learn_process(uint32_t pid) {
  auto maps = read_proc_maps(pid);
  if (!maps) return;
  for (const auto& m : *maps) {
    if (!m.executable || m.path.empty() || m.path[0] != '/') continue;
    std::string id = build_id_of_file(m.path, pid);
    if (!id.empty()) path_by_build_id_.emplace(id, m.path);
  }
  maps_[pid] = std::move(*maps);
}

void Normalizer::forget_process(uint32_t pid) {
  maps_.erase(pid);
  refreshes_.erase(pid);
}

void Normalizer::normalize(const SampleEvent& e, Stack& out) {
  for (uint64_t addr : e.kstack) {
    Frame f;
    f.kind = FrameKind::kKernel;
    f.module = "[kernel]";
    f.offset = addr;
    out.push_back(std::move(f));
  }
  for (const auto& u : e.ustack) {
    Frame f;
    f.kind = FrameKind::kNative;
    if (u.has_build_id) {
      f.build_id = hex(u.build_id);
      f.offset = u.offset_or_ip;
      auto it = path_by_build_id_.find(f.build_id);
      if (it == path_by_build_id_.end() && refreshes_[e.pid]++ < kMaxRefreshesPerPid) {
        learn_process(e.pid);  // a library loaded since we last looked (dlopen)
        it = path_by_build_id_.find(f.build_id);
      }
      f.module = it != path_by_build_id_.end() ? it->second : "[unknown]";
    } else {
      // The kernel gave a raw address: resolve it through the process's mappings.
      auto mit = maps_.find(e.pid);
      const Mapping* m = mit != maps_.end() ? find_mapping(mit->second, u.offset_or_ip) : nullptr;
      if (!m && refreshes_[e.pid]++ < kMaxRefreshesPerPid) {
        learn_process(e.pid);
        mit = maps_.find(e.pid);
        m = mit != maps_.end() ? find_mapping(mit->second, u.offset_or_ip) : nullptr;
      }
      if (m && !m->path.empty()) {
        f.module = m->path;
        f.offset = u.offset_or_ip - m->start + m->file_offset;
        if (m->path[0] == '/') f.build_id = build_id_of_file(m->path, e.pid);
      } else {
        f.module = m ? "[anon]" : "[unknown]";
        f.offset = u.offset_or_ip;
      }
    }
    out.push_back(std::move(f));
  }
}

}  // namespace strata::agent
