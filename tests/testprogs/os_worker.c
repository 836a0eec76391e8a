// A rank-like worker for the OS-layer tests: compute bursts of ~2 ms CPU, then a 1 ms sleep, for
// SECONDS; or, with MODE "spin", spin all the time (a CPU hog). TAG is only there to be seen in the
// command line.
// usage: os_worker SECONDS [TAG] [MODE]
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile uint64_t sink;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) void compute_burst(uint64_t cpu_ns) {
  uint64_t end = thread_cpu_ns() + cpu_ns;
  uint64_t x = sink;
  while (thread_cpu_ns() < end)
    for (int i = 0; i < 1000; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
  sink = x;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 3;
  int spin = argc > 3 && strcmp(argv[3], "spin") == 0;
  uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
  while (now_ns() < end) {
    if (spin) {
      compute_burst(10000000ull);
      continue;
    }
    compute_burst(2000000ull);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return 0;
}
