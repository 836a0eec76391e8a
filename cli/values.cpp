#include "cli/values.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace strata::cli {

Result<uint64_t> parse_uint(const std::string& flag, const std::string& text, uint64_t min, uint64_t max) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos)
    return Error{flag + ": not a number: '" + text + "'"};
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v < min || v > max)
    return Error{flag + ": " + text + " is out of range [" + std::to_string(min) + ", " + std::to_string(max) + "]"};
  return static_cast<uint64_t>(v);
}

Result<double> parse_seconds(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || !end || *end != '\0' || !std::isfinite(v) || v <= 0 || v > 1e7)
    return Error{flag + ": expected a positive number of seconds, got '" + text + "'"};
  return v;
}

// "90s", "10m", "2h", "1d" (also "500ms"), in ns: a whole number and a unit, one of them.
Result<uint64_t> parse_duration(const std::string& flag, const std::string& text) {
  auto bad = [&] {
    return Error{flag + " " + text + ": expected a duration: a whole number and a unit (90s, 10m, 2h, 1d)"};
  };
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 9) return bad();  // at most 999,999,999 of a unit: no overflow below
  const uint64_t n = std::stoull(text.substr(0, digits));
  const std::string unit = text.substr(digits);
  uint64_t ns_per = 0;
  if (unit == "ms") ns_per = 1'000'000ull;
  else if (unit == "s") ns_per = 1'000'000'000ull;
  else if (unit == "m") ns_per = 60ull * 1'000'000'000ull;
  else if (unit == "h") ns_per = 3600ull * 1'000'000'000ull;
  else if (unit == "d") ns_per = 86400ull * 1'000'000'000ull;
  else return bad();
  if (n == 0) return Error{flag + " " + text + ": the span must be longer than 0"};
  return n * ns_per;
}

Result<double> parse_percent(const std::string& flag, const std::string& text, double max_percent) {
  std::string t = text;
  if (!t.empty() && t.back() == '%') t.pop_back();
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (t.empty() || !end || *end != '\0' || !std::isfinite(v) || v < 0 || v > max_percent) {
    std::ostringstream o;
    o << flag << ": expected a percentage from 0 to " << max_percent << ", got '" << text << "'";
    return Error{o.str()};
  }
  return v / 100;
}

Result<uint64_t> parse_mib(const std::string& flag, const std::string& text, double min_mib, double max_mib) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || !end || *end != '\0' || !std::isfinite(v) || v < min_mib || v > max_mib) {
    std::ostringstream o;
    o << flag << ": expected a size in MiB from " << min_mib << " to " << max_mib << ", got '" << text << "'";
    return Error{o.str()};
  }
  return static_cast<uint64_t>(v * 1024 * 1024);
}

Result<std::vector<uint32_t>> parse_pid_list(const std::string& text) {
  std::vector<uint32_t> pids;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    auto v = parse_uint("-p", part, 1, 4194304);
    if (!v) return v.error();
    pids.push_back(static_cast<uint32_t>(*v));
  }
  if (pids.empty()) return Error{"-p: expected PID[,PID...]"};
  return pids;
}

}  // namespace strata::cli
