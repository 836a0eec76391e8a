// libbpf's messages go through one function of ours (STYLE: libbpf_set_print).
#pragma once

namespace strata::agent {

// Warnings and errors from libbpf go to stderr prefixed "libbpf: "; debug output only when
// STRATA_LIBBPF_DEBUG is set. Idempotent.
void setup_libbpf_logging();

}  // namespace strata::agent
