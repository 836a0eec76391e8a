// Loads N distinct modules (libstrata_mod0.so .. libstrata_modN-1.so from DIR, see
// unwind_module.c) and spins in each in turn, 3-8 ms at a time, for S seconds of CPU time (so a
// busy machine gives as many samples, later): more unwind tables than a small --unwind-tables-mb
// holds, each needed again and again. The spin varies from call to call: a fixed 5 ms is half of
// a 99 Hz sampler's period, and the samples then locked onto every other module for a whole run.
//   many_modules DIR N S
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef long (*run_fn)(long);

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: many_modules DIR N SECONDS\n");
    return 1;
  }
  int n = atoi(argv[2]);
  double seconds = atof(argv[3]);
  if (n < 1 || n > 64 || seconds <= 0) return 1;
  run_fn runs[64];
  for (int i = 0; i < n; i++) {
    char path[4096], sym[64];
    snprintf(path, sizeof path, "%s/libstrata_mod%d.so", argv[1], i);
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      fprintf(stderr, "many_modules: %s\n", dlerror());
      return 1;
    }
    snprintf(sym, sizeof sym, "mod%d_run", i);
    runs[i] = (run_fn)dlsym(h, sym);
    if (!runs[i]) {
      fprintf(stderr, "many_modules: no %s in %s\n", sym, path);
      return 1;
    }
  }
  long sum = 0;
  unsigned rng = 12345;  // a fixed seed: the same sequence of spins in every run
  double end = cpu_s() + seconds;
  while (cpu_s() < end)
    for (int i = 0; i < n; i++) {
      rng = rng * 1103515245u + 12345u;
      sum += runs[i](3000000 + (long)((rng >> 8) % 5000000));
    }
  printf("%ld\n", sum & 1);
  return 0;
}
