// The values strata's options take (numbers, seconds, sizes, pid lists), checked with a one-line
// reason that names the option. CLI11 reads the command line (cli/cli_app.h); these read its values,
// because their messages say more than a generic "could not convert".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"

namespace strata::cli {

Result<uint64_t> parse_uint(const std::string& flag, const std::string& text, uint64_t min, uint64_t max);
Result<double> parse_seconds(const std::string& flag, const std::string& text);
// A duration: a whole number and a unit ("500ms", "90s", "10m", "2h", "1d"), in ns; more than 0.
Result<uint64_t> parse_duration(const std::string& flag, const std::string& text);
// A percentage ("0.2", "0.2%") as a fraction (0.002), from 0 to max_percent.
Result<double> parse_percent(const std::string& flag, const std::string& text, double max_percent);
// A size in MiB, fractions allowed ("0.25" = 256 KiB), in bytes; at least min_mib, at most max_mib.
Result<uint64_t> parse_mib(const std::string& flag, const std::string& text, double min_mib, double max_mib);
Result<std::vector<uint32_t>> parse_pid_list(const std::string& text);

}  // namespace strata::cli
