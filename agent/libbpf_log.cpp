#include "agent/libbpf_log.h"

#include <bpf/libbpf.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

namespace strata::agent {
namespace {

int print_libbpf(enum libbpf_print_level level, const char* fmt, va_list args) {
  static const bool debug = std::getenv("STRATA_LIBBPF_DEBUG") != nullptr;
  if (level == LIBBPF_DEBUG && !debug) return 0;
  std::fputs("libbpf: ", stderr);
  return std::vfprintf(stderr, fmt, args);
}

}  // namespace

void setup_libbpf_logging() { libbpf_set_print(print_libbpf); }

}  // namespace strata::agent
