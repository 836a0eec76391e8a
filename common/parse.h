// Numbers from text that somebody else wrote (/proc, a target's file names, its environment, a
// spool file name): parsed without exceptions and without locale, the whole text or nothing.
// std::stoi and friends throw on "99999999999" or "", and one uncaught throw ends the agent.
#pragma once

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>
#include <system_error>
#include <type_traits>

namespace strata {

// The integer that `text` is, all of it (no sign for unsigned types, no spaces, no "0x" prefix):
// nullopt when it is empty, has anything else, or does not fit in T.
template <typename T>
std::optional<T> parse_int(std::string_view text, int base = 10) {
  static_assert(std::is_integral_v<T>);
  T v{};
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v, base);
  if (ec != std::errc{} || p != end || text.empty()) return std::nullopt;
  return v;
}

// The integer at the start of `text` (leading blanks skipped), the rest ignored: for fields such
// as "123 kB" or "1-3". nullopt when no digits are there or it does not fit.
template <typename T>
std::optional<T> parse_int_prefix(std::string_view text, int base = 10, size_t* used = nullptr) {
  static_assert(std::is_integral_v<T>);
  size_t skip = 0;
  while (skip < text.size() && (text[skip] == ' ' || text[skip] == '\t')) ++skip;
  T v{};
  const char* begin = text.data() + skip;
  auto [p, ec] = std::from_chars(begin, text.data() + text.size(), v, base);
  if (ec != std::errc{} || p == begin) return std::nullopt;
  if (used) *used = static_cast<size_t>(p - text.data());
  return v;
}

// A decimal number (as "1.5", "2e3"), all of `text`: nullopt when it is not one.
inline std::optional<double> parse_double(std::string_view text) {
  double v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc{} || p != end || text.empty()) return std::nullopt;
  return v;
}

}  // namespace strata
