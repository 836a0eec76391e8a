/* Traced program: a known call chain main -> chain_a -> chain_b -> chain_c -> chain_d -> chain_leaf,
 * built with frame pointers (leaf frames too). Runs for argv[1] seconds (default 2). */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void chain_leaf(void) {
  for (int i = 0; i < 20000; i++) sink += (unsigned long)i * i;
}
__attribute__((noinline)) void chain_d(void) { chain_leaf(); sink++; }
__attribute__((noinline)) void chain_c(void) { chain_d(); sink++; }
__attribute__((noinline)) void chain_b(void) { chain_c(); sink++; }
__attribute__((noinline)) void chain_a(void) { chain_b(); sink++; }

int main(int argc, char** argv) {
  double secs = argc > 1 ? atof(argv[1]) : 2.0;
  double end = now() + secs;
  while (now() < end) chain_a();
  return 0;
}
