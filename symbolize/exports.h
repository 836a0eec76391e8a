// The functions an ELF file exports (.dynsym), with their file offsets: how runtimes such as
// libcudart or libnccl are recognized wherever they live, and where probes attach.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/result.h"

namespace strata::symbolize {

struct ExportedFunctions {
  std::string build_id;
  std::string soname;                                      // DT_SONAME, when present
  std::vector<std::string> needed;                         // DT_NEEDED, in order
  std::string rpath, runpath;                              // DT_RPATH, DT_RUNPATH (raw, with $ORIGIN)
  std::unordered_map<std::string, uint64_t> file_offset;   // raw (mangled) name -> file offset
};

// Defined function symbols of .dynsym (global or weak), by name. Version suffixes are not part of
// the names. Hostile files give an Error, never a crash.
Result<ExportedFunctions> read_exported_functions(const std::string& path);

}  // namespace strata::symbolize
