// A thread that waits on a condition variable at the end of a chain of functions built without frame
// pointers (this file is compiled with -fomit-frame-pointer), for the off-CPU unwinding test. glibc's
// futex wait keeps no frame pointer either, so a frame-pointer walk from the blocked thread ends in
// glibc; only CFI unwinding of a stack copy finds cond_chain_3 -> 2 -> 1 -> waiter_main -> main.
// Prints the wall time spent waiting (microseconds): `cond_wait_us N`.
// usage: offcpu_nofp [SECONDS]
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_ticket;
static atomic_int g_stop;
static uint64_t g_wait_ns;
volatile int g_sink;  // keeps the chain from being folded into tail calls

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) void cond_chain_3(void) {
  pthread_mutex_lock(&g_mu);
  int seen = g_ticket;
  uint64_t t0 = now_ns();
  while (g_ticket == seen && !atomic_load(&g_stop)) pthread_cond_wait(&g_cv, &g_mu);
  g_wait_ns += now_ns() - t0;
  pthread_mutex_unlock(&g_mu);
  g_sink++;
}

__attribute__((noinline)) void cond_chain_2(void) {
  cond_chain_3();
  g_sink++;
}

__attribute__((noinline)) void cond_chain_1(void) {
  cond_chain_2();
  g_sink++;
}

__attribute__((noinline)) void waiter_main(void) {
  while (!atomic_load(&g_stop)) cond_chain_1();
  g_sink++;
}

static void* waiter(void* arg) {
  (void)arg;
  waiter_main();
  return NULL;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 2;
  pthread_t t;
  pthread_create(&t, NULL, waiter, NULL);
  uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
  while (now_ns() < end) {
    struct timespec ts = {0, 20 * 1000 * 1000};  // wake the waiter every 20 ms
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&g_mu);
    g_ticket++;
    pthread_cond_signal(&g_cv);
    pthread_mutex_unlock(&g_mu);
  }
  pthread_mutex_lock(&g_mu);
  atomic_store(&g_stop, 1);
  pthread_cond_signal(&g_cv);
  pthread_mutex_unlock(&g_mu);
  pthread_join(t, NULL);
  printf("cond_wait_us %llu\n", (unsigned long long)(g_wait_ns / 1000));
  return 0;
}
