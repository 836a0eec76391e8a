// A minimal JSON writer for the REST API: strings escaped, numbers finite. No parser: requests
// carry their parameters in the query string.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace strata::server {

inline std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  return o + "\"";
}

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

}  // namespace strata::server
