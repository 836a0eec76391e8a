// strata's subcommands. Each returns the process exit code: 0 ok, 1 usage / bad input,
// 2 environment (permissions, kernel features). Errors are printed as one line on stderr.
#pragma once

#include <string>
#include <vector>

#include "common/result.h"

namespace strata::cli {

int record_main(std::vector<std::string> args);
int report_main(std::vector<std::string> args);
int agent_main(std::vector<std::string> args);
int serve_main(std::vector<std::string> args);
int diagnose_main(std::vector<std::string> args);
int drilldown_main(std::vector<std::string> args);

// The first line of a token file, trimmed; an error naming the file when missing or empty.
Result<std::string> read_token_file(const std::string& path);

// Prints "strata: <message>" on stderr and returns the code.
int fail(const std::string& message, int code);

}  // namespace strata::cli
