// A small argument reader for strata's subcommands: flags with values, repeated checks, one-line
// errors. No global state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace strata::cli {

class Args {
 public:
  Args(std::vector<std::string> argv) : argv_(std::move(argv)) {}  // NOLINT

  bool done() const { return i_ >= argv_.size(); }
  const std::string& peek() const { return argv_[i_]; }
  std::string next() { return argv_[i_++]; }
  std::vector<std::string> rest() {
    std::vector<std::string> r(argv_.begin() + static_cast<long>(i_), argv_.end());
    i_ = argv_.size();
    return r;
  }
  // The value of flag `name` (already consumed), or an error naming the flag.
  Result<std::string> value(const std::string& name) {
    if (done()) return Error{"option " + name + " needs a value"};
    return next();
  }

 private:
  std::vector<std::string> argv_;
  size_t i_ = 0;
};

Result<uint64_t> parse_uint(const std::string& flag, const std::string& text, uint64_t min, uint64_t max);
Result<double> parse_seconds(const std::string& flag, const std::string& text);
// A size in MiB, fractions allowed ("0.25" = 256 KiB), in bytes; at least min_mib, at most max_mib.
Result<uint64_t> parse_mib(const std::string& flag, const std::string& text, double min_mib, double max_mib);
Result<std::vector<uint32_t>> parse_pid_list(const std::string& text);

}  // namespace strata::cli
