/* Traced program: a storm of device memory calls (cudaMalloc + cudaFree of 1 KiB, as fast as the
 * testbed's libcudart.so.13 stand-in allows, ~10k pairs a second) for SECONDS, then writes how many
 * calls it made to OUT. The agent must stop probing every call (their hits x cost pass the memory
 * budget) and sample them in its launch bursts instead.
 * Usage: memory_storm TESTBED_LIB_DIR SECONDS OUT */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int (*malloc_fn)(void**, size_t);
typedef int (*free_fn)(void*);

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: memory_storm TESTBED_LIB_DIR SECONDS OUT\n");
    return 1;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/libcudart.so.13", argv[1]);
  void* cudart = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!cudart) {
    fprintf(stderr, "memory_storm: dlopen: %s\n", dlerror());
    return 2;
  }
  malloc_fn cuda_malloc = (malloc_fn)dlsym(cudart, "cudaMalloc");
  free_fn cuda_free = (free_fn)dlsym(cudart, "cudaFree");
  if (!cuda_malloc || !cuda_free) {
    fprintf(stderr, "memory_storm: no cudaMalloc/cudaFree in %s\n", path);
    return 2;
  }
  usleep(500 * 1000); /* the agent attaches to the library loaded late (its dlopen probe) */
  long calls = 0;
  double end = now_s() + atof(argv[2]);
  while (now_s() < end) {
    void* p = NULL;
    if (cuda_malloc(&p, 1024) != 0 || cuda_free(p) != 0) {
      fprintf(stderr, "memory_storm: cudaMalloc/cudaFree failed\n");
      return 3;
    }
    calls += 2;
  }
  FILE* f = fopen(argv[3], "w");
  if (!f || fprintf(f, "%ld\n", calls) < 0 || fclose(f) != 0) {
    fprintf(stderr, "memory_storm: cannot write %s\n", argv[3]);
    return 2;
  }
  return 0;
}
