// The shared libraries an executable will load at start (its DT_NEEDED closure), resolved the way
// the dynamic loader does: DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH ($ORIGIN expanded), then the
// system directories. Lets the agent attach to runtime libraries as soon as a process execs, before
// the process can call into them.
#pragma once

#include <string>
#include <vector>

namespace strata::agent {

// `root` prefixes every path looked at (e.g. /proc/PID/root for a process in a container);
// returned paths are as the process sees them. At most `limit` libraries.
std::vector<std::string> library_closure(const std::string& exe, const std::string& ld_library_path,
                                         const std::string& root = "", size_t limit = 512);

}  // namespace strata::agent
