// strata-replay-dump STORE.db: prints what a replay of the run must reproduce (replay_dump.h), for
// tests/data/replay/make_capture.sh to write the expectation from the live run's store.
#include <iostream>

#include "tests/unit/replay_dump.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: strata-replay-dump STORE.db\n";
    return 1;
  }
  auto text = strata::test::replay_dump(argv[1]);
  if (!text) {
    std::cerr << "strata-replay-dump: " << text.error().message << "\n";
    return 1;
  }
  std::cout << *text;
  return 0;
}
