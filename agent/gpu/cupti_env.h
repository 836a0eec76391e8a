// How `strata record` turns on the CUPTI timing source for the command it starts: the CUDA driver
// loads the library named by CUDA_INJECTION64_PATH at cuInit and calls its InitializeInjection, so
// device-side kernel/copy times arrive in the GPU timeline without touching the job.
#pragma once

#include <string>
#include <vector>

namespace strata::agent {

// "NAME=value" entries to add to the environment of the recorded command:
//   CUDA_INJECTION64_PATH=<absolute path of libstrata_cupti.so>
//   STRATA_TIMELINE_DIR=<$STRATA_TIMELINE_DIR, else /run/strata/timeline>  (where the timelines go,
//                        where the reader looks: abi/gpu_timeline.h)
// Empty when libstrata_cupti.so is not installed next to the strata binary (<bin>/../lib/), or when
// the user already set CUDA_INJECTION64_PATH (theirs wins: the driver loads only one), or when
// STRATA_CUPTI=0 turns it off.
std::vector<std::string> cupti_injection_env();

// Where libstrata_cupti.so would be for this executable: <dir of /proc/self/exe>/../lib/.
std::string cupti_injection_library_path();

}  // namespace strata::agent
