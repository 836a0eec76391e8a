// Why a listener could not bind HOST:PORT, in the same words for `strata serve` and `strata agent`
// (httplib's bind says only that it failed).
#pragma once

#include <string>

namespace strata {

// Asks the kernel with a socket of our own: "address in use (another WHO, or another program,
// listens there)", "cannot assign requested address", ...
std::string bind_failure(const std::string& host, int port, const std::string& who);

// A TCP port nothing listens on now, for a program or test that hands it to another process to bind
// (the testbed's MASTER_PORT, a test's `--listen`). Asking the kernel for port 0 returns an
// ephemeral port, and the kernel hands that same range to outgoing connections: one may take it
// before the other process binds it (CI saw exactly that). So the port is drawn at random from
// below /proc/sys/net/ipv4/ip_local_port_range (or above it when there is no room below) and checked
// by binding it; -1 when no candidate binds.
int free_listen_port();

}  // namespace strata
