// JSON text out: strings escaped (quotes, backslashes, control characters) and valid UTF-8, numbers
// finite (JSON has no NaN: unknown numbers are null). One writer for the REST API, the reports, the
// diagnosis and the agent's drill-down answers. No parser: strata reads no JSON from untrusted peers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace strata {

// The string's characters escaped for use between JSON quotes, by nlohmann-json: quotes, backslashes
// and control characters escaped, and bytes that are not UTF-8 (a process name or a path is any
// bytes) replaced by U+FFFD, so every answer parses.
inline std::string json_escape(const std::string& s) {
  std::string quoted = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

// A JSON string: quoted and escaped.
inline std::string json_str(const std::string& s) { return "\"" + json_escape(s) + "\""; }

inline std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
inline std::string json_num(uint64_t v) { return std::to_string(v); }
inline std::string json_num(int64_t v) { return std::to_string(v); }
inline std::string json_num(int v) { return std::to_string(v); }
inline std::string json_num(uint32_t v) { return std::to_string(v); }

}  // namespace strata
