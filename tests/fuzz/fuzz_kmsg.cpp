// The kernel log lines the NVML source reads for Xids (/dev/kmsg records, dmesg text): whatever a
// line holds, the parser returns nothing or an Xid whose fields are in PCI's and the driver's ranges.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "agent/gpu/nvml_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  while (!all.empty()) {
    size_t nl = all.find('\n');
    std::string_view line = all.substr(0, nl);
    if (auto x = strata::agent::parse_kernel_xid(line)) {
      if (x->bus > 0xff || x->device > 0x1f || x->code == 0 || x->code > 0xffff) std::abort();
    }
    if (nl == std::string_view::npos) break;
    all.remove_prefix(nl + 1);
  }
  return 0;
}
