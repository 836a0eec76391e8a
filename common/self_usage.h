// The running process's own cost and health, for the agent's budget, /metrics and batch health,
// and the collector's /metrics: one reading of each, shared by `strata record`, `strata agent`
// and `strata serve`.
#pragma once

#include <cstdint>
#include <string>

namespace strata {

// User + system CPU of this process so far (all threads), in seconds.
double self_cpu_seconds();
// CPU of the calling thread so far, in seconds (to set one piece of work apart from the rest).
double thread_cpu_seconds();
// Resident memory of this process now, in bytes (0 when /proc/self/statm cannot be read).
uint64_t self_rss_bytes();

// Constant-time comparison of a presented token with the configured one: every byte of the longer
// string is looked at, whatever matches, so the time says nothing about the token.
bool token_matches(const std::string& presented, const std::string& expected);
// An HTTP Authorization header that carries `Bearer TOKEN` with the configured token. With no
// token configured every request passes.
bool bearer_authorized(const std::string& authorization_header, const std::string& token);

}  // namespace strata
