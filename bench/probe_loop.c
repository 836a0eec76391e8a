/* bench/probe_loop.c: calls cudaSetDevice(0) of a CUDA runtime (the testbed's stand-in, dlopen'ed
 * from argv[1]) N times and prints the ns per call. Run plain and under `strata record --layers gpu`
 * (which keeps an entry and a return uprobe on cudaSetDevice): the difference is the cost of one
 * probed call. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: probe_loop LIBCUDART N [startup_ms]\n");
    return 2;
  }
  long n = atol(argv[2]);
  if (argc > 3) usleep(atoi(argv[3]) * 1000); /* let an agent attach */
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "probe_loop: %s\n", dlerror());
    return 2;
  }
  int (*set_device)(int) = (int (*)(int))dlsym(lib, "cudaSetDevice");
  if (!set_device) return 2;
  usleep(500 * 1000); /* the agent sees the dlopen and attaches */
  double t0 = now();
  for (long i = 0; i < n; i++) set_device(0);
  double t = now() - t0;
  printf("%.1f\n", t * 1e9 / n);
  return 0;
}
