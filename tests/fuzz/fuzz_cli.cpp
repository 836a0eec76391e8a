// strata's command-line value parsers (numbers, durations, pid lists, layer lists, selectors): one
// line each, in turn. CLI11 splits the command line itself; the subcommands act on what they parse,
// so they are not run here.
#include <cstdint>
#include <string>

#include "agent/daemon/daemon.h"
#include "agent/sources.h"
#include "cli/values.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace strata;
  fuzz::Bytes in(data, size);
  uint64_t lo = in.take<uint32_t>(), hi = in.take<uint64_t>();
  std::vector<std::string> argv;
  while (!in.done() && argv.size() < 32) argv.push_back(in.line());
  for (const auto& text : argv) {
    (void)cli::parse_uint("-F", text, lo, hi);
    (void)cli::parse_seconds("--window", text);
    (void)cli::parse_pid_list(text);
    (void)agent::parse_layers(text);
    (void)agent::daemon::parse_selector_term(text);
  }
  return 0;
}
