// JSON text out: strings escaped (quotes, backslashes, control characters), numbers finite (JSON has
// no NaN: unknown numbers are null). One writer for the REST API, the reports, the diagnosis and the
// agent's drill-down answers. No parser: strata reads no JSON from untrusted peers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace strata {

// The string's characters escaped for use between JSON quotes.
inline std::string json_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size() + 2);
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
          o.push_back(static_cast<char>(c));
        }
    }
  }
  return o;
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
