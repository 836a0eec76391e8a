// /proc/PID/maps, parsed: which file backs which address range of a process.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace strata::agent {

struct Mapping {
  uint64_t start = 0;
  uint64_t end = 0;
  uint64_t file_offset = 0;
  uint64_t inode = 0;
  bool executable = false;
  std::string path;  // empty for anonymous memory; "[vdso]" and the like for special mappings
};

std::vector<Mapping> parse_proc_maps(std::string_view text);
Result<std::vector<Mapping>> read_proc_maps(uint32_t pid);

// The mapping containing addr, if any (maps are sorted by start, as the kernel lists them).
const Mapping* find_mapping(const std::vector<Mapping>& maps, uint64_t addr);

}  // namespace strata::agent
