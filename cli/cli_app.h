// strata's command lines, read by CLI11: one parser per command, its --help led by the usage line
// that DESIGN §8 documents, and every parse error as one line with exit 1.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

namespace strata::cli {

// Sets up a command's parser before its options are added: `usage` is the synopsis that opens
// --help, the app's description the prose under it, `footer` what follows the options
// (permissions, exit codes). An option given twice keeps the last value, as before CLI11.
void configure(CLI::App& app, std::string usage, std::string footer);

// Reads `args` (what follows the command's name) into `app`'s options. Returns the exit code when
// the command ends here (0 after --help, 1 after a one-line reason on stderr), nullopt to run it.
std::optional<int> parse(CLI::App& app, std::vector<std::string> args);

}  // namespace strata::cli
