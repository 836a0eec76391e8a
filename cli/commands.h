// strata's subcommands. Each returns the process exit code: 0 ok, 1 usage / bad input,
// 2 environment (permissions, kernel features). Errors are printed as one line on stderr.
#pragma once

#include <string>
#include <vector>

namespace strata::cli {

int record_main(std::vector<std::string> args);
int report_main(std::vector<std::string> args);

// Prints "strata: <message>" on stderr and returns the code.
int fail(const std::string& message, int code);

}  // namespace strata::cli
