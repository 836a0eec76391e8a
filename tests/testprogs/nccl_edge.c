/* Traced program for unpredictable targets, on the testbed's NCCL stand-in loaded LATE with dlopen:
 * two ranks (forked), each with two communicators; 0-byte and normal all-reduces on both; then rank
 * 1 exits in the middle of the run while rank 0 enters one more all-reduce, which fails. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void* ncclComm_t;
typedef int (*get_id_fn)(ncclUniqueId*);
typedef int (*init_fn)(ncclComm_t*, int, ncclUniqueId, int);
typedef int (*allreduce_fn)(const void*, void*, size_t, int, int, ncclComm_t, void*);
typedef int (*sync_fn)(void*);
typedef int (*set_device_fn)(int);

#define NCCL_FLOAT 7
#define NCCL_SUM 0
#define ITERS 5

static void* must(void* lib, const char* sym) {
  void* p = dlsym(lib, sym);
  if (!p) {
    fprintf(stderr, "nccl_edge: %s: %s\n", sym, dlerror());
    exit(2);
  }
  return p;
}

static int run_rank(int rank, int fds[2][2], const char* libdir) {
  usleep(400 * 1000); /* the library arrives late: well after exec */
  char path[4096];
  snprintf(path, sizeof path, "%s/libcudart.so.13", libdir);
  void* cudart = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  snprintf(path, sizeof path, "%s/libnccl.so.2", libdir);
  void* nccl = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!cudart || !nccl) {
    fprintf(stderr, "nccl_edge: dlopen: %s\n", dlerror());
    return 2;
  }
  usleep(300 * 1000); /* the agent finds dlopen'd libraries by rescanning */
  ((set_device_fn)must(cudart, "cudaSetDevice"))(rank);
  sync_fn sync = (sync_fn)must(cudart, "cudaDeviceSynchronize");
  init_fn init = (init_fn)must(nccl, "ncclCommInitRank");
  allreduce_fn allreduce = (allreduce_fn)must(nccl, "ncclAllReduce");
  ncclUniqueId ids[2];
  for (int c = 0; c < 2; ++c) {
    if (rank == 0) {
      ((get_id_fn)must(nccl, "ncclGetUniqueId"))(&ids[c]);
      if (write(fds[c][1], &ids[c], sizeof ids[c]) != sizeof ids[c]) return 2;
    } else if (read(fds[c][0], &ids[c], sizeof ids[c]) != sizeof ids[c]) {
      return 2;
    }
  }
  ncclComm_t comms[2];
  for (int c = 0; c < 2; ++c) {
    if (init(&comms[c], 2, ids[c], rank) != 0) return 3;
  }
  static float buf[1024];
  for (int i = 0; i < ITERS; ++i) {
    allreduce(buf, buf, 0, NCCL_FLOAT, NCCL_SUM, comms[0], NULL);    /* 0 bytes */
    allreduce(buf, buf, 1024, NCCL_FLOAT, NCCL_SUM, comms[1], NULL); /* 4 KiB on the second comm */
    sync(NULL);
  }
  if (rank == 1) _exit(0); /* leaves rank 0 alone inside the next collective */
  allreduce(buf, buf, 1024, NCCL_FLOAT, NCCL_SUM, comms[1], NULL);
  sync(NULL);
  printf("nccl_edge: rank 0 done\n");
  return 0;
}

int main(int argc, char** argv) {
  const char* libdir = argc > 1 ? argv[1] : getenv("STRATA_TESTBED_LIB");
  if (!libdir) {
    fprintf(stderr, "usage: nccl_edge TESTBED_LIB_DIR\n");
    return 2;
  }
  int fds[2][2];
  if (pipe(fds[0]) || pipe(fds[1])) return 2;
  pid_t kids[2];
  for (int r = 0; r < 2; ++r) {
    kids[r] = fork();
    if (kids[r] == 0) _exit(run_rank(r, fds, libdir));
  }
  int worst = 0;
  for (int r = 0; r < 2; ++r) {
    int st;
    waitpid(kids[r], &st, 0);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    printf("nccl_edge: rank %d exited %d\n", r, code);
    if (code > worst) worst = code;
  }
  return worst > 1 ? worst : 0; /* rank 0 may fail its last collective: that is the point */
}
