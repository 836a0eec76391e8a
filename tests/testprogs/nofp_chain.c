/* Traced program: a chain of 24 distinct functions built with -O2 -fomit-frame-pointer, half of
 * them in libstrata_nofp.so (also without frame pointers), entered from glibc's qsort callback:
 * main -> qsort -> compare -> exe_01..exe_06 -> lib_01..lib_12 (libstrata_nofp.so) -> exe_07..exe_12
 * -> nofp_leaf. Frame pointers cannot walk it; CFI can. Runs for argv[1] seconds (default 2). */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;
void lib_01(int depth);

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Each link keeps a little stack and work after the call, so the compiler neither inlines nor
 * turns the call into a jump. */
#define LINK(name, next)                              \
  __attribute__((noinline)) void name(int depth) {   \
    volatile char pad[16 + (depth & 7)];              \
    pad[depth & 7] = (char)depth;                     \
    next(depth + 1);                                  \
    sink += pad[depth & 7];                           \
  }

__attribute__((noinline)) void nofp_leaf(int depth) {
  for (int i = 0; i < 20000; i++) sink += (unsigned long)i * depth;
}
LINK(exe_12, nofp_leaf)
LINK(exe_11, exe_12)
LINK(exe_10, exe_11)
LINK(exe_09, exe_10)
LINK(exe_08, exe_09)
LINK(exe_07, exe_08) /* called back from lib_12 */
LINK(exe_06, lib_01)
LINK(exe_05, exe_06)
LINK(exe_04, exe_05)
LINK(exe_03, exe_04)
LINK(exe_02, exe_03)
LINK(exe_01, exe_02)

static int compare(const void* a, const void* b) {
  exe_01(0);
  return *(const int*)a - *(const int*)b;
}

int main(int argc, char** argv) {
  double secs = argc > 1 ? atof(argv[1]) : 2.0;
  double end = now() + secs;
  int values[2] = {2, 1};
  while (now() < end) qsort(values, 2, sizeof(int), compare);
  return 0;
}
