/* The demo's bundled CPU workload: a small data pipeline (parse -> transform -> checksum) whose
 * hot spots are known: checksum_block, then parse_records, then transform_records.
 * Runs for argv[1] seconds (default 3). */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static uint32_t data[1 << 14];
volatile uint64_t sink;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void parse_records(uint32_t seed) {
  for (unsigned i = 0; i < (1u << 14); i++) data[i] = seed = seed * 1664525u + 1013904223u;
}
__attribute__((noinline)) void transform_records(void) {
  for (int r = 0; r < 6; r++)
    for (unsigned i = 0; i < (1u << 14); i++) data[i] = (data[i] >> 3) ^ (data[i] << 5) ^ (uint32_t)r;
}
__attribute__((noinline)) uint64_t checksum_block(void) {
  uint64_t h = 1469598103934665603ull;
  for (int r = 0; r < 3; r++)
    for (unsigned i = 0; i < (1u << 14); i++) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}
__attribute__((noinline)) void run_batch(uint32_t seed) {
  parse_records(seed);
  transform_records();
  sink += checksum_block();
}

int main(int argc, char** argv) {
  double secs = argc > 1 ? atof(argv[1]) : 3.0;
  double end = now() + secs;
  for (uint32_t seed = 1; now() < end; seed++) run_batch(seed);
  return 0;
}
