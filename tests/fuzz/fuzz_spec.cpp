// strata-sim's fault specs and run arguments: first line the fault spec, the rest one argument per
// line for `strata-sim run`.
#include <cstdint>
#include <string>
#include <vector>

#include "testbed/sim/spec.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::Bytes in(data, size);
  int ranks = in.take<uint8_t>();
  int steps = in.take<uint16_t>();
  std::string spec = in.line();
  if (auto f = testbed::sim::parse_fault(spec, ranks, steps)) {
    (void)testbed::sim::fault_layer(f->kind);
    (void)testbed::sim::fault_cause(f->kind);
  }
  std::vector<std::string> args;
  while (!in.done() && args.size() < 64) args.push_back(in.line());
  (void)testbed::sim::parse_run(args);
  return 0;
}
