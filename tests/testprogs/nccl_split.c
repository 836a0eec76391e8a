/* Traced program for communicator membership, on the testbed's NCCL stand-in (dlopen'd): four
 * ranks (forked) make a world communicator, split it by parity (ncclCommSplit, key = rank) and
 * all-reduce on their half; rank 0 then makes a 2-device communicator of its own with
 * ncclCommInitAll. The agent records every communicator with its id and position. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void* ncclComm_t;
typedef int (*get_id_fn)(ncclUniqueId*);
typedef int (*init_fn)(ncclComm_t*, int, ncclUniqueId, int);
typedef int (*split_fn)(ncclComm_t, int, int, ncclComm_t*, void*);
typedef int (*init_all_fn)(ncclComm_t*, int, const int*);
typedef int (*allreduce_fn)(const void*, void*, size_t, int, int, ncclComm_t, void*);
typedef int (*destroy_fn)(ncclComm_t);
typedef int (*sync_fn)(void*);
typedef int (*set_device_fn)(int);

#define NCCL_FLOAT 7
#define NCCL_SUM 0
#define RANKS 4

static void* must(void* lib, const char* sym) {
  void* p = dlsym(lib, sym);
  if (!p) {
    fprintf(stderr, "nccl_split: %s: %s\n", sym, dlerror());
    exit(2);
  }
  return p;
}

static void *cudart, *nccl;

static int run_rank(int rank, ncclUniqueId id) {
  ((set_device_fn)must(cudart, "cudaSetDevice"))(rank);
  sync_fn sync = (sync_fn)must(cudart, "cudaDeviceSynchronize");
  allreduce_fn allreduce = (allreduce_fn)must(nccl, "ncclAllReduce");
  destroy_fn destroy = (destroy_fn)must(nccl, "ncclCommDestroy");
  ncclComm_t world, half;
  if (((init_fn)must(nccl, "ncclCommInitRank"))(&world, RANKS, id, rank) != 0) return 3;
  if (((split_fn)must(nccl, "ncclCommSplit"))(world, rank % 2, rank, &half, NULL) != 0) return 4;
  static float buf[256];
  for (int i = 0; i < 3; ++i) {
    allreduce(buf, buf, 256, NCCL_FLOAT, NCCL_SUM, half, NULL);
    sync(NULL);
  }
  destroy(half);
  destroy(world);
  if (rank == 0) {
    ncclComm_t two[2];
    int devs[2] = {0, 1};
    if (((init_all_fn)must(nccl, "ncclCommInitAll"))(two, 2, devs) != 0) return 5;
    destroy(two[0]);
    destroy(two[1]);
  }
  return 0;
}

int main(int argc, char** argv) {
  const char* libdir = argc > 1 ? argv[1] : getenv("STRATA_TESTBED_LIB");
  if (!libdir) {
    fprintf(stderr, "usage: nccl_split TESTBED_LIB_DIR\n");
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/libcudart.so.13", libdir);
  cudart = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  snprintf(path, sizeof path, "%s/libnccl.so.2", libdir);
  nccl = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!cudart || !nccl) {
    fprintf(stderr, "nccl_split: dlopen: %s\n", dlerror());
    return 2;
  }
  usleep(500 * 1000); /* the agent finds dlopen'd libraries by rescanning */
  ncclUniqueId id;
  if (((get_id_fn)must(nccl, "ncclGetUniqueId"))(&id) != 0) return 2;
  pid_t kids[RANKS - 1];
  for (int r = 1; r < RANKS; ++r) {
    kids[r - 1] = fork();
    if (kids[r - 1] == 0) _exit(run_rank(r, id));
  }
  int worst = run_rank(0, id);
  for (int r = 1; r < RANKS; ++r) {
    int st;
    waitpid(kids[r - 1], &st, 0);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (code > worst) worst = code;
  }
  printf("nccl_split: exit %d\n", worst);
  return worst;
}
