/* A fixed CPU-bound pipeline (parse -> transform -> checksum) whose hot spots are known:
 * checksum_block, then parse_records, then transform_records. Single-threaded, built with frame
 * pointers. The traced job of the record tests and of bench/record_overhead.sh.
 *
 *   cpu_workload [SECONDS]              run for SECONDS (default 3), print nothing (the tests)
 *   cpu_workload -n BATCHES [options]   fixed work: run BATCHES batches (for wall-clock A/B)
 *   cpu_workload -t SECONDS [options]   fixed time: run batches until SECONDS have passed (for accounting)
 *   cpu_workload -c SECONDS             calibrate: print how many batches ran in SECONDS
 *
 * options:
 *   -o FILE   append one line "wall_s=W cpu_s=C batches=N" to FILE when the work is done
 *   -g FIFO   control FIFO: wait for a line on it before starting the work, and for another one
 *             after writing the result line before exiting (so an attached profiler can be read
 *             while the job is still alive)
 *
 * Only the work itself is timed: the wall and CPU times exclude start-up and the waits. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static uint32_t data[1 << 14];
volatile uint64_t sink;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
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

static void wait_line(FILE* ctl) {
  char buf[64];
  if (ctl && !fgets(buf, sizeof buf, ctl)) {
    /* writer gone: go on */
  }
}

static int usage(void) {
  fprintf(stderr, "usage: cpu_workload [SECONDS] | (-n BATCHES | -t SECONDS | -c SECONDS) [-o FILE] [-g FIFO]\n");
  return 1;
}

int main(int argc, char** argv) {
  if (argc <= 2 && (argc == 1 || argv[1][0] != '-')) {
    double end = now() + (argc > 1 ? atof(argv[1]) : 3.0);
    for (uint32_t seed = 1; now() < end; seed++) run_batch(seed);
    return 0;
  }
  long batches = -1;
  double secs = -1;
  int calibrate = 0;
  const char* out = NULL;
  const char* fifo = NULL;
  int opt;
  while ((opt = getopt(argc, argv, "n:t:c:o:g:")) != -1) {
    switch (opt) {
      case 'n':
        batches = atol(optarg);
        break;
      case 't':
        secs = atof(optarg);
        break;
      case 'c':
        secs = atof(optarg);
        calibrate = 1;
        break;
      case 'o':
        out = optarg;
        break;
      case 'g':
        fifo = optarg;
        break;
      default:
        return usage();
    }
  }
  if ((batches < 0) == (secs < 0)) return usage();

  FILE* ctl = NULL;
  if (fifo && !(ctl = fopen(fifo, "r"))) {
    perror(fifo);
    return 1;
  }
  wait_line(ctl);

  double t0 = now(), c0 = cpu_now();
  long done = 0;
  if (batches >= 0) {
    for (; done < batches; done++) run_batch((uint32_t)done + 1);
  } else {
    double end = t0 + secs;
    /* check the clock every 16 batches (a batch is ~0.1 ms) */
    while (now() < end)
      for (int i = 0; i < 16; i++, done++) run_batch((uint32_t)done + 1);
  }
  double wall = now() - t0, cpu = cpu_now() - c0;

  if (calibrate) {
    printf("%ld\n", done);
  } else if (out) {
    FILE* f = fopen(out, "a");
    if (!f) {
      perror(out);
      return 1;
    }
    fprintf(f, "wall_s=%.6f cpu_s=%.6f batches=%ld\n", wall, cpu, done);
    fclose(f);
  } else {
    printf("wall_s=%.6f cpu_s=%.6f batches=%ld\n", wall, cpu, done);
  }
  wait_line(ctl);
  return 0;
}
