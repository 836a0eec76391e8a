// Test support: a loopback port nothing listens on now.
#pragma once

#include "common/listen.h"

namespace strata::test {

// Outside the kernel's ephemeral range, so no outgoing connection takes it before the test binds it
// (a test that binds it and fails reports the bind error, never hangs).
inline int free_port() { return strata::free_listen_port(); }

}  // namespace strata::test
