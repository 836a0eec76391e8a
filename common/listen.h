// Why a listener could not bind HOST:PORT, in the same words for `strata serve` and `strata agent`
// (httplib's bind says only that it failed).
#pragma once

#include <string>

namespace strata {

// Asks the kernel with a socket of our own: "address in use (another WHO, or another program,
// listens there)", "cannot assign requested address", ...
std::string bind_failure(const std::string& host, int port, const std::string& who);

}  // namespace strata
