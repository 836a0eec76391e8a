#include "agent/gpu/cupti_env.h"

#include "agent/gpu/timeline_reader.h"

#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace strata::agent {

std::string cupti_injection_library_path() {
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  std::filesystem::path lib = exe.parent_path().parent_path() / "lib" / "libstrata_cupti.so";
  return lib.lexically_normal().string();
}

std::vector<std::string> cupti_injection_env() {
  const char* off = std::getenv("STRATA_CUPTI");
  if (off && std::string(off) == "0") return {};
  const char* theirs = std::getenv("CUDA_INJECTION64_PATH");
  if (theirs && *theirs) return {};
  std::string lib = cupti_injection_library_path();
  if (lib.empty() || access(lib.c_str(), R_OK) != 0) return {};
  // Where the recorder's reader looks (timeline_rendezvous_dir): said to the job, not asked of it.
  return {"CUDA_INJECTION64_PATH=" + lib, std::string(STRATA_TIMELINE_DIR_ENV "=") + timeline_rendezvous_dir()};
}

}  // namespace strata::agent
