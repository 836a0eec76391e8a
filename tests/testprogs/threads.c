/* Traced program: three threads doing 1, 2 and 3 units of CPU work (in work_1/work_2/work_3),
 * named worker-1..3, so their samples should split 1:2:3. argv[1] scales the unit (default 1). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

volatile unsigned long sink;
static unsigned long unit = 150000000UL;

static void spin(unsigned long n) {
  unsigned long x = 0;
  for (unsigned long i = 0; i < n; i++) x += i ^ (x >> 3);
  sink += x;
}
__attribute__((noinline)) void work_1(void) { spin(unit); }
__attribute__((noinline)) void work_2(void) { spin(2 * unit); }
__attribute__((noinline)) void work_3(void) { spin(3 * unit); }

static void* run(void* arg) {
  long k = (long)arg;
  char name[16];
  snprintf(name, sizeof name, "worker-%ld", k);
  pthread_setname_np(pthread_self(), name);
  if (k == 1) work_1();
  if (k == 2) work_2();
  if (k == 3) work_3();
  return NULL;
}

int main(int argc, char** argv) {
  if (argc > 1) unit = (unsigned long)(atof(argv[1]) * unit);
  pthread_t t[3];
  for (long k = 1; k <= 3; k++) pthread_create(&t[k - 1], NULL, run, (void*)k);
  for (int k = 0; k < 3; k++) pthread_join(t[k], NULL);
  return 0;
}
