// Context-switch-heavy workload for bench/os_layer.sh: two threads on one CPU hand a byte back and
// forth over two pipes, paced to TARGET context switches per second (2 per round trip), for
// SECONDS. Prints the round trips it made and the switch rate it reached.
// usage: os_pingpong SECONDS TARGET_SWITCHES_PER_SEC
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2];

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void* echo(void* arg) {
  (void)arg;
  char c;
  while (read(ping[0], &c, 1) == 1 && c != 'q') (void)!write(pong[1], &c, 1);
  return NULL;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 10;
  double target = argc > 2 ? atof(argv[2]) : 50000;
  if (pipe(ping) || pipe(pong)) return 1;
  pthread_t t;
  pthread_create(&t, NULL, echo, NULL);
  uint64_t start = now_ns(), end = start + (uint64_t)(seconds * 1e9), trips = 0;
  double ns_per_trip = 2e9 / target;
  char c = 'x';
  while (now_ns() < end) {
    for (int i = 0; i < 100; i++, trips++) {
      (void)!write(ping[1], &c, 1);
      (void)!read(pong[0], &c, 1);
    }
    uint64_t due = start + (uint64_t)(trips * ns_per_trip), now = now_ns();
    if (due > now) {
      struct timespec ts = {(time_t)((due - now) / 1000000000ull), (long)((due - now) % 1000000000ull)};
      nanosleep(&ts, NULL);
    }
  }
  c = 'q';
  (void)!write(ping[1], &c, 1);
  pthread_join(t, NULL);
  double secs = (now_ns() - start) / 1e9;
  printf("round_trips %llu\nswitches_per_s %.0f\n", (unsigned long long)trips, 2.0 * trips / secs);
  return 0;
}
