// Normalization on the node (blazesym's split): raw stacks from the kernel become frames that mean
// the same anywhere — kernel addresses, and user frames as (build id, file offset, module path).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/events.h"
#include "agent/proc_maps.h"
#include "common/frame.h"

namespace strata::agent {

class Normalizer {
 public:
  // Appends the sample's frames to `out`, leaf first: kernel frames, then user frames.
  void normalize(const SampleEvent& e, Stack& out);

  // Reads the process's mappings and learns which file carries which build id. Called when a
  // process is first seen and when a frame names an unknown build id.
  void learn_process(uint32_t pid);
  void forget_process(uint32_t pid);

  size_t known_build_ids() const { return path_by_build_id_.size(); }

 private:
  std::string build_id_of_file(const std::string& path, uint32_t pid);
  const std::string& hex(const std::array<uint8_t, 20>& id);

  std::unordered_map<std::string, std::string> path_by_build_id_;   // hex -> path
  std::unordered_map<std::string, std::string> build_id_by_path_;   // path -> hex ("" = none)
  std::unordered_map<uint32_t, std::vector<Mapping>> maps_;
  std::unordered_map<uint32_t, uint64_t> refreshes_;                // per pid: bounded re-reads
  std::unordered_map<std::string, std::string> hex_cache_;          // raw 20 bytes -> hex
};

// The 20-byte id as the kernel stores it, trimmed of trailing zero padding (short ids), in hex.
std::string build_id_hex(const uint8_t* id, size_t len);

}  // namespace strata::agent
